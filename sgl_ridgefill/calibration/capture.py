"""Run an unmodified Hugging Face model and capture each layer's input as the runtime sees it.

``x_l``, the input of layer ``l``, is the residual stream before layer ``l``'s input norm: exactly the
``hidden_states`` argument an HF decoder layer receives (SGLang's fused add-norm carries it as
``hidden_states + residual``; the runtime cross-check compares the two). Forward pre-hooks on the
decoder layers read it; the pass stops at the last requested layer, since nothing above it is needed.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Mapping, Sequence

import torch

from ..arch import ALL_ARCHITECTURES
from .config import CalibrationError

SUPPORTED_ARCHITECTURES = ALL_ARCHITECTURES  # every family of arch.py calibrates


class _StopForward(Exception):
    """Raised by the last capture hook: the layers above it are not needed."""


def read_config(model_dir: pathlib.Path) -> dict[str, Any]:
    """The model's ``config.json``, checked for a supported architecture."""
    path = pathlib.Path(model_dir) / "config.json"
    if not path.is_file():
        raise CalibrationError(f"--model {model_dir}: no config.json (expected a Hugging Face model folder)")
    config = json.loads(path.read_text())
    architectures = config.get("architectures") or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in architectures):
        raise CalibrationError(
            f"--model {model_dir}: architecture {', '.join(architectures) or '(none)'} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return config


def load_model(model_dir: pathlib.Path, dtype: str = "bfloat16", device_map: Any = None) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """``(model, tokenizer, config dict)`` from a local HF folder, in eval mode, never touching the hub;
    ``device_map``: where its weights go (``device.Placement.device_map``; default the CPU). On a CPU
    without bfloat16 instructions a bfloat16 model's projections run through float32 (``cpu/matmul.py``)."""
    config = read_config(model_dir)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=getattr(torch, dtype), local_files_only=True, attn_implementation="sdpa",
        **({} if device_map in (None, "cpu") else {"device_map": device_map}),
    )
    model.eval()
    if device_map in (None, "cpu"):
        from ..cpu.matmul import upcast_linears

        upcast_linears(model)  # bfloat16 on a CPU without bfloat16 instructions: projections through float32
    return model, tokenizer, config


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layer list of a Llama/Qwen2/Qwen3 ``*ForCausalLM`` (or its bare ``*Model``)."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise CalibrationError(f"{type(model).__name__} has no decoder layers at .model.layers")
    return layers


def final_norm(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "model", model).norm


def capture_layer_inputs(
    model: torch.nn.Module, input_ids: torch.Tensor, layers: Sequence[int]
) -> dict[int, torch.Tensor]:
    """Inputs of ``layers`` for one sequence.

    ``model``: an HF Llama/Qwen2/Qwen3 model; ``input_ids``: ``[n]`` token ids (positions ``0..n-1``);
    returns ``{l: x_l [n, d]}`` in the model's dtype, ``x_l`` being the residual stream before layer
    ``l``'s input norm (``l = 0`` is the embedding output).
    """
    stack = decoder_layers(model)
    wanted = sorted(set(int(l) for l in layers))
    if not wanted:
        return {}
    if wanted[0] < 0 or wanted[-1] >= len(stack):
        raise ValueError(f"layers {wanted} must lie in 0..{len(stack) - 1}")
    if input_ids.dim() != 1:
        raise ValueError(f"input_ids must be [n], got shape {tuple(input_ids.shape)}")
    captured: dict[int, torch.Tensor] = {}
    last = wanted[-1]

    def hook(layer: int):
        def pre_hook(module: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any]):
            hidden = args[0] if args else kwargs["hidden_states"]
            captured[layer] = hidden[0].detach()
            if layer == last:
                raise _StopForward
        return pre_hook

    handles = [stack[l].register_forward_pre_hook(hook(l), with_kwargs=True) for l in wanted]
    base = getattr(model, "model", model)
    try:
        with torch.no_grad():
            base(input_ids=input_ids.reshape(1, -1).to(next(model.parameters()).device), use_cache=False)
    except _StopForward:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return {l: captured[l] for l in layers}
