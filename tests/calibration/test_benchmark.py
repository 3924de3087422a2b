from __future__ import annotations

from sgl_ridgefill.calibration.benchmark import benchmark_pass


def test_benchmark_reports_consistent_timings(tiny_model, text_corpus):
    result = benchmark_pass(str(tiny_model), corpus=str(text_corpus), splits=(1, 2), docs=3, doc_tokens=128)
    assert result["documents"] == 3 and result["tokens"] == 3 * 128
    assert result["plain_forward_s"] > 0 and result["capture_s"] > 0 and result["accumulate_s"] > 0
    assert result["plain_tokens_per_s"] > 0
    total = result["capture_s"] + result["accumulate_s"]
    assert abs(result["calibration_vs_plain"] - total / result["plain_forward_s"]) < 0.05 * result["calibration_vs_plain"] + 0.01
