"""Where a prefill's time goes: a ``py-spy record --format raw`` profile of the scheduler, by phase.

    py-spy record --pid SCHEDULER_PID --idle -r 20 -d 120 --format raw -o prof.txt    # while a request runs
    python -m sgl_ridgefill.bench.phases prof.txt

Each sample of the scheduler's main thread is put in one phase by the innermost RidgeFill pass on its
stack (``lower_pass``, ``fill_pass``, ``upper_pass``; an exact request's forward is "exact forward"), and in one
kind by the innermost known module below it (attention backend, linear layer, SGLang's native norm /
activation / RoPE ops, residual bookkeeping, the fill's map and K/V). Samples of other threads are
dropped (py-spy also samples idle helper threads). Shares are of the main thread's samples.

Record with ``--idle``: without it py-spy drops the samples where the main thread sleeps, and with
``OMP_WAIT_POLICY=PASSIVE`` (``sgl_ridgefill.cpu.environment``) the main thread sleeps whenever it waits
for the other intra-op threads at the end of a parallel region, so that time would vanish from the profile.
"""

from __future__ import annotations

import collections
import pathlib
from collections.abc import Iterable, Sequence

from ..arch import FAMILIES
from ..tools import args as argtypes

# (frame function name, phase), innermost match wins.
PHASES: tuple[tuple[str, str], ...] = (
    ("lower_pass", "lower layers"),
    ("fill_pass", "fill (map + K/V)"),
    ("upper_pass", "upper layers (tail + exact rows)"),
    ("accumulate_statistics", "selection statistics"),
    ("run_probe", "probe"),
    ("select_rows", "row selection"),
    *((f"{f.hf_class}.forward", "exact forward") for f in FAMILIES),  # every family of arch.py
    *((f"{f.inner_model}.forward", "exact forward") for f in FAMILIES),
    ("LogitsProcessor.forward", "logits"),
    ("IdleSleeper.maybe_sleep", "idle (waiting for a request)"),
)
# (frame function name, kind), innermost match wins.
KINDS: tuple[tuple[str, str], ...] = (
    ("RadixAttention.forward", "attention"),
    ("set_kv_buffer", "KV write"),
    ("MapsStore.predict", "map"),
    ("ModelAdapter.key_value", "fill K/V"),
    ("UnquantizedLinearMethod.apply", "linear"),
    ("BaseFusedOp.forward", "norm/act/rope (native ops)"),
    ("StageBoundary.prepare", "residual + norm bookkeeping"),
    ("StageBoundary.finish", "residual + norm bookkeeping"),
)


def _function(frame: str) -> str:
    return frame.split(" (", 1)[0]


def _innermost(frames: Sequence[str], table: tuple[tuple[str, str], ...]) -> str | None:
    names = dict(table)
    for frame in reversed(frames):
        label = names.get(_function(frame))
        if label is not None:
            return label
    return None


def is_main_thread(frames: Sequence[str]) -> bool:
    """With ``--threads`` the first frame names the thread; without it, helper threads run under
    ``Thread._bootstrap`` (below native frames with ``--native``) and the main thread does not."""
    if not frames:
        return False
    if frames[0].startswith("thread ("):
        return "MainThread" in frames[0]
    return not any(f.startswith("Thread._bootstrap") for f in frames)


def read_raw(lines: Iterable[str]) -> list[tuple[list[str], int]]:
    """Parse py-spy's raw (collapsed) format: ``frame;frame;... count`` per line."""
    out = []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            raise ValueError(f"not a py-spy raw profile line: {line[:80]!r}")
        out.append((stack.split(";"), int(count)))
    return out


def phase_table(samples: Sequence[tuple[list[str], int]]) -> dict[tuple[str, str], int]:
    """Main-thread sample counts by ``(phase, kind)``; off-forward samples are ``("outside forward", ...)``."""
    table: collections.Counter[tuple[str, str]] = collections.Counter()
    for frames, count in samples:
        if not is_main_thread(frames):
            continue
        phase = _innermost(frames, PHASES) or "outside forward"
        kind = _innermost(frames, KINDS) or "other"
        table[(phase, kind)] += count
    return dict(table)


def format_phases(table: dict[tuple[str, str], int], sample_rate: float | None = None) -> str:
    total = sum(table.values())
    if not total:
        return "no main-thread samples"
    by_phase: collections.Counter[str] = collections.Counter()
    for (phase, _), n in table.items():
        by_phase[phase] += n
    lines = [f"main-thread samples: {total}" + (f" ({total / sample_rate:.1f} s)" if sample_rate else "")]
    for phase, n in by_phase.most_common():
        lines.append(f"{n / total:6.1%}  {phase}")
        kinds = sorted(((k, m) for (p, k), m in table.items() if p == phase), key=lambda x: -x[1])
        for kind, m in kinds:
            lines.append(f"        {m / total:6.1%}  {kind}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argtypes.command_parser("sgl_ridgefill.bench.phases", __doc__)
    parser.add_argument("profile", type=pathlib.Path, help="py-spy record --format raw output")
    parser.add_argument("--rate", type=float, default=None, help="the -r given to py-spy, to print seconds")
    args = parser.parse_args(argv)
    with args.profile.open() as f:
        print(format_phases(phase_table(read_raw(f)), args.rate))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
