"""Value rescale on hand-made cases: per-head mean of norm ratios, zero-norm guards, in-place scaling."""

from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.kernels.rescale import apply_value_scale_, value_scale_reference


def _row(norm: float, d: int = 4) -> torch.Tensor:
    """A head_dim vector with the given Euclidean norm, along a fixed direction (3, 4, 0, ...)/5."""
    direction = torch.zeros(d)
    direction[:2] = torch.tensor([0.6, 0.8])
    return direction * norm


def test_scale_is_the_mean_of_per_row_ratios_per_head() -> None:
    # Head 0: ratios 1 and 3 -> 2 (the ratio of summed norms, 7/3, would be wrong).
    # Head 1: exact is half of predicted on both rows -> 0.5.
    v_pred = torch.stack([torch.stack([_row(1.0), _row(2.0)]), torch.stack([_row(2.0), _row(4.0)])])
    v_exact = torch.stack([torch.stack([_row(1.0), _row(1.0)]), torch.stack([_row(6.0), _row(2.0)])])
    scale = value_scale_reference(v_exact, v_pred)
    assert scale.dtype == torch.float32
    torch.testing.assert_close(scale, torch.tensor([2.0, 0.5]))


def test_rows_with_zero_predicted_norm_are_left_out() -> None:
    # Head 0: second row has a zero prediction and is skipped -> ratio 3 alone.
    # Head 1: every prediction is zero -> no correction (1.0). Head 2: zero exact value -> ratio 0 counts.
    v_pred = torch.stack(
        [
            torch.stack([_row(1.0), torch.zeros(4), _row(1.0)]),
            torch.stack([torch.zeros(4), torch.zeros(4), _row(2.0)]),
        ]
    )
    v_exact = torch.stack(
        [
            torch.stack([_row(3.0), _row(5.0), torch.zeros(4)]),
            torch.stack([_row(7.0), _row(1.0), _row(2.0)]),
        ]
    )
    scale = value_scale_reference(v_exact, v_pred)
    assert bool(torch.isfinite(scale).all())
    torch.testing.assert_close(scale, torch.tensor([3.0, 1.0, 0.5]))


def test_direction_does_not_matter_only_norms() -> None:
    gen = torch.Generator().manual_seed(0)
    v_pred = torch.randn(5, 3, 64, generator=gen)
    rotated = torch.linalg.qr(torch.randn(64, 64, generator=gen, dtype=torch.float64))[0].float()
    v_exact = (v_pred @ rotated) * torch.tensor([1.0, 2.0, 0.25])[None, :, None]
    torch.testing.assert_close(value_scale_reference(v_exact, v_pred), torch.tensor([1.0, 2.0, 0.25]))


def test_bf16_inputs_give_float32_scales() -> None:
    v_pred = torch.full((3, 2, 8), 0.5, dtype=torch.bfloat16)
    scale = value_scale_reference(v_pred * 4, v_pred)
    assert scale.dtype == torch.float32
    torch.testing.assert_close(scale, torch.tensor([4.0, 4.0]))


def test_apply_scales_every_row_in_place() -> None:
    v = torch.ones(3, 2, 4, dtype=torch.bfloat16)
    returned = apply_value_scale_(v, torch.tensor([2.0, 0.5]))
    assert returned is v
    assert bool((v[:, 0] == 2.0).all()) and bool((v[:, 1] == 0.5).all())


def test_apply_scales_only_the_given_rows() -> None:
    cache = torch.ones(6, 2, 4)
    apply_value_scale_(cache, torch.tensor([3.0, -1.0]), rows=torch.tensor([4, 1]))
    want = torch.ones(6, 2, 4)
    want[[1, 4], 0] = 3.0
    want[[1, 4], 1] = -1.0
    assert torch.equal(cache, want)


def test_apply_rounds_once_to_the_cache_dtype() -> None:
    # v = 1 + 2^-7 and scale = 1 + 2^-8. In float32 the product is 1.01174926..., above the midpoint
    # 1.01171875 of its bf16 neighbours, so it rounds to 1.015625. Rounding the scale to bf16 first
    # (a tie, to even: 1.0) would leave v unchanged at 1.0078125.
    v = torch.full((2, 1, 3), 1.0078125, dtype=torch.bfloat16)
    apply_value_scale_(v, torch.tensor([1.00390625]))
    assert bool((v == 1.015625).all())


def test_argument_errors_name_the_values() -> None:
    with pytest.raises(ValueError) as info:
        value_scale_reference(torch.ones(4, 2, 8), torch.ones(4, 3, 8))
    assert str(info.value) == (
        "value_scale_reference: v_exact and v_pred must both be [c, n_kv_heads, head_dim], got (4, 2, 8) and (4, 3, 8)"
    )
    with pytest.raises(ValueError) as info:
        apply_value_scale_(torch.ones(4, 2, 8), torch.ones(3))
    assert str(info.value) == "apply_value_scale_: scale must have shape (2,), got (3,)"
    with pytest.raises(ValueError) as info:
        apply_value_scale_(torch.ones(4, 2, 8), torch.ones(2), rows=torch.tensor([0.0]))
    assert str(info.value) == "apply_value_scale_: rows must be a 1-D integer index tensor, got torch.float32 (1,)"
