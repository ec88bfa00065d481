"""examples/high_precision.py: what docs/design.md, "High precision", reads from its table,
held at a smaller shape than the example's (1, 2, 256, 128) so that it runs in seconds."""
from __future__ import annotations

import pytest

from test_overflow_demo import _example  # tests/examples/ is on the path, as pytest imports


@pytest.fixture(scope="module")
def results():
    return _example("high_precision").measure((1, 2, 256, 128))


def test_fa_fp32_meets_fia_high_precision_everywhere(results):
    for (_, algorithm), (within, lse_rel, recomputed) in results.items():
        if algorithm == "fa-fp32":
            assert within > 0.9999 and lse_rel < 1e-4 and recomputed is None


def test_pasa_keeps_its_fp16_error_below_the_check_limit(results):
    """At 1/√d and at scale 8 the check recomputes nothing; at 1/√d nearly every output is
    within 1e-3 but pasa's LSE misses 1e-4; at scale 8 both PASA allocations miss 1e-3 on a share of
    the outputs."""
    for algorithm in ("pasa-exact", "pasa"):
        assert results["scale 1/√d", algorithm][0] > 0.999
        assert results["scale 1/√d", algorithm][2] == 0.0
        assert results["scale 8", algorithm][0] < 0.95
        assert results["scale 8", algorithm][2] == 0.0
    assert results["scale 1/√d", "pasa"][1] > 1e-4


def test_the_check_recomputes_every_row_at_scale_128(results):
    """Check on: every row recomputed by fa-fp32, so the figures are fa-fp32's own; check off:
    fewer outputs within 1e-3 and the LSE beyond 1e-4."""
    fa = results["scale 128", "fa-fp32"]
    for algorithm in ("pasa-exact", "pasa"):
        within, lse_rel, recomputed = results["scale 128", algorithm]
        assert recomputed == 1.0 and (within, lse_rel) == fa[:2]
        within_off, lse_off, recomputed_off = results["scale 128, check off", algorithm]
        assert recomputed_off is None and within_off < fa[0] and lse_off > 1e-4


def test_a_shared_bias_is_recomputed_for_pasa_only(results):
    """Q and K sharing a bias of 30: pasa recovers the block offsets (about 1e4) from fp16
    block means and the check recomputes every row, giving fa-fp32's figures; with the
    check off more than a tenth of its outputs miss 1e-3 and its LSE misses 1e-4. pasa-exact
    carries the offsets in fp32: nothing recomputed, nine outputs in ten within 1e-3."""
    within, lse_rel, recomputed = results["Q, K bias 30", "pasa"]
    assert recomputed == 1.0 and (within, lse_rel) == results["Q, K bias 30", "fa-fp32"][:2]
    within_off, lse_off, recomputed_off = results["Q, K bias 30, check off", "pasa"]
    assert recomputed_off is None and within_off < 0.9 and lse_off > 1e-4
    within, _, recomputed = results["Q, K bias 30", "pasa-exact"]
    assert recomputed == 0.0 and within > 0.9


def test_a_shared_bias_below_the_limit_keeps_pasas_fp16_error(results):
    """Q and K sharing a bias of 5: pasa's block offsets (block means near 280) stay below
    the check's limit of 512, so nothing is recomputed and pasa returns its fp16 error, that
    of an offset known to fp16's spacing there (1/4): most outputs miss 1e-3 and its LSE
    misses 1e-4. pasa-exact, with the offsets in fp32, keeps most within 1e-3."""
    within, lse_rel, recomputed = results["Q, K bias 5", "pasa"]
    assert recomputed == 0.0 and within < 0.5 and lse_rel > 1e-4
    within, _, recomputed = results["Q, K bias 5", "pasa-exact"]
    assert recomputed == 0.0 and within > 0.8
