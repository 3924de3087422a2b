"""Server-wide RidgeFill settings, read once per process from the environment the CLI flags write."""

from __future__ import annotations

from dataclasses import dataclass

from . import envs

ARMS = ("ridgefill", "identity", "nofill", "exact")
CACHE_MODES = ("no_insert", "namespace")
MAP_DTYPES = ("auto", "bfloat16", "float32", "int8")
DEFAULT_TAIL = 1024


def _int(name: str, raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


@dataclass(frozen=True)
class ServerConfig:
    """What ``--prefill-backend ridgefill`` and the ``--ridgefill-*`` flags asked for.

    ``split``/``tail``/``arm``/``cache_mode`` given here override the policy file's; ``None`` means "use the
    policy's, else the maps folder's default split and ``DEFAULT_TAIL``".
    """

    enabled: bool = False
    maps: str | None = None
    policy: str | None = None
    split: int | None = None
    tail: int | None = None
    arm: str | None = None
    cache_mode: str | None = None
    map_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.arm is not None and self.arm not in ARMS:
            raise ValueError(f"--ridgefill-arm {self.arm!r} is not one of {', '.join(ARMS)}")
        if self.cache_mode is not None and self.cache_mode not in CACHE_MODES:
            raise ValueError(f"--ridgefill-cache-mode {self.cache_mode!r} is not one of {', '.join(CACHE_MODES)}")
        if self.map_dtype not in MAP_DTYPES:
            raise ValueError(f"--ridgefill-map-dtype {self.map_dtype!r} is not one of {', '.join(MAP_DTYPES)}")
        if self.split is not None and self.split < 1:
            raise ValueError(f"--ridgefill-split must be >= 1, got {self.split}")
        if self.tail is not None and self.tail < 1:
            raise ValueError(f"--ridgefill-tail must be >= 1, got {self.tail}")
        if self.enabled and self.maps is None and (self.arm or "ridgefill") == "ridgefill":
            raise ValueError(
                "--prefill-backend ridgefill needs --ridgefill-maps DIR (fit one with `sgl-ridgefill calibrate`); "
                "only the identity, nofill and exact arms run without maps"
            )

    @classmethod
    def from_env(cls) -> ServerConfig:
        return cls(
            enabled=envs.ridgefill_enabled(),
            maps=envs.get(envs.MAPS),
            policy=envs.get(envs.POLICY),
            split=_int("--ridgefill-split", envs.get(envs.SPLIT)),
            tail=_int("--ridgefill-tail", envs.get(envs.TAIL)),
            arm=envs.get(envs.ARM),
            cache_mode=envs.get(envs.CACHE_MODE),
            map_dtype=envs.get(envs.MAP_DTYPE, "auto"),
        )
