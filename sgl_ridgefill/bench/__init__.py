"""TTFT benchmark of exact against RidgeFill prefill on a running server (``sgl-ridgefill bench``).

``bounds``: the layer-pass and FLOP-counted speed bounds (engine-free); ``client``: the HTTP client;
``runner``: the alternating measurement; ``report``: table, JSON and plot; ``cli``: the command;
``procstat``: CPU seconds of a local server's processes; ``phases``: a py-spy profile of the scheduler by
RidgeFill phase; ``synthetic``: random-weight model and maps folders to benchmark without a model hub.
"""
