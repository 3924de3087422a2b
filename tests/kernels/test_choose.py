"""The startup choice of the map backend, with injected timings, and its real measurement on CPU."""

from __future__ import annotations

import logging

import pytest
import torch

from sgl_ridgefill.kernels import choose
from sgl_ridgefill.kernels.choose import choose_from_timings, fastest_map_backend, measuring_timer


def _timer(table: dict[str, dict[int, float] | Exception], calls: list | None = None):
    def timer(backend: str, rows: int) -> float:
        if calls is not None:
            calls.append((backend, rows))
        entry = table[backend]
        if isinstance(entry, Exception):
            raise entry
        return entry[rows]

    return timer


def test_the_smaller_total_wins_and_every_timing_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    calls: list = []
    # Triton is faster at 2K rows but slower in total: the total over the row counts decides.
    timings = {"torch": {2048: 0.50, 8192: 1.50}, "triton": {2048: 0.40, 8192: 1.70}}
    with caplog.at_level(logging.INFO, logger="sgl_ridgefill.kernels.choose"):
        choice = fastest_map_backend(torch.bfloat16, 4096, 4096, device="cuda", timer=_timer(timings, calls))
    assert choice.backend == "torch"
    assert calls == [("torch", 2048), ("torch", 8192), ("triton", 2048), ("triton", 8192)]
    assert choice.ms == timings and choice.failed == {}
    assert caplog.messages == [
        "map backend for bfloat16 maps 4096->4096, bfloat16 rows: torch; "
        "torch 0.500 ms @2048, 1.500 ms @8192 (total 2.000 ms); triton 0.400 ms @2048, 1.700 ms @8192 (total 2.100 ms)"
    ]


def test_triton_wins_when_faster() -> None:
    timings = {"torch": {2048: 0.5, 8192: 2.0}, "triton": {2048: 0.45, 8192: 1.8}}
    assert fastest_map_backend(torch.bfloat16, 896, 896, device="cuda", timer=_timer(timings)).backend == "triton"


def test_a_tie_goes_to_cublas() -> None:
    assert choose_from_timings({"triton": {8: 1.0}, "torch": {8: 1.0}}) == "torch"


def test_a_failing_candidate_is_dropped_and_named() -> None:
    timings = {"torch": {16: 2.0}, "triton": RuntimeError("PTX compilation failed")}
    choice = fastest_map_backend(torch.bfloat16, 896, 896, device="cuda", rows=(16,), timer=_timer(timings))
    assert choice.backend == "torch"
    assert choice.failed == {"triton": "RuntimeError: PTX compilation failed"}
    assert choice.describe().endswith("torch 2.000 ms @16 (total 2.000 ms); triton dropped: RuntimeError: PTX compilation failed")


def test_with_no_candidate_left_the_reference_is_used() -> None:
    timings = {"torch": ValueError("differs"), "triton": ValueError("differs")}
    choice = fastest_map_backend(torch.int8, 896, 896, device="cuda", group_size=128, timer=_timer(timings))
    assert choice.backend == "reference" and set(choice.failed) == {"torch", "triton"}
    assert choice.shape == "int8 maps 896->896 (groups of 128), bfloat16 rows"


@pytest.mark.parametrize("device,x_dtype", [("cpu", torch.float32), ("meta", torch.bfloat16)])
def test_the_reference_is_used_without_measuring_where_nothing_differs(device, x_dtype) -> None:
    choice = fastest_map_backend(torch.bfloat16, 896, 896, device=device, x_dtype=x_dtype)
    assert (choice.backend, choice.ms, choice.failed) == ("reference", {}, {})
    assert choice.describe() == (
        f"map backend for bfloat16 maps 896->896, {str(x_dtype)[6:]} rows: reference "
        "(nothing to measure for these rows on this device)"
    )


def test_on_a_cpu_half_rows_choose_between_the_reference_and_torch() -> None:
    calls: list[tuple[str, int]] = []
    timings = {"reference": {16: 5.0}, "torch": {16: 1.0}}
    choice = fastest_map_backend(torch.bfloat16, 64, 64, device="cpu", rows=(16,), timer=_timer(timings, calls))
    assert choice.backend == "torch" and sorted(calls) == [("reference", 16), ("torch", 16)]
    tie = {"reference": {16: 1.0}, "torch": {16: 1.0}}
    assert fastest_map_backend(torch.bfloat16, 64, 64, device="cpu", rows=(16,), timer=_timer(tie)).backend == "reference"


def test_group_size_only_with_int8() -> None:
    with pytest.raises(ValueError, match=r"group_size is for int8 maps only, got torch.bfloat16 with 128"):
        fastest_map_backend(torch.bfloat16, 8, 8, device="cpu", group_size=128)


def test_measured_choices_are_cached_per_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    made = []

    def fake_measuring_timer(*args):
        made.append(args)
        return _timer({"torch": {8: 1.0}, "triton": {8: 2.0}})

    monkeypatch.setattr(choose, "measuring_timer", fake_measuring_timer)
    monkeypatch.setattr(choose, "_MEASURED", {})
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    first = fastest_map_backend(torch.bfloat16, 64, 64, device="cuda", rows=(8,))
    again = fastest_map_backend(torch.bfloat16, 64, 64, device="cuda", rows=(8,))
    other = fastest_map_backend(torch.bfloat16, 64, 32, device="cuda", rows=(8,))
    assert first is again and first.backend == "torch" and other is not first
    assert len(made) == 2


@pytest.mark.parametrize("map_dtype,group_size", [(torch.bfloat16, None), (torch.int8, 32)])
def test_real_measurement_on_cpu_checks_and_times_both_candidates(map_dtype, group_size) -> None:
    timer = measuring_timer(map_dtype, torch.bfloat16, 64, 48, group_size, "cpu", 1)
    choice = fastest_map_backend(map_dtype, 64, 48, device="cpu", x_dtype=torch.bfloat16, group_size=group_size,
                                 rows=(16, 300), timer=timer)
    assert choice.backend in ("reference", "torch") and choice.failed == {}
    assert set(choice.ms) == {"reference", "torch"}
    assert all(t > 0 for by_rows in choice.ms.values() for t in by_rows.values())


def test_a_candidate_that_disagrees_with_float64_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    real_addmm = torch.addmm

    def wrong_by_a_tenth(b, x, a, **kwargs):  # the bf16 candidate's product 10 % too large, float64 intact
        product = real_addmm(b, x, a, **kwargs)
        return product if x.dtype == torch.float64 else product * 1.1

    timer = measuring_timer(torch.bfloat16, torch.bfloat16, 64, 48, None, "cpu", 1)
    monkeypatch.setattr(torch, "addmm", wrong_by_a_tenth)
    with pytest.raises(ValueError, match=r"^differs from float64 arithmetic by .* of its largest entry \(tolerance 0.016\)$"):
        timer("torch", 16)
