"""No NaN from finite inputs: PASA's part-filled last kv block, the overflow check and its
fa-fp32 repair, and non-finite inputs, on every backend here (docs/design.md, "Overflow
detection and repair")."""
from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import pytest
import torch

import pasa_npu
from _support import (BACKENDS, assert_measured, device_kind, dtype_name, interpreter_skip,
                      on_device, rel_rmse, skip_unsupported)
from _paged import _block_table, paged_cache
from pasa_npu.tools.inputs import resonance

GOLDEN_FACTOR = 1.5  # as the golden matrix's (tests/test_golden.py)


def _within_measured(err, backend, dtype, algorithm, family):
    """Relative RMSE within 1.5x the measured (tests/measured.json)."""
    key = f"{device_kind(backend)}/{dtype_name(dtype)}/{algorithm}/{family}"
    assert_measured(err, "golden-rmse", key, GOLDEN_FACTOR, family)


PASA = ("pasa", "pasa-mixed", "pasa-exact")
B, N, S, D = 1, 2, 160, 32  # 160 keys: one full kv block and a part-filled one of 32
SPREAD = 1.05e5  # the scaled scores' magnitude on the overflowing rows: beyond fp16's 65504


def spread_inputs(rows: str, dtype=torch.float16, seed: int = 0, scale: float | None = None):
    """BNSD (q, k, v) whose scores' spread within a kv block exceeds fp16's range on the
    query ``rows`` ("first-tile": the first 48 rows, inside one query tile; "all": every
    row), and the scale: 1/sqrt(D), or ``scale`` (1.0: torch_npu's default).

    Every key's first component is +c or -c (random signs), the others N(0, 1); those rows'
    queries have 3e4 there (inside fp16's range), so that their scaled scores are
    +-1.05e5 (c = 3.5 at scale 1): a block's mean removes neither sign, its fp16 scores
    overflow, fp32 holds them. Their other components are normal with a standard deviation
    that makes the scaled scores of the keys of one sign differ by about 1.5: the softmax of
    such a row spreads over several keys (not one: the repair's accuracy is measurable). The
    other rows are N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    scale = 1 / math.sqrt(D) if scale is None else scale
    q = torch.randn(B, N, S, D, generator=gen)
    k = torch.randn(B, N, S, D, generator=gen)
    v = torch.randn(B, N, S, D, generator=gen)
    big = slice(0, 48) if rows == "first-tile" else slice(0, S)
    sign = torch.randint(0, 2, (B, N, S), generator=gen) * 2.0 - 1.0
    k[..., 0] = sign * SPREAD / (3e4 * scale)
    q[:, :, big] *= 1.5 / (scale * math.sqrt(D - 1))
    q[:, :, big, 0] = 3e4
    return q.to(dtype), k.to(dtype), v.to(dtype), scale


def attend(q, k, v, algorithm, backend, scale, **kw):
    q, k, v = on_device(backend, q, k, v)
    if "atten_mask" in kw:
        kw["atten_mask"] = on_device(backend, kw["atten_mask"])[0]
    with skip_unsupported(backend):
        out, lse = pasa_npu.fused_attention(q, k, v, num_heads=N, input_layout="BNSD",
                                            scale=scale, algorithm=algorithm, backend=backend,
                                            softmax_lse_flag=True, **kw)
    return out.cpu(), lse.cpu()


def fa_fp32_error(q, k, v, backend, scale, ref, rows=None) -> float:
    """fa-fp32's relative error against ``ref`` on ``rows`` (None: all): the larger of the
    torch backend's and ``backend``'s own where it runs fa-fp32 on these inputs (with scores
    near 1e5, fp32 sums in another order move them by a unit of 0.008)."""
    errors = []
    for name in {"torch", backend}:
        if interpreter_skip(name, "fa-fp32", q.dtype):
            continue
        out, _ = attend(q, k, v, "fa-fp32", name, scale)
        errors.append(rel_rmse(out, ref) if rows is None else rel_rmse(out[rows], ref[rows]))
    return max(errors)


def golden(q, k, v, scale, **kw):
    return pasa_npu.reference_attention(q, k, v, num_heads=N, input_layout="BNSD", scale=scale,
                                        softmax_lse_flag=True, **kw)[0]


def _bad_rows(out: torch.Tensor) -> torch.Tensor:
    return ~torch.isfinite(out.float()).all(-1)


# ------------------------------------------------------------------ part-filled last block

# A common key bias of |q.bias| ~ 1000 (unscaled) on 160 keys: the bound is 1.5x the
# measured error; a last block shifted by a mean that counts its padded rows measures 0.15,
# 0.15 and 6.2e-3 (pasa, pasa-mixed, pasa-exact), several times that.


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", PASA)
def test_part_filled_last_block_is_shifted_by_its_keys_mean(backend, algorithm):
    """The last kv block holds 32 keys of 128: its shift must remove the key bias as a full
    block's does, its mean taken over its own keys (its padded rows do not count). Checked
    with the repair off."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(B, N, 1, D, generator=gen).expand(B, N, 40, D).clone()
    q += 0.1 * torch.randn(B, N, 40, D, generator=gen)
    k = torch.randn(B, N, S, D, generator=gen) + 1e3 / D * q[:, :, :1].sign()
    v = torch.randn(B, N, S, D, generator=gen)
    q, k, v = q.half(), k.half(), v.half()
    scale = 1 / math.sqrt(D)
    out, _ = attend(q, k, v, algorithm, backend, scale, repair_overflow=False)
    assert not pasa_npu.overflow_report().checked
    _within_measured(rel_rmse(out, golden(q, k, v, scale)), backend, torch.float16, algorithm,
                     "part-filled-bias")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", PASA)
def test_part_filled_last_block_does_not_overflow(backend, algorithm):
    """The resonance case (scaled scores ~3e4, a bias that drifts from block to block) on
    160 keys: finite and within the golden bound with the repair off (a last block whose
    mean counts its padded rows keeps most of the bias in fp16 and overflows)."""
    q, k, v = resonance((B, N, S, D), 3e4, seed=0)
    scale = 1 / math.sqrt(D)
    out, _ = attend(q, k, v, algorithm, backend, scale, repair_overflow=False)
    assert torch.isfinite(out).all()
    _within_measured(rel_rmse(out, golden(q, k, v, scale)), backend, torch.float16, algorithm,
                     "part-filled-resonance")


# ------------------------------------------------------------------ overflow and repair

CASES = {  # name -> (rows, dtype, scale)
    "some-tiles": ("first-tile", torch.float16, None),
    "all-tiles": ("all", torch.float16, None),
    "scale-1": ("first-tile", torch.float16, 1.0),
    "bf16": ("first-tile", torch.bfloat16, None),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", PASA)
@pytest.mark.parametrize("case", list(CASES))
def test_overflow_is_repaired(case, algorithm, backend):
    """Scores whose spread exceeds fp16: unchecked, PASA's rows there are not finite; checked,
    they are recomputed by fa-fp32, the report counts them, and every other row is bit for
    bit the unchecked result. The recomputed rows are fa-fp32's: within 1.5x fa-fp32's error
    on them (:func:`fa_fp32_error`), and for fp16 inputs on the torch backend bit for bit its
    fa-fp32 result. ascendc-emu's rows, which the API layer repairs by the torch backend on
    the flagged rows alone, are held to that error only: torch's matmuls over fewer rows sum
    in another order on some CPUs, and at these rows' scores (about 1e5) an fp32 ulp of a
    score moves its weight by about 1%, so no bound in output ulps holds between the two."""
    rows, dtype, scale = CASES[case]
    q, k, v, scale = spread_inputs(rows, dtype, scale=scale)
    checked = _checked_against_unchecked(q, k, v, algorithm, backend, scale)
    out, lse, overflowed = checked.out, checked.lse, checked.overflowed
    q_block = pasa_npu.DEFAULT_TILING.q_block
    per_tile = torch.nn.functional.pad(overflowed, (0, -S % q_block)).view(B, N, -1, q_block)
    assert checked.report.tiles == int(per_tile.any(-1).sum())
    if dtype == torch.float16 and backend == "torch":
        fa32, fa32_lse = attend(q, k, v, "fa-fp32", "torch", scale)
        assert torch.equal(out[overflowed], fa32[overflowed])
        assert torch.equal(lse[overflowed], fa32_lse[overflowed])
    _within_measured(checked.err, backend, dtype, algorithm, f"overflow-{case}-repaired-rows")
    _within_measured(rel_rmse(out, checked.ref), backend, dtype, algorithm, f"overflow-{case}")


class Checked(NamedTuple):
    out: torch.Tensor
    lse: torch.Tensor
    overflowed: torch.Tensor  # the rows the unchecked call left non-finite
    report: pasa_npu.OverflowReport
    raw_lse: torch.Tensor  # the unchecked call's
    ref: torch.Tensor  # the fp64 golden
    err: float  # the recomputed rows' relative RMSE against it


def _checked_against_unchecked(q, k, v, algorithm, backend, scale):
    """The call unchecked, then checked: some rows of the unchecked result are not finite;
    checked, the report counts them (none still non-finite), every output and LSE is
    finite, the recomputed rows are within 1.5x fa-fp32's error on them
    (:func:`fa_fp32_error`) and every other row is bit for bit the unchecked result."""
    raw, raw_lse = attend(q, k, v, algorithm, backend, scale, repair_overflow=False)
    overflowed = _bad_rows(raw)
    assert overflowed.any(), "the generator must overflow PASA's fp16 arithmetic"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
        out, lse = attend(q, k, v, algorithm, backend, scale)
        report = pasa_npu.overflow_report()
        assert report.checked and report.algorithm == algorithm
        assert report.rows == int(overflowed.sum()) and report.nonfinite_rows == 0
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    ref = golden(q, k, v, scale)
    err = rel_rmse(out[overflowed], ref[overflowed])
    assert err <= GOLDEN_FACTOR * fa_fp32_error(q, k, v, backend, scale, ref, overflowed)
    assert torch.equal(out[~overflowed], raw[~overflowed])
    assert torch.equal(lse[~overflowed], raw_lse[~overflowed])
    return Checked(out, lse, overflowed, report, raw_lse, ref, err)


def test_repair_warns_once(monkeypatch):
    """The first report that finds a repaired row warns, suggesting the scale or the
    allocation, attributed to the caller's code (not the package's); later ones do not."""
    from pasa_npu import overflow
    monkeypatch.setattr(overflow, "_WARNED", [False])
    q, k, v, scale = spread_inputs("first-tile")
    with pytest.warns(pasa_npu.OverflowRepairWarning, match="scale") as record:
        attend(q, k, v, "pasa", "torch", scale)
        assert pasa_npu.overflow_report().rows > 0
    assert [w.filename for w in record] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error", pasa_npu.OverflowRepairWarning)
        attend(q, k, v, "pasa", "torch", scale)
        assert pasa_npu.overflow_report().rows > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", PASA)
def test_decode_overflow_is_repaired(algorithm, backend):
    """Decode (one query row, the Triton split kernel and its merge): the same repair."""
    q, k, v, scale = spread_inputs("all", scale=1.0)
    q = q[:, :, :1].contiguous()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
        out, lse = attend(q, k, v, algorithm, backend, scale)
        assert pasa_npu.overflow_report().rows == N
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    ref = golden(q, k, v, scale)
    assert rel_rmse(out, ref) <= GOLDEN_FACTOR * fa_fp32_error(q, k, v, backend, scale, ref)
    _within_measured(rel_rmse(out, ref), backend, torch.float16, algorithm, "overflow-decode")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", ["pasa", "pasa-exact"])
@pytest.mark.parametrize("queries", [S, 1], ids=["prefill", "decode"])
def test_output_overflow_is_repaired(queries, algorithm, backend):
    """Finite inputs whose P'V exceeds fp16 where the scores do not: V = 5000 |N(0, 1)|
    (below 2.2e4), Q and K N(0, 1). pasa's fp16 accumulator and pasa-exact's fp16 P'V tile
    overflow on most rows, and only the test of the output finds them, as the statistics
    stay finite (pasa-mixed keeps P'V and its accumulator in fp32: its output never exceeds
    max |V|). The flagged rows are recomputed by fa-fp32: every output row is finite,
    the report counts them, the others are bit for bit the unchecked result."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, N, queries, D, generator=gen).half()
    k = torch.randn(B, N, S, D, generator=gen).half()
    v = (torch.randn(B, N, S, D, generator=gen).abs() * 5000).half()
    checked = _checked_against_unchecked(q, k, v, algorithm, backend, 1 / math.sqrt(D))
    assert torch.isfinite(checked.raw_lse).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", PASA)
@pytest.mark.parametrize("queries, block_size", [(1, 16), (1, 128), (S, 128)],
                         ids=["decode-16", "decode-128", "prefill-128"])
def test_paged_overflow_is_repaired(queries, block_size, algorithm, backend):
    """Paged KV (shuffled physical blocks, the caches' unused rows NaN): the repair reads K
    and V through the block table. Every row is finite; the report counts the
    contiguous call's rows, and the repaired rows are that call's, bit for bit."""
    q, k, v, scale = spread_inputs("all" if queries == 1 else "first-tile", scale=1.0)
    q = q[:, :, :queries].contiguous()
    kw = dict(actual_seq_lengths=[queries], actual_seq_lengths_kv=[S])
    if queries > 1:
        kw.update(sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask())
    table, num_blocks = _block_table([-(-S // block_size)], [], torch.Generator().manual_seed(3))
    k_cache, v_cache = (paged_cache(t, [S], table, block_size, num_blocks) for t in (k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
        dense, dense_lse = attend(q, k, v, algorithm, backend, scale, **kw)
        repaired = pasa_npu.overflow_report().rows
        out, lse = attend(q, k_cache, v_cache, algorithm, backend, scale, block_size=block_size,
                          block_table=on_device(backend, table)[0], **kw)
        assert repaired > 0 and pasa_npu.overflow_report().rows == repaired
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    unchecked, _ = attend(q, k, v, algorithm, backend, scale, repair_overflow=False, **kw)
    overflowed = _bad_rows(unchecked)
    assert torch.equal(out[overflowed], dense[overflowed])
    assert torch.equal(lse[overflowed], dense_lse[overflowed])


def test_report_of_unchecked_allocations():
    """fa-* allocations are never checked; the report says so rather than counting 0."""
    q, k, v, scale = spread_inputs("first-tile")
    attend(q, k, v, "fa-fp32", "torch", scale)
    report = pasa_npu.overflow_report()
    assert not report.checked and report.rows == 0 and "not checked" in str(report)


def test_repair_overflow_must_be_bool():
    q, k, v, scale = spread_inputs("first-tile")
    with pytest.raises(TypeError, match="repair_overflow must be a bool, got"):
        attend(q, k, v, "pasa", "torch", scale, repair_overflow=1)


# ------------------------------------------------------------------ non-finite inputs

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", list(pasa_npu.ALLOCATIONS))
@pytest.mark.parametrize("where", ["q", "k-nan", "k-inf", "v"])
@pytest.mark.parametrize("queries", [S, 1], ids=["prefill", "decode"])
def test_nonfinite_inputs_affect_the_rows_fa_fp32_does(queries, where, algorithm, backend):
    """One NaN or inf in Q, K or V: non-finite output rows exactly where the torch
    backend's fa-fp32 has them (in decode, the fp64 golden's); a bad key does not
    spread through its block's mean to queries that do not see it. Prefill: causal, the
    bad element at position 150. Decode: 160 keys (on the Triton backend, several kv
    splits merged by their LSE), the bad key or value at 150, its query's component
    positive (an inf key gives a +inf score)."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(B, N, queries, D, generator=gen).half()
    k, v = (torch.randn(B, N, S, D, generator=gen).half() for _ in range(2))
    kw = dict(sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask()) if queries > 1 else {}
    if queries == 1:
        q[..., 3] = q[..., 3].abs()
    bad = float("inf") if where == "k-inf" else float("nan")
    if where == "q":
        q[0, 0, min(150, queries - 1), 3] = bad
    else:
        {"k-nan": k, "k-inf": k, "v": v}[where][0, 0, 150, 3] = bad
    scale = 1 / math.sqrt(D)
    ref, ref_lse = attend(q, k, v, "fa-fp32", "torch", scale, **kw)
    if queries == 1:  # the golden's P.V multiplies masked-out values by 0 (NaN . 0 = NaN)
        assert torch.equal(_bad_rows(ref), _bad_rows(golden(q, k, v, scale)))
    assert _bad_rows(ref).any() and not _bad_rows(ref).all()
    out, lse = attend(q, k, v, algorithm, backend, scale, **kw)
    assert torch.equal(_bad_rows(out), _bad_rows(ref))
    assert torch.equal(torch.isfinite(lse), torch.isfinite(ref_lse))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", PASA)
def test_decode_nonfinite_split_that_does_not_merge(algorithm, backend):
    """Decode over two kv splits (Triton) whose first holds a NaN value at key 5: the
    split that merges the rows is not the one that saw it (in the interpreter, which runs
    the splits in order, never), yet the row is flagged and non-finite exactly where the
    golden's is, and the report counts it. A second call on clean values, at the same
    shapes, finds every row finite and flags none."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(B, N, 1, D, generator=gen).half()
    k, v = (torch.randn(B, N, S, D, generator=gen).half() for _ in range(2))
    bad_v = v.clone()
    bad_v[0, 1, 5, 7] = float("nan")
    scale = 1 / math.sqrt(D)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
        out, lse = attend(q, k, bad_v, algorithm, backend, scale)
        assert pasa_npu.overflow_report().nonfinite_rows == 1
    ref = golden(q, k, bad_v, scale)
    assert torch.equal(_bad_rows(out), _bad_rows(ref)) and _bad_rows(ref).sum() == 1
    out, lse = attend(q, k, v, algorithm, backend, scale)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert pasa_npu.overflow_report().rows == 0
    _within_measured(rel_rmse(out, golden(q, k, v, scale)), backend, torch.float16,
                     algorithm, "decode")
