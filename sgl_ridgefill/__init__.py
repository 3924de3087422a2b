"""sgl-ridgefill: training-free late-layer cache fill for faster prefill, as an SGLang plugin."""

__version__ = "0.1.0"
