"""The AscendC kernels' resolution check under the CPU emulation (backend "ascendc-emu"):
besides the rows whose output or LSE is not finite, a checked call of a shifted allocation
flags the rows whose block row maximum of the fp16 shifted scores S' reaches
``pasa_npu.numerics.RESOLUTION_LIMIT`` in magnitude in some kv block they see, and the repair
launch recomputes them by fa-fp32 (docs/design.md, "Overflow detection and repair"). Nothing
overflows in these cases: fp16 S' simply cannot resolve the softmax (N(0, 1) inputs at softmax
scale 128 put the unrepaired output off by 2e-2 to 1e-1 in relative RMSE).

Paths: a prefill on the model's cores (one task per core), on few cores (several tasks per
core, the statistics of two tasks in flight), decode with split kv (each split sees some
blocks only; a split that lost resolution marks its partial and the merge flags the row),
decode on one core (one long task), and rows that see no key of some blocks (their masked
maxima must not count)."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import pasa_npu
from pasa_npu import overflow
from pasa_npu.kernel_inputs import TILING_KEYS
from pasa_npu.numerics import RESOLUTION_LIMIT

emu = pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")
from pasa_npu import ascendc_emu  # noqa: E402

ALGORITHMS = ("pasa", "pasa-mixed", "pasa-exact")
SHARP = 128.0             # softmax scale at which fp16 S' of N(0, 1) inputs (D = 128) loses resolution
MODERATE = 128.0 ** -0.5  # 1 / sqrt(D): S' of a few units
TOLERANCE = 1e-3          # relative RMSE of a repaired output against the fp64 golden
D = 128


def _kernels_run(algorithm: str) -> None:
    """Skip the allocations the AscendC kernels do not implement (pasa-mixed: the backend
    refuses it with NotImplementedError; a kernel implementation must then pass these tests)."""
    if algorithm not in TILING_KEYS:
        with pytest.raises(NotImplementedError, match="ascendc-emu"):
            q = torch.zeros(1, 1, 16, D, dtype=torch.float16)
            pasa_npu.fused_attention(q, q, q, num_heads=1, input_layout="BNSD",
                                     algorithm=algorithm, backend="ascendc-emu")
        pytest.skip(f"the AscendC kernels do not implement {algorithm}")


def _inputs(b, n, s_q, s_kv, seed=0, n_kv=None):
    gen = torch.Generator().manual_seed(seed)
    n_kv = n if n_kv is None else n_kv
    q = torch.randn(b, n, s_q, D, generator=gen).half()
    k = torch.randn(b, n_kv, s_kv, D, generator=gen).half()
    v = torch.randn(b, n_kv, s_kv, D, generator=gen).half()
    return q, k, v


def _call(q, k, v, algorithm, scale, repair=True, cores=None, **kw):
    """(out, lse, report counts (rows, nonfinite rows), emulation stats) of one BNSD call."""
    kw = dict(num_heads=q.shape[1], input_layout="BNSD", scale=scale, algorithm=algorithm,
              backend="ascendc-emu", repair_overflow=repair, softmax_lse_flag=True, **kw)
    if q.shape[1] != k.shape[1]:
        kw["num_key_value_heads"] = k.shape[1]
    params = ascendc_emu.model_parameters()
    if cores is not None:
        params["core_num"] = cores
    with warnings.catch_warnings(), ascendc_emu.using_model_parameters(params):
        warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
        out, lse = pasa_npu.fused_attention(q, k, v, **kw)
        report = pasa_npu.overflow_report()
        counts = (report.rows, report.nonfinite_rows)
    return out, lse, counts, ascendc_emu.last_run_stats()


def _rmse(out, q, k, v, scale, **kw):
    """Relative RMSE of ``out`` against the fp64 golden."""
    kw.pop("kv_block", None)  # the golden is not blocked
    if q.shape[1] != k.shape[1]:
        kw["num_key_value_heads"] = k.shape[1]
    gold = pasa_npu.reference_attention(q, k, v, num_heads=q.shape[1], input_layout="BNSD",
                                        scale=scale, **kw)[0]
    return float((out.double() - gold).norm() / gold.norm())


def _assert_repaired(q, k, v, algorithm, scale, rows=None, cores=None, raw_fails=True, **kw):
    """The checked call repairs ``rows`` rows (all by default), none left non-finite, and is
    within TOLERANCE of the golden; the unchecked call, in which nothing overflows, is finite
    and (``raw_fails``) not within 10 x TOLERANCE: the check is what makes the difference.
    Returns the checked call's stats."""
    out, _, counts, stats = _call(q, k, v, algorithm, scale, cores=cores, **kw)
    rows = q.shape[0] * q.shape[1] * q.shape[2] if rows is None else rows
    assert counts == (rows, 0), counts
    assert (stats["repair"] is not None) != stats["tiling"]["repair_in_launch"]  # one of the two
    err = _rmse(out, q, k, v, scale, **kw)
    assert err < TOLERANCE, f"{algorithm}: repaired output's relative RMSE {err:.3g}"
    raw, raw_lse, raw_counts, _ = _call(q, k, v, algorithm, scale, repair=False, cores=cores, **kw)
    assert raw_counts == (0, 0) and torch.isfinite(raw).all() and torch.isfinite(raw_lse).all()
    raw_err = _rmse(raw, q, k, v, scale, **kw)
    assert raw_err > 10 * TOLERANCE or not raw_fails, \
        f"{algorithm}: the unrepaired output is already accurate ({raw_err:.3g})"
    return stats


def test_the_limit_reaches_the_kernels_through_the_tiling():
    """One definition: the tiling carries pasa_npu.numerics.RESOLUTION_LIMIT, for checked calls
    of the shifted allocations only."""
    params = dict(tiling_key=TILING_KEYS["pasa"], batch=1, num_heads=1, num_kv_heads=1, seq_q=16,
                  seq_kv=256, head_dim=D, head_dim_v=D, q_layout=0, kv_layout=0, out_layout=0,
                  out_dtype=0, mask_mode=0, scale=1.0, beta=-1.0, q_block=128, kv_block=128,
                  core_num=24, resolution_limit=RESOLUTION_LIMIT)
    for key, checked, want in [("pasa", 1, RESOLUTION_LIMIT), ("pasa-exact", 1, RESOLUTION_LIMIT),
                               ("pasa", 0, 0.0), ("fa-fp32", 1, 0.0)]:
        tiling = emu.tiling(dict(params, tiling_key=TILING_KEYS[key], overflow_check=checked))
        assert tiling["resolution_limit"] == want, (key, checked)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_prefill_rows_that_lost_resolution_are_repaired(algorithm):
    """(1, 2, 512, 128) N(0, 1) at scale 128: every row's S' reaches thousands, every row is
    flagged and recomputed by fa-fp32, within 1e-3 of the golden (2e-2 to 1e-1 without)."""
    _kernels_run(algorithm)
    q, k, v = _inputs(1, 2, 512, 512)
    stats = _assert_repaired(q, k, v, algorithm, SHARP)
    assert stats["merge"] is None and stats["tiling"]["kv_splits"] == 1


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_moderate_scale_flags_no_row(algorithm):
    """The same inputs at scale 1/sqrt(D): no row flagged, and the checked output is the
    unchecked one bit for bit."""
    _kernels_run(algorithm)
    q, k, v = _inputs(1, 2, 512, 512)
    out, lse, counts, stats = _call(q, k, v, algorithm, MODERATE)
    assert counts == (0, 0)
    assert stats["repair"] is None and stats["tiling"]["repair_in_launch"]
    raw, raw_lse, _, raw_stats = _call(q, k, v, algorithm, MODERATE, repair=False)
    assert stats["attention"]["mmad_calls"] == raw_stats["attention"]["mmad_calls"]  # no repair work
    assert torch.equal(out, raw) and torch.equal(lse, raw_lse)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_rows_without_keys_in_a_block_are_not_flagged(algorithm):
    """Causal, kv_block 64 under 128-row tiles: rows 0-63 of a tile see no key of its second
    block, whose masked row maxima (fp16 -65504, fp32 -3e38) must not count. Nothing flagged
    at scale 1/sqrt(D); at scale 128 nearly every row repaired (the first rows see a key or
    two, whose S' may stay below the limit: nothing to resolve there), within 1e-3."""
    _kernels_run(algorithm)
    q, k, v = _inputs(1, 2, 256, 256, seed=1)
    kw = dict(sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask(), kv_block=64)
    _, _, counts, _ = _call(q, k, v, algorithm, MODERATE, **kw)
    assert counts == (0, 0)
    out, _, counts, _ = _call(q, k, v, algorithm, SHARP, **kw)
    rows = q.shape[1] * q.shape[2]
    assert rows - 8 <= counts[0] <= rows and counts[1] == 0, counts
    assert _rmse(out, q, k, v, SHARP, **kw) < TOLERANCE


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_more_tasks_than_cores(algorithm):
    """The prefill on 3 AI Cores: 8 tasks, several a core, two in flight on each vector core
    (each keeps its own peak)."""
    _kernels_run(algorithm)
    q, k, v = _inputs(1, 2, 512, 512, seed=2)
    stats = _assert_repaired(q, k, v, algorithm, SHARP, cores=3)
    tiling = stats["tiling"]
    assert tiling["num_tasks"] > tiling["block_dim"] and tiling["kv_splits"] == 1, tiling


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("cores", [None, 1], ids=["split-kv", "one-core"])
def test_decode(algorithm, cores):
    """Decode, one query per batch against 2048 keys (16 blocks), GQA 4:2, N(0, 1) at scale
    128: on the model's cores the host splits the kv range and the merge flags the rows whose
    splits marked them; on one core each task runs its 16 blocks in one go. Every row is
    repaired, within 1e-3. (A decode row's softmax is one-hot on its top key here, which fp16
    S' still finds: the unrepaired error shows on the many rows of a prefill, where some top
    two keys come within fp16's spacing, and on the near ties of test_split_kv_*.)"""
    _kernels_run(algorithm)
    q, k, v = _inputs(2, 4, 1, 2048, seed=3, n_kv=2)
    stats = _assert_repaired(q, k, v, algorithm, SHARP, cores=cores, raw_fails=False)
    split = stats["tiling"]["kv_splits"] > 1
    assert split == (cores is None), stats["tiling"]


def _near_ties(q, k, keys: slice, level: float, scale: float):
    """q and k (copies) such that each query scores the keys of ``keys`` at about +-``level``
    (their first component +-16, random signs; the query's 16 * scale * q0 = level), spread
    by about 1.5 among the keys of one sign (the other components): the softmax rests on the
    ~half of those keys at +level, whose fp16 S' (spacing 0.5 to 1 above 512) cannot resolve
    such differences. The other keys keep N(0, 1) components, their scores within +-300."""
    gen = torch.Generator().manual_seed(7)
    q, k = q.float().clone(), k.float().clone()
    n = k[:, :, keys].shape[2]
    k[:, :, keys, 0] = 16.0 * (torch.randint(0, 2, (k.shape[0], k.shape[1], n), generator=gen) * 2.0 - 1.0)
    q[..., 1:] *= 1.5 / (scale * math.sqrt(D - 1))
    q[..., 0] = level / (16.0 * scale)
    return q.half(), k.half()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("where", ["first", "last"])
def test_split_kv_one_split_lost_resolution(algorithm, where):
    """Decode with split kv where only the first (or the last) of 3 kv ranges holds the large
    scores (near ties at about 1000, test _near_ties; S' row maxima of ~1000 there, ~300 at most
    elsewhere), 2 tasks in 3 ranges on 3 AI Cores (units outnumber cores): the one split's mark
    reaches the merge, every row is repaired and within 1e-3 of the golden, the unrepaired
    output is not. At about 300 instead (S' below the limit), no row is flagged and the
    checked output is the unchecked one bit for bit."""
    _kernels_run(algorithm)
    q, k, v = _inputs(1, 2, 1, 3072, seed=4)
    keys = slice(0, 256) if where == "first" else slice(-256, None)
    sharp_q, sharp_k = _near_ties(q, k, keys, 1000.0, MODERATE)
    stats = _assert_repaired(sharp_q, sharp_k, v, algorithm, MODERATE, cores=3)
    tiling = stats["tiling"]
    assert tiling["kv_splits"] == 3, tiling
    assert tiling["num_tasks"] * tiling["kv_splits"] > tiling["block_dim"], tiling
    mild_q, mild_k = _near_ties(q, k, keys, 300.0, MODERATE)
    out, lse, counts, stats = _call(mild_q, mild_k, v, algorithm, MODERATE, cores=3)
    assert counts == (0, 0) and stats["tiling"]["kv_splits"] == 3
    raw, raw_lse, _, _ = _call(mild_q, mild_k, v, algorithm, MODERATE, repair=False, cores=3)
    assert torch.equal(out, raw) and torch.equal(lse, raw_lse)


def _row_flags(q, k, v, algorithm, scale, **kw):
    """The row flags a checked call left (ROW_* values, (B, N, S))."""
    seen = []
    real = overflow.record

    def keep(problem, backend):
        seen.append(problem.overflow.row_flags.clone())
        real(problem, backend)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(overflow, "record", keep)
        _call(q, k, v, algorithm, scale, **kw)
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_flags_follow_each_task(algorithm):
    """Tiles of 64 query rows whose queries alternate between sharp (x 300: S' of several
    hundred) and mild (N(0, 1) at scale 1/sqrt(D)), all on one AI Core: consecutive tasks are in
    flight together (each with its own peak), and exactly the sharp tiles' rows read
    ROW_REPAIRED, the others ROW_OK."""
    _kernels_run(algorithm)
    q, k, v = _inputs(1, 2, 512, 512, seed=6)
    sharp = (torch.arange(512) // 64) % 2 == torch.tensor([[0], [1]])  # (N, S): head 1 the other way round
    q = torch.where(sharp[None, :, :, None], q.float() * 300, q.float()).half()
    flags = _row_flags(q, k, v, algorithm, MODERATE, cores=1, q_block=64)
    want = torch.where(sharp, overflow.ROW_REPAIRED, overflow.ROW_OK).to(torch.uint8)[None]
    assert torch.equal(flags, want)

