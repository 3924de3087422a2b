"""Attributing a py-spy raw profile of the scheduler to RidgeFill phases."""

from __future__ import annotations

import pytest

from sgl_ridgefill.bench.phases import format_phases, phase_table, read_raw

ROOT = "<module> (<string>:1);run_scheduler_process (scheduler.py:6368);RidgeFillRuntime.forward (sgl_ridgefill/runtime/runtime.py:217)"
RAW = f"""\
{ROOT};run_chunk (prefill.py:60);lower_pass (passes.py:48);Qwen2DecoderLayer.forward (qwen2.py:340);RadixAttention.forward (radix_attention.py:183) 6
{ROOT};run_chunk (prefill.py:60);lower_pass (passes.py:48);Qwen2MLP.forward (qwen2.py:119);UnquantizedLinearMethod.apply (unquant.py:614) 2
{ROOT};run_chunk (prefill.py:65);fill_pass (passes.py:73);MapsStore.predict (maps_store.py:40) 1
{ROOT};run_chunk (prefill.py:65);fill_pass (passes.py:74);ModelAdapter.key_value (adapter.py:89);BaseFusedOp.forward (fused_op.py:663) 1
{ROOT};run_chunk (prefill.py:101);upper_pass (passes.py:113);Qwen2DecoderLayer.forward (qwen2.py:340);RadixAttention.forward (radix_attention.py:183) 4
Thread._bootstrap (threading.py:1002);WatchdogRaw._watchdog_thread (watchdog.py:127) 50
<module> (<string>:1);Scheduler.event_loop_overlap (scheduler.py:2133) 6
"""


def test_phases_of_a_ridgefill_profile():
    table = phase_table(read_raw(RAW.splitlines()))
    assert table == {
        ("lower layers", "attention"): 6,
        ("lower layers", "linear"): 2,
        ("fill (map + K/V)", "map"): 1,
        ("fill (map + K/V)", "norm/act/rope (native ops)"): 1,  # the innermost known frame wins
        ("upper layers (tail + exact rows)", "attention"): 4,
        ("outside forward", "other"): 6,
    }  # the helper thread's 50 samples are dropped
    text = format_phases(table, sample_rate=4)
    assert text.splitlines()[0] == "main-thread samples: 20 (5.0 s)"
    assert text.splitlines()[1] == " 40.0%  lower layers"


def test_thread_labels_from_py_spy_threads_option():
    raw = ["thread (1): MainThread;lower_pass (passes.py:48) 3", "thread (2): tqdm_monitor;Condition.wait (threading.py:331) 9"]
    assert phase_table(read_raw(raw)) == {("lower layers", "other"): 3}


def test_native_stacks_of_helper_threads_are_dropped():
    raw = [
        "0x7f2 (libc.so.6);<module> (<string>:1);lower_pass (passes.py:48);0x7f3 (libgomp.so.1) 5",
        "0x7f2 (libc.so.6);Thread._bootstrap (threading.py:1002);Condition.wait (threading.py:331);clock_nanosleep (libc.so.6) 7",
    ]
    assert phase_table(read_raw(raw)) == {("lower layers", "other"): 5}


def test_bad_profile_line():
    with pytest.raises(ValueError, match=r"^not a py-spy raw profile line: 'garbage'$"):
        read_raw(["garbage"])


def test_every_ridgefill_phase_names_a_function_of_the_runtime():
    """The phases are matched by function name on py-spy's stacks: a renamed pass would fall silently into
    another phase."""
    import inspect

    from sgl_ridgefill.bench.phases import PHASES
    from sgl_ridgefill.runtime import passes, prefill, selection

    defined = {name for module in (passes, prefill, selection) for name, _ in inspect.getmembers(module, inspect.isfunction)}
    runtime_phases = [name for name, _ in PHASES if "." not in name]
    assert runtime_phases, PHASES
    missing = [name for name in runtime_phases if name not in defined]
    assert not missing, f"phases naming no runtime function: {missing}"
