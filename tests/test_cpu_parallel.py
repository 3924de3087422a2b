"""The CPU recipe for tensor parallelism and PD disaggregation (``sgl_ridgefill/cpu/parallel.py``)."""

from __future__ import annotations

import pytest

from sgl_ridgefill.cpu.parallel import NO_NCCL, Layout, core_groups, parallel_environment, parallel_flags


def test_layout_from_the_command_line():
    assert Layout.from_argv(["--model-path", "m"]) == Layout()
    assert Layout.from_argv(["--tp-size", "2", "--disaggregation-mode", "prefill", "--host", "0.0.0.0"]) == Layout(
        tp_size=2, disaggregation_mode="prefill", host="0.0.0.0")
    assert Layout.from_argv(["--tensor-parallel-size=4"]).tp_size == 4
    with pytest.raises(ValueError, match="--tp-size must be an integer"):
        Layout.from_argv(["--tp-size", "two"])


@pytest.mark.parametrize("cores, ranks, expected", [
    ([0, 1], 2, "0|1"), ([0, 1, 2, 3], 2, "0,1|2,3"), ([5], 2, "5|5"), ([0, 1, 2], 2, "0|1"),
])
def test_one_core_group_per_rank(cores, ranks, expected):
    assert core_groups(cores, ranks) == expected


def test_tensor_parallel_environment():
    env = parallel_environment(Layout(tp_size=2), base={}, cores=[0, 1, 2, 3])
    assert env == {"SGLANG_CPU_OMP_THREADS_BIND": "0,1|2,3", "SGLANG_NCCL_SO_PATH": NO_NCCL, "OMP_NUM_THREADS": "2",
                   "TORCHDYNAMO_DISABLE": "1"}
    assert "OMP_NUM_THREADS" not in parallel_environment(Layout(tp_size=2), base={"OMP_NUM_THREADS": "1"})
    assert parallel_environment(Layout(), base={}) == {}
    assert parallel_flags(Layout(tp_size=2)) == {"disable_custom_all_reduce": True}


def test_pd_pins_the_transfer_engine_to_the_server_address():
    assert parallel_environment(Layout(disaggregation_mode="decode"), base={}) == {
        "SGLANG_HOST_IP": "127.0.0.1", "MC_TCP_BIND_ADDRESS": "127.0.0.1"}
    assert parallel_environment(Layout(disaggregation_mode="prefill", host="0.0.0.0"), base={}) == {}
    assert parallel_flags(Layout(disaggregation_mode="prefill"))["disable_overlap_schedule"] is True
