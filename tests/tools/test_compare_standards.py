"""Ascend precision standards and metrics against hand-computed examples."""
from __future__ import annotations

import math

import pytest
import torch

from pasa_npu.tools import metrics
from pasa_npu.tools.compare import standards
from pasa_npu.tools.compare.bias import BiasRow, finding

EPS = 1e-7


def test_mere_mare_by_hand():
    golden = torch.tensor([1.0, 2.0, 4.0, 0.0], dtype=torch.float64)
    actual = torch.tensor([1.5, 2.0, 3.0, 1e-7], dtype=torch.float64)
    # |a-g|/(|g|+1e-7): 0.5/(1+1e-7), 0, 1/(4+1e-7), 1e-7/1e-7 = 1
    rel = [0.5 / (1 + EPS), 0.0, 1.0 / (4 + EPS), 1.0]
    assert metrics.mere(actual, golden) == pytest.approx(sum(rel) / 4, rel=1e-12)
    assert metrics.mare(actual, golden) == pytest.approx(1.0, rel=1e-12)
    assert metrics.rmse(actual, golden) == pytest.approx(math.sqrt((0.25 + 0 + 1 + 1e-14) / 4))
    assert metrics.mean_error(actual, golden) == pytest.approx((0.5 + 0 - 1 + 1e-7) / 4)


def test_per_head_by_hand():
    golden = torch.tensor([[[[3.0, 4.0]], [[1.0, 0.0]]]], dtype=torch.float64)  # (1, 2, 1, 2)
    actual = torch.tensor([[[[3.0, 4.0]], [[1.0, 1.0]]]], dtype=torch.float64)
    heads = metrics.per_head(actual, golden)
    assert heads["rel_rmse"] == [0.0, 1.0]               # head 1: |(0, 1)| / |(1, 0)|
    assert heads["max_abs"] == [0.0, 1.0]
    assert heads["bias"] == [0.0, 0.5]
    assert heads["cosine"][1] == pytest.approx(1 / math.sqrt(2))
    assert heads["mare"][1] == pytest.approx(1.0 / EPS)  # golden 0 at the wrong entry
    assert heads["nonfinite_pct"] == [0.0, 0.0]


def test_score_range_by_hand():
    q = torch.tensor([[[[100.0, 0.0], [0.0, 1.0]]]], dtype=torch.float16)   # (1, 1, 2, 2)
    k = torch.tensor([[[[700.0, 0.0], [0.0, -3.0]]]], dtype=torch.float16)
    out = metrics.score_range(q, k, scale=0.5)
    assert out["max_abs_qk"] == 70000.0 and out["exceeds_fp16"] is True
    assert out["max_abs_scaled"] == 35000.0
    small = metrics.score_range(q, k * 0.5, scale=0.5)
    assert small["max_abs_qk"] == 35000.0 and small["exceeds_fp16"] is False


@pytest.mark.parametrize("dtype,mere,mare,passed", [
    (torch.float16, 2 ** -11, 9 * 2 ** -10, True),
    (torch.float16, 2 ** -10, 2 ** -11, False),        # MERE must be strictly below 2^-10
    (torch.float16, 2 ** -11, 10 * 2 ** -10, False),   # MARE must be strictly below 10*2^-10
    (torch.bfloat16, 2 ** -8, 9 * 2 ** -7, True),      # would fail fp16, passes bf16
    (torch.bfloat16, 2 ** -7, 2 ** -8, False),
    (torch.float16, math.nan, 0.0, False),
])
def test_single_benchmark_thresholds(dtype, mere, mare, passed):
    verdict = standards.single_benchmark(mere, mare, dtype)
    assert verdict.passed is passed
    assert verdict.label == ("PASS" if passed else "FAIL")


def test_single_benchmark_from_outputs():
    """999 exact outputs and one golden 0 computed as 1e-9: relative error 1e-9 / 1e-7 = 0.01,
    above MARE's 10 * 2^-10 = 0.00977, while MERE = 0.01 / 1000 = 1e-5 is fine."""
    golden = torch.ones(1000, dtype=torch.float64)
    golden[-1] = 0.0
    actual = golden.clone()
    actual[-1] = 1e-9
    v = standards.single_benchmark(metrics.mere(actual, golden), metrics.mare(actual, golden),
                                   torch.float16)
    assert v.mere == pytest.approx(1e-5) and v.mare == pytest.approx(0.01)
    assert not v.passed and "MARE" in v.reason and "MERE" not in v.reason
    # every output 0.2% high: MERE = MARE = 0.002/(1 + 1e-7), above 2^-10, below 10 * 2^-10
    golden = torch.ones(1000, dtype=torch.float64)
    v = standards.single_benchmark(metrics.mere(golden * 1.002, golden),
                                   metrics.mare(golden * 1.002, golden), torch.float16)
    assert not v.passed and "MERE" in v.reason and "MARE" not in v.reason
    v = standards.single_benchmark(metrics.mere(golden * 1.002, golden),
                                   metrics.mare(golden * 1.002, golden), torch.bfloat16)
    assert v.passed   # bf16 limits: 2^-7 = 0.0078 and 0.078


def test_single_benchmark_rejects_other_dtypes():
    with pytest.raises(ValueError, match="float16 and bfloat16"):
        standards.single_benchmark(0.0, 0.0, torch.float32)


@pytest.mark.parametrize("candidate,third_party,level", [
    ((0.02, 0.012, 0.012), (0.01, 0.01, 0.01), "L2"),   # ratios 2, 1.2, 1.2: L2 exactly
    ((0.05, 0.01, 0.01), (0.01, 0.01, 0.01), "L1"),     # MARE ratio 5
    ((0.021, 0.01, 0.01), (0.01, 0.01, 0.01), "L1"),    # MARE ratio 2.1 > 2
    ((0.01, 0.015, 0.01), (0.01, 0.01, 0.01), "L1"),    # MERE ratio 1.5
    ((0.01, 0.01, 0.016), (0.01, 0.01, 0.01), "L0"),    # RMSE ratio 1.6 > 1.5
    ((0.1, 0.02, 0.02), (0.01, 0.01, 0.01), "L0"),      # 10, 2, 2
    ((0.11, 0.01, 0.01), (0.01, 0.01, 0.01), "FAIL"),   # MARE ratio 11
    ((0.01, 0.01, 0.021), (0.01, 0.01, 0.01), "FAIL"),  # RMSE ratio 2.1
    ((0.001, 0.001, 0.001), (0.01, 0.01, 0.01), "L2"),  # better than the third party
    ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), "L2"),           # both exact
    ((1e-9, 0.0, 0.0), (0.0, 0.0, 0.0), "FAIL"),        # third party exact, candidate not
    ((math.nan, 0.0, 0.0), (0.01, 0.01, 0.01), "FAIL"),
    ((0.01, 0.01, 0.01), (math.nan, 0.01, 0.01), "n/a"),
])
def test_dual_benchmark_levels(candidate, third_party, level):
    verdict = standards.dual_benchmark(candidate, third_party)
    assert verdict.level == level, verdict


def test_dual_benchmark_ratios_by_hand():
    verdict = standards.dual_benchmark((0.03, 0.004, 0.005), (0.01, 0.002, 0.004))
    assert verdict.ratios == pytest.approx((3.0, 2.0, 1.25))
    assert verdict.level == "L0"    # MERE ratio 2 is above L1's 1.5, within L0's 2


def _row(bias, ci, guard):
    return BiasRow("fa-fp16", "bfloat16", guard, 50, bias, ci, 0.0, 0.0, 100.0)


def test_bias_findings():
    assert "removed by it" in finding(_row(1e-3, 1e-5, False), _row(1e-6, 2e-6, True))
    text = finding(_row(1e-3, 1e-5, False), _row(2e-4, 1e-5, True))
    assert "NOT removed" in text and "5x smaller" in text
    assert "no significant bias with or without" in finding(_row(1e-6, 2e-6, False),
                                                            _row(1e-6, 2e-6, True))
    assert "the guard introduces one" in finding(_row(1e-6, 2e-6, False), _row(-4e-4, 2e-5, True))
    assert "3x LARGER with it" in finding(_row(-2e-4, 1e-5, False), _row(-6e-4, 2e-5, True))
