"""TTFT benchmark of exact against RidgeFill prefill on a running server (``sgl-ridgefill bench``).

``runner``: the alternating measurement; ``report``: table, JSON and plot; ``cli``: the command;
``serving``: ``sgl-ridgefill bench-serving`` (SGLang's serving benchmark, stock against RidgeFill);
``results``: ``docs/BENCHMARKS.md``; ``procstat``: CPU seconds of a local server's processes; ``phases``: a
py-spy profile of the scheduler by RidgeFill phase; ``tail_attention``: the CPU tail-attention kernel
against a masked one. The client, the FLOP model and the synthetic models are the tools kit's
(``sgl_ridgefill.tools``).
"""
