"""Needle-grid presets, the count printed before a run, and sample ids that pair runs across maps folders."""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sysconfig

import pytest

from sgl_ridgefill.eval import sizing
from sgl_ridgefill.eval.haystack import open_haystack
from sgl_ridgefill.eval.needles import make_samples
from sgl_ridgefill.eval.runner import prompt_sha


def _args(**flags):
    base = {name: None for name in sizing.GRID}
    return argparse.Namespace(**{**base, "preset": None, **flags})


def test_the_quality_preset_fills_the_grid_and_explicit_flags_win():
    args = _args(preset="quality", seeds=3)
    assert sizing.apply_preset(args) is sizing.PRESETS["quality"]
    assert (args.tasks, args.depths, args.seeds, args.lengths, args.haystacks) == (
        "niah_single,niah_multikey", 10, 3, (4096,), "noise,text")
    plain = _args(depths=7)
    assert sizing.apply_preset(plain) is None
    assert (plain.tasks, plain.depths, plain.seeds, plain.lengths) == ("niah_single", 7, 1, (4096,))
    with pytest.raises(ValueError, match="--preset 'fast': known presets are quality"):
        sizing.apply_preset(_args(preset="fast"))


class _S:
    def __init__(self, region):
        self.region = region


def test_the_plan_counts_samples_by_region_and_requests():
    samples = [_S("filled")] * 96 + [_S("tail")] * 16
    text = sizing.plan_text(samples, ("exact", "ridgefill", "ridgefill+rows"), {4096: [1, 2, 3, 4]},
                            ("exact", "ridgefill", "splice:keys"))
    assert text == ("112 needle samples (96 filled, 16 tail) x 3 arms = 336 requests; 4 documents x 4 arms "
                    "(with cut) = 16 requests; 352 in all (before resuming)")
    assert sizing.too_few_filled(sizing.PRESETS["quality"], samples) is None
    assert "95 filled-region samples, fewer than the 96" in sizing.too_few_filled(sizing.PRESETS["quality"], samples[1:])
    assert sizing.too_few_filled(None, samples[:3]) is None


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """A prose-like folder haystack (standing in for ``text``, which needs the Debian packages)."""
    root = tmp_path_factory.mktemp("prose")
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "difflib.py", "argparse.py", "inspect.py"):
        shutil.copy(stdlib / name, root / f"{name}.txt")
    return str(root)


def _quality(tok, haystacks, exclude=frozenset()):
    preset = sizing.PRESETS["quality"]
    return make_samples(tok, preset.tasks.split(","), preset.lengths, 1024, haystacks=haystacks,
                        seeds=tuple(range(preset.seeds)), n_filled=preset.depths, exclude_ids=exclude)


def test_the_quality_preset_makes_96_filled_samples_with_stable_ids(tok, folder):
    samples = _quality(tok, ("noise", folder))
    counts = sizing.sample_counts(samples)
    assert (counts["filled"], counts["tail"], counts["straddle"]) == (96, 16, 0)  # 2 x 2 x 2 x (10 + 2), 2 x 2 x 2 x 2
    assert sizing.too_few_filled(sizing.PRESETS["quality"], samples) is None
    ids = [s.id for s in samples]
    assert len(set(ids)) == len(ids) and ids[0] == "niah_single/noise/4096/0/0"
    # The sample ids and prompts depend on the tokenizer, length, tail, task, depth grid, seed and haystack
    # only: no split, map kind or maps folder enters, so runs on other maps and splits pair by id.
    again = _quality(tok, ("noise", folder))
    assert [(s.id, s.input_ids, s.needle_spans) for s in again] == [(s.id, s.input_ids, s.needle_spans) for s in samples]
    # A text haystack leaves out the maps folder's calibration documents: same ids and needles, other prose,
    # so the prompt hash tells a pair apart.
    calibrated = {next(open_haystack(folder).documents(seed=seed))[0] for seed in (0, 1)}  # each seed's first
    other = _quality(tok, ("noise", folder), exclude=calibrated)
    assert [s.id for s in other] == ids
    noise = [(a, b) for a, b in zip(samples, other) if a.haystack == "noise"]
    prose = [(a, b) for a, b in zip(samples, other) if a.haystack != "noise"]
    assert all(prompt_sha(a.input_ids) == prompt_sha(b.input_ids) for a, b in noise)
    assert all(a.answers == b.answers for a, b in prose)
    assert all(prompt_sha(a.input_ids) != prompt_sha(b.input_ids) for a, b in prose)


def test_resuming_refuses_other_maps_kinds_rows_and_depth_grids(tmp_path):
    from sgl_ridgefill.eval.cli import changed_settings

    settings = {"model_path": "m", "split": 12, "tail": 1024, "maps": "d", "rows_policy": "eval-rows",
                "rows_fraction": 0.1, "rows_select": None, "map_kind": "residual", "depths": 10, "upgrade_rows": 0}
    # An older run's, from before those were recorded.
    old = {k: v for k, v in settings.items() if k not in ("map_kind", "depths", "rows_select", "upgrade_rows")}
    assert changed_settings(old, settings) == []
    assert changed_settings(old, {**settings, "map_kind": "kv"}) == ["map_kind: 'residual' -> 'kv'"]
    assert changed_settings({**settings, "depths": 5}, settings) == ["depths: 5 -> 10"]
    own = {**settings, "rows_fraction": None, "rows_select": "digits()"}
    assert changed_settings(old, own) == ["rows_fraction: 0.1 -> None", "rows_select: None -> 'digits()'"]
    # The exact upgrade changes what an answer reads: a run recorded with it on resumes with it on.
    upgraded = {**settings, "upgrade_rows": 512}
    assert changed_settings(upgraded, settings) == ["upgrade_rows: 512 -> 0"]


def test_resuming_refuses_another_dtype_or_maps_fitted_in_another_dtype():
    """A run resumed on another machine: records of one dtype are not pooled with another's, nor with
    records read through maps fitted from another dtype's activations (the maps folder is fitted again
    there). A run recorded before the maps' dtype was kept had its maps fitted in its own dtype."""
    from sgl_ridgefill.eval.cli import _resume_hint, changed_settings

    settings = {"model_path": "m", "split": 12, "tail": 1024, "maps": "d", "rows_policy": "eval-rows",
                "rows_fraction": 0.1, "rows_select": None, "map_kind": "residual", "depths": 10, "upgrade_rows": 0,
                "dtype": "bfloat16", "maps_dtype": "bfloat16"}
    assert changed_settings(settings, settings) == []
    assert changed_settings(settings, {**settings, "dtype": "float32"}) == ["dtype: 'bfloat16' -> 'float32'"]
    older = {k: v for k, v in settings.items() if k != "maps_dtype"}
    assert changed_settings(older, settings) == []
    assert changed_settings(older, {**settings, "maps_dtype": "float32"}) == ["maps_dtype: 'bfloat16' -> 'float32'"]
    assert "--dtype bfloat16 (or without --dtype)" in _resume_hint(settings, {**settings, "dtype": "float32"})
    assert "calibrate ... --dtype bfloat16" in _resume_hint(settings, {**settings, "maps_dtype": "float32"})
    assert _resume_hint(settings, {**settings, "split": 14}) == "use another --out"
    # A run against a server given by address records the dtype it asked for ("auto"): its maps' dtype is
    # not known from it, and a resumed run against the same server is not refused for it.
    remote = {**older, "dtype": "auto"}
    assert changed_settings(remote, {**settings, "dtype": "auto"}) == []
    assert _resume_hint(remote, {**settings, "dtype": "bfloat16"}) == "use another --out"


def test_a_run_records_what_its_map_kind_costs_per_filled_row():
    from sgl_ridgefill.eval.cli import _fill_flops

    qwen = {"num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2,
            "intermediate_size": 4864, "vocab_size": 151936}
    assert (_fill_flops("residual", qwen), _fill_flops("kv+context", qwen)) == (2_064_384, 1_376_256)
    with pytest.raises(ValueError, match="unknown map kind 'linear'"):
        _fill_flops("linear", qwen)
