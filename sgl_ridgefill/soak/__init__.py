"""``sgl-ridgefill soak``: concurrent clients and a fuzzer against a RidgeFill server, exact answers checked
against a stock server (docs/RELIABILITY.md).

``workload``: the seeded jobs; ``client``: the client threads; ``compare``: exact answers against stock;
``summary``: the verdict per call and the failure counts; ``fuzz``: request parameters and policies drawn by
Hypothesis; ``servers``: the two servers and what is read from them; ``run``: the phases; ``cli``: the command.
"""
