"""Compile the Triton kernels for a Hopper GPU (sm_90) without one: ``python -m tests.kernels.sm90_compile``.

The interpreter runs every kernel in float32, so it never sees the GPU path's bf16/fp16 tensor-core
dots or the int8-to-bf16 conversion. Triton's compiler and the ``ptxas`` it ships need no GPU, so this
lowers each kernel variant the launchers use on CUDA to a cubin and prints one JSON line: per variant
whether it compiled, its shared memory, and whether the PTX uses tensor-core instructions.
"""

from __future__ import annotations

import json

# (kernel module, kernel name, pointer/float argument types, constexprs, num_warps, num_stages, expect mma)
_MAP_TILES = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8)
_ATTENTION_TILES = dict(BLOCK_Q=64, BLOCK_K=64, BLOCK_D=128)


def _variants() -> dict[str, tuple]:
    variants = {}
    for dt in ("bf16", "fp16"):
        floats = {"x_ptr": f"*{dt}", "a_ptr": f"*{dt}", "b_ptr": f"*{dt}", "out_ptr": f"*{dt}"}
        constexprs = dict(_MAP_TILES, DOT_FP32=False)
        variants[f"map_{dt}"] = ("map_apply_triton", "_map_kernel", floats, constexprs, 8, 3, True)
        int8 = {"x_ptr": f"*{dt}", "q_ptr": "*i8", "scale_ptr": "*fp32", "b_ptr": f"*{dt}", "out_ptr": f"*{dt}"}
        for group in (128, 40):  # one K tile per group (scale after the dot), and per-element scales
            constexprs = dict(_MAP_TILES, GROUP_SIZE=group, DOT_FP32=False)
            kernel = ("map_apply_triton", "_map_int8_kernel", int8, constexprs, 8, 3, True)
            variants[f"map_int8_group{group}_{dt}"] = kernel
        attention = {
            "q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "qpos_ptr": "*i64", "kpos_ptr": "*i64",
            "lse_ptr": "*fp32", "partial_ptr": "*fp32", "qk_scale": "fp32",
        }
        for name in ("_lse_kernel", "_received_kernel"):
            constexprs = dict(_ATTENTION_TILES, DOT_FP32=False)
            variants[f"attention{name}_{dt}"] = ("attention_stats_triton", name, attention, constexprs, 4, 2, True)
    fp32 = {"x_ptr": "*fp32", "a_ptr": "*fp32", "b_ptr": "*fp32", "out_ptr": "*fp32"}
    variants["map_fp32_ieee"] = ("map_apply_triton", "_map_kernel", fp32, dict(_MAP_TILES, DOT_FP32=True), 8, 3, False)
    return variants


def main() -> None:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    results = {}
    for label, (module, name, types, constexprs, warps, stages, expect_mma) in _variants().items():
        fn = getattr(importlib.import_module(f"sgl_ridgefill.kernels.{module}"), name)
        params = fn.arg_names
        # Every other argument is an integer (sizes and strides); Triton specialises them as i32.
        signature = {p: "constexpr" if p in constexprs else types.get(p, "i32") for p in params}
        source = ASTSource(fn, signature, constexprs={(params.index(k),): v for k, v in constexprs.items()})
        try:
            compiled = triton.compile(source, target=target, options={"num_warps": warps, "num_stages": stages})
        except Exception as error:  # report every variant, not only the first failure
            results[label] = {"compiled": False, "error": f"{type(error).__name__}: {str(error)[:2000]}"}
            continue
        ptx = compiled.asm["ptx"]
        results[label] = {
            "compiled": True,
            "shared_bytes": compiled.metadata.shared,
            "tensor_cores": ("mma" in ptx) == expect_mma,
        }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
