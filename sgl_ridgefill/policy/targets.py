"""What a policy is compiled against: the maps folder and the model (both optional).

The runtime builds ``MapsInfo`` from the maps manifest and ``ModelInfo`` from the model config; the
CLI builds them from ``--maps``. Without them ``compile_policy`` checks only what the text alone decides.
"""

from __future__ import annotations

import dataclasses


def _indices(name: str, values, limit: int) -> tuple[int, ...]:
    out = tuple(values)
    if any(not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < limit for v in out):
        raise ValueError(f"{name} must be layer indices in [0, {limit}), got {list(out)}")
    if len(set(out)) != len(out):
        raise ValueError(f"{name} names a layer twice: {list(out)}")
    return tuple(sorted(out))


def _positive(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclasses.dataclass(frozen=True)
class MapsInfo:
    """What a maps folder offers.

    splits: split layers the folder has maps for; default_split: the one used when a policy names none;
    num_layers: layers of the model the maps were fitted on.
    """

    splits: tuple[int, ...]
    default_split: int
    num_layers: int

    def __post_init__(self) -> None:
        _positive("MapsInfo.num_layers", self.num_layers)
        splits = _indices("MapsInfo.splits", self.splits, self.num_layers)
        if not splits:
            raise ValueError("MapsInfo.splits is empty: a maps folder holds maps for at least one split")
        if self.default_split not in splits:
            raise ValueError(f"MapsInfo.default_split {self.default_split!r} is not one of the splits {list(splits)}")
        object.__setattr__(self, "splits", splits)


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """Layer structure of the served model.

    attention_layers: layers with softmax attention (all of them for dense models);
    recurrent_layers: Gated DeltaNet and other recurrent-state layers (empty for Llama, Qwen2, Qwen3).
    """

    num_layers: int
    attention_layers: tuple[int, ...]
    recurrent_layers: tuple[int, ...] = ()
    has_qk_norm: bool = False

    def __post_init__(self) -> None:
        _positive("ModelInfo.num_layers", self.num_layers)
        attention = _indices("ModelInfo.attention_layers", self.attention_layers, self.num_layers)
        recurrent = _indices("ModelInfo.recurrent_layers", self.recurrent_layers, self.num_layers)
        both = sorted(set(attention) & set(recurrent))
        if both:
            raise ValueError(f"ModelInfo: layer {both[0]} is listed as both attention and recurrent")
        object.__setattr__(self, "attention_layers", attention)
        object.__setattr__(self, "recurrent_layers", recurrent)

    @classmethod
    def dense(cls, num_layers: int, *, has_qk_norm: bool = False) -> ModelInfo:
        """A model whose every layer is softmax attention (Llama, Qwen2, Qwen3)."""
        return cls(num_layers, tuple(range(num_layers)), (), has_qk_norm)

    @classmethod
    def hybrid(cls, num_layers: int, *, attention_every: int, has_qk_norm: bool = True) -> ModelInfo:
        """Every ``attention_every``-th layer is attention (the last of each group), the rest recurrent
        (Qwen3.5, Qwen3-Next style: ``attention_every=4`` gives attention at 3, 7, 11, ...)."""
        _positive("attention_every", attention_every)
        attention = tuple(l for l in range(num_layers) if l % attention_every == attention_every - 1)
        recurrent = tuple(l for l in range(num_layers) if l not in attention)
        return cls(num_layers, attention, recurrent, has_qk_norm)
