"""The resolution check (docs/design.md, "Overflow detection and repair"): a query row whose
shifted scores, or (the pseudo-average shift) whose recovered block offsets, reach
``numerics.RESOLUTION_LIMIT`` in some kv block is recomputed by fa-fp32, on every backend
here. How many rows it recomputes follows an fp64 oracle of the shifted scores and offsets;
on the large-amplitude case (N(0, 1) inputs at scale 128, op-plugin's FIA case) and on a
bias that queries and keys share every PASA allocation comes out within FIA's
high-precision criterion."""
from __future__ import annotations

import warnings

import pytest
import torch

import pasa_npu
from _support import BACKENDS, on_device, rel_rmse, skip_unsupported
from pasa_npu.numerics import RESOLUTION_LIMIT

PASA = ("pasa", "pasa-mixed", "pasa-exact")
#: rows whose oracle peak lies within this factor of the limit may go either way: the
#: kernels' shifted scores carry fp16 roundings, pasa's shift leaves (1 - beta) of the mean
MARGIN = 1.3
#: kv block sizes the backends use; the oracle must agree for all of them
BLOCKS = (32, 64, 128)


def ramp_inputs(batch: int, seq_q: int, seq_kv: int, loud_from: int, heads: int = 2,
                dim: int = 64, bias: float = 0.0, noise: float = 1.0, seed: int = 0):
    """BNSD fp16 (q, k, v): each query row ``-bias + noise * N(0, 1)`` scaled by its own factor
    on a geometric ramp from 0.3 to 300, keys ``bias + noise * N(0, 1)``, 8 times larger
    from key ``loud_from`` on (the largest scores sit in the last kv blocks), values
    N(0, 1). At scale 1 the rows' shifted scores run from a few units to thousands,
    across the limit."""
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    q = -bias + noise * torch.randn(batch, heads, seq_q, dim, generator=gen, dtype=f64)
    rows = batch * heads * seq_q
    ramp = torch.logspace(torch.log10(torch.tensor(0.3)), torch.log10(torch.tensor(300.0)),
                          rows, dtype=f64)
    ramp = ramp[torch.randperm(rows, generator=gen)].view(batch, heads, seq_q, 1)
    k = bias + noise * torch.randn(batch, heads, seq_kv, dim, generator=gen, dtype=f64)
    k[:, :, loud_from:] *= 8
    v = torch.randn(batch, heads, seq_kv, dim, generator=gen, dtype=f64)
    return (q * ramp).half(), k.half(), v.half()


def shifted_peaks(q, k, scale: float, block: int, beta: float = 1.0,
                  pseudo_average: bool = False) -> torch.Tensor:
    """fp64 oracle (B, N, Sq): per row, the largest |max_j (S_ij - beta * mean_j S_ij)| over
    its kv blocks of ``block`` keys (a part-filled last block: over its own keys), S the
    scaled scores; with ``pseudo_average`` also the largest block offset |beta * mean_j S_ij|
    (gamma times the shifted mean (1 - beta) * mean_j S_ij). No mask: every row sees every key."""
    s = torch.einsum("bnqd,bnkd->bnqk", q.double(), k.double()) * scale
    peaks = torch.zeros(s.shape[:-1], dtype=torch.float64)
    for j0 in range(0, s.shape[-1], block):
        blk = s[..., j0:j0 + block]
        offset = beta * blk.mean(-1, keepdim=True)
        peaks = torch.maximum(peaks, (blk - offset).amax(-1).abs())
        if pseudo_average:
            peaks = torch.maximum(peaks, offset.squeeze(-1).abs())
    return peaks


def expected_rows(q, k, scale: float, beta: float = 1.0,
                  pseudo_average: bool = False) -> tuple[int, int]:
    """(rows clearly past the limit, rows clearly short of it) for every block size."""
    peaks = torch.stack([shifted_peaks(q, k, scale, b, beta, pseudo_average) for b in BLOCKS])
    above = int((peaks.amin(0) >= RESOLUTION_LIMIT * MARGIN).sum())
    below = int((peaks.amax(0) <= RESOLUTION_LIMIT / MARGIN).sum())
    return above, below


def _assert_rows_recomputed(backend, algorithm, q, k, v, **kw):
    above, below = expected_rows(q, k, kw["scale"], kw.get("beta") or 1.0,
                                 pseudo_average=algorithm != "pasa-exact")
    rows = q.shape[0] * q.shape[1] * q.shape[2]
    assert above >= rows // 5 and below >= rows // 5, (above, below, rows)
    _, report = _run(backend, algorithm, q, k, v, **kw)
    assert report.checked
    assert above <= report.rows <= rows - below, (report.rows, above, rows - below)
    assert report.nonfinite_rows == 0


def _run(backend, algorithm, q, k, v, **kw):
    with skip_unsupported(backend), warnings.catch_warnings():
        warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
        out = pasa_npu.fused_attention(*on_device(backend, q, k, v), algorithm=algorithm,
                                       backend=backend, **kw)
    return out, pasa_npu.overflow_report()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", PASA)
@pytest.mark.parametrize("shape", ["prefill", "decode"])
def test_rows_past_the_limit_are_recomputed(backend, algorithm, shape):
    """The count of recomputed rows lies between the oracle's rows clearly past the limit
    and all rows but those clearly short of it; both kinds are present. The largest scores
    sit in the last kv blocks, so every block must count."""
    kw = dict(num_heads=2, input_layout="BNSD", scale=1.0)
    if shape == "prefill":  # three kv blocks of 128, the last part-filled
        q, k, v = ramp_inputs(1, 192, 320, loud_from=256)
    else:  # one query per batch entry, split kv
        q, k, v = ramp_inputs(12, 1, 1000, loud_from=768)
    _assert_rows_recomputed(backend, algorithm, q, k, v, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", ("pasa", "pasa-mixed"))
def test_negative_block_offsets_count(backend, algorithm):
    """The pseudo-average shift leaves (1 - beta) of a block's mean in S' and recovers the
    rest from it: with a large negative mean and a small spread, every shifted score of a
    row is negative, and the magnitude of the block offsets is what loses resolution."""
    beta = 1 - 2 ** -6
    q, k, v = ramp_inputs(1, 128, 256, loud_from=256, bias=1.0, noise=0.01)
    signed = torch.einsum("bnqd,bnkd->bnqk", q.double(), k.double())
    assert (signed.amax(-1) - beta * signed.mean(-1) < 0).all()  # the case is what it claims
    _assert_rows_recomputed(backend, algorithm, q, k, v, num_heads=2,
                            input_layout="BNSD", scale=1.0, beta=beta)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", PASA)
def test_shared_bias_meets_fia_high_precision(backend, algorithm):
    """Queries and keys sharing a bias of 30 (the README's quickstart), values N(0, 1), at
    scale 1/sqrt(d): the scores' block means are about 1e4. pasa and pasa-mixed recover that
    bias from fp16 block means, which gamma ~ 64 multiplies with their rounding: unchecked
    they miss FIA's 1e-3 by far, with nothing overflowing; checked, every row is recomputed
    and the output is within 1e-3 of the fp64 golden. pasa-exact carries the offset
    exactly: no row recomputed."""
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 2, 256, 128, generator=gen).add(30).half() for _ in range(2))
    v = torch.randn(1, 2, 256, 128, generator=gen).half()
    kw = dict(num_heads=2, input_layout="BNSD", scale=128 ** -0.5)
    golden, _ = pasa_npu.reference_attention(q, k, v, **kw)
    (checked, _), report = _run(backend, algorithm, q, k, v, **kw)
    if algorithm == "pasa-exact":
        assert report.checked and report.rows == 0
        return
    assert report.rows == 2 * 256
    assert rel_rmse(checked.cpu(), golden) < 1e-3
    (unchecked, _), _ = _run(backend, algorithm, q, k, v, repair_overflow=False, **kw)
    assert torch.isfinite(unchecked).all()
    assert rel_rmse(unchecked.cpu(), golden) > 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", PASA)
def test_large_amplitude_meets_fia_high_precision(backend, algorithm):
    """N(0, 1) fp16 inputs at scale 128: unchecked, every PASA allocation misses FIA's 1e-3
    (nothing overflows; fp16 scores of thousands cannot resolve the softmax); checked, the rows
    are recomputed and the output is within 1e-3 of the fp64 golden."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 256, 128, generator=gen).half() for _ in range(3))
    kw = dict(num_heads=2, input_layout="BNSD", scale=128.0)
    golden, _ = pasa_npu.reference_attention(q, k, v, **kw)
    (checked, _), report = _run(backend, algorithm, q, k, v, **kw)
    assert report.rows > 0
    assert rel_rmse(checked.cpu(), golden) < 1e-3
    (unchecked, _), _ = _run(backend, algorithm, q, k, v, repair_overflow=False, **kw)
    assert torch.isfinite(unchecked).all()
    assert rel_rmse(unchecked.cpu(), golden) > 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", PASA)
def test_ordinary_scores_trigger_nothing(backend, algorithm):
    """N(0, 1) inputs at the usual scale 1/sqrt(d): no row recomputed."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 256, 128, generator=gen).half() for _ in range(3))
    _, report = _run(backend, algorithm, q, k, v, num_heads=2, input_layout="BNSD",
                     scale=128 ** -0.5)
    assert report.checked and report.rows == 0
