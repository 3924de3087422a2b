"""The machine and the models the GPU estimates assume (an H200; Llama-3.1-8B and Qwen3-8B at their
shipped splits): rates, SGLang's chunk budget and the host-to-device copy rate, shared by ``estimates.py``
and ``map_stream.py``. Every rate is an estimate until ``gpu-check`` measures it."""

from __future__ import annotations

from ..tools.flops import ModelDims

GEMM_TFLOPS = 790.0
# Attention forward at head_dim 128, 8K-16K keys, measured on an H100 SXM5 (FlashAttention-3 paper, Fig. 5,
# which the H200 matches in SMs and clocks): FlashAttention-3 610-648, FlashAttention-2 370, the Triton
# tutorial kernel 395 TFLOP/s. FlashInfer's prefill is an FA2-class kernel on Hopper; SGLang's Triton extend
# kernel is taken below the tutorial kernel (two stages, an index load per key tile, no TMA): an estimate.
ATTENTION_TFLOPS = {"fa3": 600.0, "flashinfer": 370.0, "triton": 300.0}
LAUNCH_US = 4.0  # CUDA launch cost per device op on the host (estimate)
CHUNK_ROWS = 8192  # SGLang's chunked-prefill budget on an H200 (its resolved default)
SHAPES: dict[str, tuple[ModelDims, int]] = {
    "llama-3.1-8b": (ModelDims(32, 4096, 32, 8, 128, 14336, 128256), 12),
    "qwen3-8b": (ModelDims(36, 4096, 32, 8, 128, 12288, 151936), 13),
}
LENGTHS = (16384, 32768)
H2D_GBPS = 50.0
