"""The kit the offline commands share (calibrate, bench, eval, soak, gpu-check, the demo), owned by none of them.

``args``: the argument types and the parser every ``python -m`` command starts from; ``client``: the HTTP
client of a running server; ``flops``: the FLOP model and the layer-pass bounds (engine-free); ``machine``:
the record of the machine a figure was measured on; ``sizing``: how much work fits this CPU's time budget;
``synthetic``: random-weight model and maps folders (real shapes, or the tiny test checkpoints).
"""
