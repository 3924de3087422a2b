"""GPU check in two tiers: ``python -m sgl_ridgefill.gpu_check`` (or ``sgl-ridgefill gpu-check``).

Tier ``kernels`` needs only torch, triton and this checkout, so it runs on a GPU machine without SGLang
(bf16 on CUDA; it skips itself without CUDA unless ``--device cpu`` asks for the tiny float32 smoke run
under the Triton interpreter). Steps, each time-boxed, each row checked against a float32 reference where
there is one:

- ``maps``: the Triton map kernel against ``torch.addmm`` (cuBLAS) at 4K-32K rows for d = 896, 3584,
  4096: ms, TFLOP/s, fraction of the bf16 dense peak, max error; and the backend the runtime's startup
  measurement picks for each d;
- ``row_attention``: row queries through SGLang's own Triton extend kernel (loaded from three copied files
  with stand-ins for its SGLang imports, never importing SGLang), against one causal extend of all N rows:
  tail, tail + every 10th prefix row as runs, the same rows as the runtime runs them (groups of G = 64, 128
  under a device-built mask, the tail in a launch of its own), 64-row windows, at N = 8K and 32K;
- ``planner``: the host side of an upper pass on one thread, per backend (``attention.steps`` and
  ``attention.metadata``: the groups' Triton arguments, the runs' Triton, FlashInfer or fa3 arguments) for
  the tail + 10 % scattered rows at 32K, slots on the GPU;
- ``host_path``: the host side of one request's selection and upper passes at the Llama-3.1-8B shape, 16K
  tokens, T = 4,096, per backend and selection, on one thread, with ``torch.cuda.set_sync_debug_mode``
  counting the real host syncs (``estimates.host_side``);
- ``fill``: map + the runtime's norm / K/V projection / RoPE path per row, beside one exact layer's linear
  layers on the same rows;
- ``maps_int8``, ``attention_stats``: the int8 map kernel and the attention statistics likewise.

The one prepared command for the GPU machine (sized for under 8 minutes on an H200: ``--budget-s``, default
420, stops starting new cases; ``.gpucheck/`` is git-ignored, so a copy of the checkout must carry it
explicitly)::

    # once, where SGLang 0.5.23 is installed:
    python -m sgl_ridgefill.gpu_check --copy-sgl-files .gpucheck/sgl_files
    # on the GPU machine, in the repository root:
    set -o pipefail; nvidia-smi -L; PYTHONUNBUFFERED=1 timeout 470 python3 -m sgl_ridgefill.gpu_check \\
        --tier kernels --sgl-files .gpucheck/sgl_files --out $OUT 2>&1 | tee $OUT/log

It writes ``$OUT/gpu-check.json`` (rewritten after every step) and ``$OUT/gpu-check.txt`` (the tables).

Tier ``server`` needs a GPU machine with SGLang and FlashInfer installed: per ``--backends`` (default
``triton,flashinfer,fa3``) a stock server and a RidgeFill server on a random-weight Llama-3.1-8B-shaped
model (``--shape``) with near-identity maps: byte identity of RidgeFill-off answers with stock, then TTFT
of stock, exact and RidgeFill at 8K, 16K, 32K with the layer-pass and FLOP-counted bounds::

    python -m sgl_ridgefill.gpu_check --tier server --out runs/gpu-check-server
"""
