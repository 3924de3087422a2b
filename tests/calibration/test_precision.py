"""How the statistics' products are formed (``--accumulate``): float64, or float32 blocks into float64
totals; the choice recorded with the statistics; the study that compares the two."""

from __future__ import annotations

import json

import pytest
import torch

from sgl_ridgefill.calibration.config import CalibrationConfig, CalibrationError
from sgl_ridgefill.calibration.pipeline import collect_stats
from sgl_ridgefill.calibration.precision import MAP_TOLERANCE, R2_TOLERANCE, compare_kind, main, passes
from sgl_ridgefill.calibration.stats import (
    CUDA_ACCUMULATION,
    SplitStats,
    accumulation_dtype,
    choose_accumulation,
    load_stats,
)
from sgl_ridgefill.vocabulary import ACCUMULATIONS

SPLIT = 2


def _quiet(message: str) -> None:
    pass


def _config(model, corpus, stats, **overrides):
    settings = dict(model=str(model), corpus=str(corpus), splits=(SPLIT,), out_dir=None, stats_dir=stats,
                    max_tokens=1500, doc_tokens=256, min_doc_tokens=32, heldout_docs=2, progress=False,
                    checkpoint_seconds=0.0, dtype="float32", kinds=("residual", "kv+context"))
    settings.update(overrides)
    return CalibrationConfig(**settings)


def test_every_accumulation_names_its_dtype():
    assert [accumulation_dtype(name) for name in ACCUMULATIONS] == [torch.float64, torch.float32]


def test_float32_blocks_add_into_float64_totals():
    torch.manual_seed(0)
    z = 40.0 + torch.randn(512, 16, dtype=torch.float64)  # a large mean, as the residual stream has
    y = torch.randn(512, 8, dtype=torch.float64)
    exact, blocks = SplitStats.zeros(1, 2, 16, 8), SplitStats.zeros(1, 2, 16, 8)
    exact.add(z, [(y, y)])
    for rows in torch.split(torch.arange(512), 128):  # four pieces of float32 products
        blocks.add(z[rows].float(), [(y[rows].float(), y[rows].float())])
    for name, total in blocks.tensors("s").items():
        assert total.dtype == torch.float64, name
        torch.testing.assert_close(total, exact.tensors("s")[name], rtol=1e-5, atol=1e-4)
    assert not torch.equal(blocks.xtx, exact.xtx)  # the products really were float32


def test_auto_is_float64_on_the_cpu_and_the_measured_choice_on_cuda():
    assert choose_accumulation("auto", "cpu")[0] == "float64"
    assert choose_accumulation("auto", torch.device("cuda:0"))[0] == CUDA_ACCUMULATION
    assert choose_accumulation("float32-blocks", "cpu") == ("float32-blocks", "chosen with --accumulate")
    with pytest.raises(CalibrationError, match=r"--accumulate must be auto or one of float64, float32-blocks, got 'half'"):
        choose_accumulation("half", "cpu")


def test_config_refuses_an_unknown_accumulation(tiny_model, text_corpus, tmp_path):
    with pytest.raises(CalibrationError, match=r"--accumulate must be auto or one of float64, float32-blocks, got 'fp8'"):
        _config(tiny_model, text_corpus, tmp_path / "s", accumulate="fp8")


@pytest.fixture(scope="module")
def both(tiny_model, text_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("precision")
    states = {}
    for name in ACCUMULATIONS:
        states[name], _, _ = collect_stats(_config(tiny_model, text_corpus, root / name, accumulate=name), log=_quiet)
    return root, states


def test_the_accumulation_is_part_of_the_statistics_identity(both, tiny_model, text_corpus):
    root, states = both
    assert {name: state.run["accumulate"] for name, state in states.items()} == {n: n for n in ACCUMULATIONS}
    with pytest.raises(CalibrationError, match=r"differs in: accumulate"):
        collect_stats(_config(tiny_model, text_corpus, root / "float64", accumulate="float32-blocks"), log=_quiet)
    # auto on the CPU is float64: it resumes the float64 statistics
    messages = []
    collect_stats(_config(tiny_model, text_corpus, root / "float64"), log=messages.append)
    assert any(m.startswith("resuming from") for m in messages)
    assert "accumulation: float64 (float64 products on the CPU)" in messages


def test_statistics_from_before_the_choice_resume_as_float64(both, tiny_model, text_corpus, tmp_path):
    import shutil

    root, _ = both
    legacy = tmp_path / "legacy"
    shutil.copytree(root / "float64", legacy)
    state = load_stats(legacy)
    del state.run["accumulate"]
    state.save(legacy)
    messages = []
    collect_stats(_config(tiny_model, text_corpus, legacy), log=messages.append)
    assert any(m.startswith("resuming from") for m in messages)
    with pytest.raises(CalibrationError, match=r"differs in: accumulate"):
        collect_stats(_config(tiny_model, text_corpus, legacy, accumulate="float32-blocks"), log=_quiet)


def test_comparison_of_a_pass_with_itself_is_exact(both):
    _, states = both
    for kind in ("residual", "kv+context"):
        entry = compare_kind(states["float64"], states["float64"], SPLIT, kind)
        assert entry["r2_max_diff"] == entry["reported_r2_max_diff"] == entry["map_rel_diff"] == 0.0
        assert entry["lambda_float64"] == entry["lambda_float32_blocks"] and passes(entry)


def test_float32_blocks_stay_within_the_tolerance_on_a_small_model(both):
    _, states = both
    for kind in ("residual", "kv+context"):
        entry = compare_kind(states["float64"], states["float32-blocks"], SPLIT, kind)
        assert 0.0 < entry["map_rel_diff"] <= MAP_TOLERANCE, entry
        assert entry["r2_max_diff"] <= R2_TOLERANCE and entry["reported_r2_max_diff"] <= R2_TOLERANCE, entry


def test_study_command_writes_its_report(tiny_model, text_corpus, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["--model", str(tiny_model), "--corpus", str(text_corpus), "--splits", str(SPLIT), "--max-tokens",
                 "1200", "--dtype", "float32", "--kinds", "residual", "--out", str(out), "--no-progress"])
    assert code == 0
    result = json.loads((out / "precision.json").read_text())
    assert [e["kind"] for e in result["kinds"]] == ["residual"] and set(result["timing"]) == set(ACCUMULATIONS)
    assert result["float32_blocks_adequate"] == all(e["passes"] for e in result["kinds"])
    assert "| 2 | residual |" in (out / "PRECISION.md").read_text()
    assert "float32 block products" in capsys.readouterr().out
