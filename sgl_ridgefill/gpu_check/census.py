"""The host census: what the host side of RidgeFill forwards would cost a GPU, counted on any machine.

On CUDA the host *synchronises* with the device whenever it reads a device value (``.item()``, ``.tolist()``,
``.cpu()``, ``int(t)``, a 0-dim tensor used as an index), runs an op whose output size depends on device
data (``nonzero``, boolean-mask indexing, ``unique``, ``repeat_interleave`` without ``output_size``), or
copies host memory to the device without ``non_blocking`` (``torch.tensor(..., device=)``, a plain
``.to(device)``). Each one drains the GPU's queue, and inside SGLang's scheduler thread it also cancels the
overlap of the next batch's scheduling with this one's kernels.

A CPU engine never synchronises, and its host and device tensors look alike. :class:`Census` therefore
tracks which tensors *would* live on the device: the ones it is told about (the batch, the KV pool, the
model's weights, the maps), the ones a device factory creates (an explicit ``device=``), the staging's
copies (``sgl_ridgefill.attention.staging``) and everything computed from them. It is a
``TorchFunctionMode``: every torch call passes through it, and a call that reads a device value on the host
is counted with the first frame outside torch as its site. Kernel launches (frames in ``triton``) are not
syncs. What the planner, the staging and the backends report through ``sgl_ridgefill.ledger`` (plans,
metadata initialisations, bytes copied, masks) is counted beside.

Known blind spots, covered on a GPU by ``torch.cuda.set_sync_debug_mode`` (``gpu-check --tier kernels``):
a device tensor the census was not told about reads as a host tensor, and ``.to(device)`` of a device
tensor is taken for a device-to-device copy (RidgeFill reads device values on the host with ``.cpu()``).
Engine-free: torch and the standard library.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
from collections.abc import Iterable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .. import ledger

_TAG = "_ridgefill_on_device"
# Calls that read a device value on the host (when their tensor is on the device).
_READS = frozenset({
    "item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "cpu", "equal", "allclose",
    "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "nonzero_static",
})
_FACTORIES = frozenset({
    "zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint", "randperm", "linspace", "eye",
    "empty_strided", "tensor", "as_tensor", "scalar_tensor", "range", "logspace",
})
_HOST_RESULTS = frozenset({"cpu", "tolist", "numpy", "item"})


@dataclasses.dataclass(frozen=True)
class Sync:
    """One host synchronisation: what caused it and where (``file:line (function)``)."""

    kind: str
    site: str


@dataclasses.dataclass
class CensusRecord:
    """Everything one census counted."""

    counts: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(ledger.COUNTERS, 0))
    syncs: list[Sync] = dataclasses.field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        sites = collections.Counter(f"{s.site}: {s.kind}" for s in self.syncs)
        return {**self.counts, "syncs": len(self.syncs), "sync_sites": dict(sites.most_common())}

    def add(self, other: CensusRecord) -> None:
        for key, value in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + value
        self.syncs.extend(other.syncs)


def on_device(tensors: Iterable[Any]) -> None:
    """Mark ``tensors`` (and tensors inside lists, tuples and dicts of them) as device tensors."""
    for t in _tensors(tensors):
        setattr(t, _TAG, True)


def is_on_device(t: torch.Tensor) -> bool:
    return bool(getattr(t, _TAG, False))


def module_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer of ``module`` and the tensors its submodules hold as plain attributes
    (SGLang keeps rotary caches that way)."""
    found = [*module.parameters(), *module.buffers()]
    for sub in module.modules():
        found.extend(v for v in vars(sub).values() if isinstance(v, torch.Tensor))
    return found


def object_tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors an object (a ForwardBatch, a KV pool, an attention backend) holds as attributes, in lists
    and tuples of them included."""
    return list(_tensors(vars(obj).values() if hasattr(obj, "__dict__") else ()))


class Census(TorchFunctionMode):
    """Counts host syncs and ledger costs of the code run inside ``with Census() as c:`` (one thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.record = CensusRecord()
        self._ledger = None

    # -- the ledger's recorder (sgl_ridgefill.ledger.Recorder)
    def count(self, name: str, n: int = 1) -> None:
        self.record.counts[name] = self.record.counts.get(name, 0) + n

    def on_device(self, tensors: Iterable[torch.Tensor]) -> None:
        on_device(tensors)

    def __enter__(self):
        self._ledger = ledger.record(self)
        self._ledger.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._ledger.__exit__(*exc)

    # -- every torch call
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        kind = self._sync_kind(name, args, kwargs)
        out = func(*args, **kwargs)
        if kind is not None:
            self._note(kind)
        if _to_host(name, args, kwargs):
            # A copy to the host of a device tensor: on a CPU engine the tensor itself, so a new host copy.
            return out.clone() if any(out is t for t in _tensors(args)) else out
        if name not in _HOST_RESULTS and self._makes_device_tensor(name, args, kwargs):
            if any(out is t for t in _tensors(args)) and name != "copy_" and not name.endswith("_"):
                # ``.to(device)`` of a host tensor returns the tensor itself on a CPU engine: the device copy
                # must be a tensor of its own, or the host tensor would count as a device one from now on.
                out = out.clone()
            on_device([out])
        return out

    def _sync_kind(self, name: str, args: tuple, kwargs: dict) -> str | None:
        this = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name in _READS:
            if any(is_on_device(t) for t in _tensors(args)):
                return f"{name}()" if name != "cpu" else "cpu() of a device tensor"
            return None
        if name in ("__getitem__", "__setitem__") and this is not None:
            for index in _tensors(args[1:2]):
                if not is_on_device(index):
                    continue
                if index.dtype == torch.bool:
                    return f"boolean-mask {'indexing' if name == '__getitem__' else 'assignment'}"
                if index.dim() == 0:
                    return "a 0-dim device tensor as an index"
            return None
        if name == "repeat_interleave" and "output_size" not in kwargs:
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            if isinstance(repeats, torch.Tensor) and is_on_device(repeats):
                return "repeat_interleave without output_size"
            return None
        if name == "where" and len(args) == 1 and not kwargs and this is not None and is_on_device(this):
            return "where(condition)"
        if name in ("tensor", "as_tensor") and kwargs.get("device") is not None and not _is_host(kwargs["device"]):
            return f"torch.{name}(..., device=) from host data"
        if name == "new_tensor" and this is not None and is_on_device(this):
            return "new_tensor() from host data"
        if _to_host(name, args, kwargs) and name == "to":
            return "to('cpu') of a device tensor" if not _non_blocking(args[1:], kwargs) else None
        if name in ("to", "cuda") and this is not None and not is_on_device(this):
            if name == "cuda" or _target_device(args[1:], kwargs) not in (None, "host"):
                if not _non_blocking(args[1:], kwargs):
                    return "blocking host-to-device copy"
            return None
        if name == "copy_" and this is not None and len(args) > 1 and isinstance(args[1], torch.Tensor):
            dst, src = is_on_device(this), is_on_device(args[1])
            if dst != src and not _non_blocking(args[2:], kwargs):
                return "blocking host-to-device copy_" if dst else "blocking device-to-host copy_"
        return None

    @staticmethod
    def _makes_device_tensor(name: str, args: tuple, kwargs: dict) -> bool:
        if name in _FACTORIES and kwargs.get("device") is not None:
            return not _is_host(kwargs["device"])
        if name in ("to", "cuda") and args and isinstance(args[0], torch.Tensor) and not is_on_device(args[0]):
            return name == "cuda" or _target_device(args[1:], kwargs) not in (None, "host")
        if name == "copy_":
            return False  # the destination keeps its place
        return any(is_on_device(t) for t in _tensors(args)) or any(is_on_device(t) for t in _tensors(kwargs.values()))

    def _note(self, kind: str) -> None:
        site = _site()
        if site is not None:
            self.record.syncs.append(Sync(kind, site))


# ------------------------------------------------------------------------------------------------ helpers


def _tensors(values: Iterable[Any]):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)
        elif isinstance(v, dict):
            yield from _tensors(v.values())


def _to_host(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether the call copies a device tensor to the host (``.cpu()``, ``.to("cpu")``)."""
    if not args or not isinstance(args[0], torch.Tensor) or not is_on_device(args[0]):
        return False
    return name == "cpu" or (name == "to" and _target_device(args[1:], kwargs) == "host")


def _is_host(device: Any) -> bool:
    """Only the literal ``"cpu"`` (or ``torch.device("cpu")`` spelled as a string) names the host: a CPU
    engine's device tensors are ``cpu`` tensors too, and code passes ``device=x.device`` for them."""
    return isinstance(device, str) and device.split(":")[0] == "cpu"


def _target_device(args: tuple, kwargs: dict) -> str | None:
    """For ``Tensor.to(...)``: ``None`` (a dtype change only), ``"host"`` or ``"device"``."""
    target = kwargs.get("device")
    for a in args:
        if isinstance(a, (str, torch.device, torch.Tensor)):
            target = a
            break
    if target is None:
        return None
    if isinstance(target, torch.Tensor):
        return "device" if is_on_device(target) else "host"
    return "host" if _is_host(target) else "device"


def _non_blocking(args: tuple, kwargs: dict) -> bool:
    if kwargs.get("non_blocking"):
        return True
    return any(a is True for a in args)


_SKIPPED = (os.path.abspath(__file__), os.path.abspath(ledger.__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def _site() -> str | None:
    """``path:line (function)`` of the innermost frame outside torch and this module; ``None`` for a frame
    in Triton (a kernel launch, not a sync)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path not in _SKIPPED and not path.startswith(_TORCH_DIR) and "/contextlib.py" not in path:
            break
        frame = frame.f_back
    if frame is None:
        return "?"
    path = frame.f_code.co_filename
    if f"{os.sep}triton{os.sep}" in path:
        return None
    for root in ("sgl_ridgefill", "sglang", "tests", "kernels", "selectors"):
        marker = f"{os.sep}{root}{os.sep}"
        if marker in path:
            path = root + os.sep + path.split(marker, 1)[1]
            break
    return f"{path}:{frame.f_lineno} ({frame.f_code.co_name})"
