"""The AscendC kernels' row flags under the CPU emulation (backend "ascendc-emu"): the vector
kernel's finish step (and the merge of split kv) flags exactly the rows whose output or LSE is
not finite, the flagged rows are recomputed by fa-fp32, and every other row is bit for bit
the unchecked result (docs/design.md, "Overflow detection and repair")."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import pasa_npu
from pasa_npu import overflow

emu = pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")
from pasa_npu import ascendc_emu  # noqa: E402
from test_overflow import spread_inputs  # noqa: E402
from test_ascendc_emu import assert_matches_torch  # noqa: E402
from _support import SIM, sim_param  # noqa: E402

N = 2


def _call(q, k, v, algorithm, scale, backend="ascendc-emu", **kw):
    out, lse = pasa_npu.fused_attention(q, k, v, num_heads=q.shape[1], input_layout="BNSD",
                                        scale=scale, algorithm=algorithm, backend=backend,
                                        softmax_lse_flag=True, **kw)
    return out, lse[..., 0]  # (B, N, S)


def _checked_and_unchecked(q, k, v, algorithm, scale, **kw):
    """(the row flags the kernels left, checked out, checked lse, unchecked out, unchecked
    lse, the checked call's emulation stats with its report's (rows, nonfinite_rows))."""
    raw, raw_lse = _call(q, k, v, algorithm, scale, repair_overflow=False, **kw)
    assert ascendc_emu.last_run_stats()["repair"] is None, "an unchecked call has no repair launch"
    seen = []
    real = overflow.record

    def keep_flags(problem, backend):
        seen.append(problem.overflow.row_flags.clone())
        real(problem, backend)

    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
        mp.setattr(overflow, "record", keep_flags)
        out, lse = _call(q, k, v, algorithm, scale, **kw)
        report = pasa_npu.overflow_report()
        counts = (report.rows, report.nonfinite_rows)
    stats = dict(ascendc_emu.last_run_stats(), report=counts)
    assert len(seen) == 1
    return seen[0], out, lse, raw, raw_lse, stats


def _nonfinite(out, lse):
    return ~torch.isfinite(out.float()).all(-1) | torch.isnan(lse) | (lse == math.inf)


def _decode_inputs(kv_len, rows="all"):
    q, k, v, scale = spread_inputs(rows, scale=1.0)
    reps = -(-kv_len // k.shape[2])
    k = k.repeat(1, 1, reps, 1)[:, :, :kv_len].contiguous()
    v = v.repeat(1, 1, reps, 1)[:, :, :kv_len].contiguous()
    return q[:, :, :1].contiguous(), k, v, scale


@pytest.mark.parametrize("algorithm", ["pasa", "pasa-exact"])
def test_merge_and_repair_inside_the_attention_launch_give_the_same_bits(algorithm):
    """Split decode whose rows overflow: the merge at the attention launch's end (its cores
    meeting at SyncAll) and the repair after it (meeting again once the merge wrote the task
    flags) leave the same row flags, output and LSE, checked and unchecked, as the merge
    launch and the repair launch that follow the attention launch when forced (merge_launch)."""
    q, k, v, scale = _decode_inputs(8 * 128 * 4)
    runs = {}
    for merge_launch in (0, 1):
        with ascendc_emu.forcing_tiling(merge_launch=merge_launch):
            runs[merge_launch] = _checked_and_unchecked(q, k, v, algorithm, scale)
    inside, own = runs[0][-1], runs[1][-1]
    assert inside["tiling"]["kv_splits"] > 1 and inside["tiling"]["merge_in_attention"], inside["tiling"]
    assert inside["merge"] is None and inside["repair"] is None and inside["report"][0] > 0
    assert own["merge"] is not None and own["repair"] is not None and own["report"] == inside["report"]
    for inside_result, own_result in zip(runs[0][:-1], runs[1][:-1]):  # NaN where unrepaired rows overflow
        torch.testing.assert_close(inside_result, own_result, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("backend", [sim_param(SIM)])
def test_merge_and_repair_inside_the_attention_launch_under_the_simulator(backend):
    """The same checked split decode under Huawei's implementation of the AscendC API (its
    SyncAll, and the data cache the scalar reads of the merge's task flags go through): one
    launch, the emulation's row flags, output and LSE bit for bit."""
    from pasa_npu import ascendc_sim
    q, k, v, scale = _decode_inputs(8 * 128 * 4)
    results = []
    for name in ("ascendc-emu", backend):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
            out, lse = _call(q, k, v, "pasa", scale, backend=name)
            report = pasa_npu.overflow_report()
        results.append((out, lse, report.rows))
    assert ascendc_sim.last_run_stats()["tiling"]["merge_in_attention"]  # the host's tiling: one launch
    assert results[0][2] == results[1][2] > 0
    for emulated, simulated in zip(results[0][:2], results[1][:2]):
        torch.testing.assert_close(emulated, simulated, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("algorithm", ["pasa", "pasa-exact"])
@pytest.mark.parametrize("case", ["prefill-some-tiles", "prefill-all-tiles", "decode-split", "v-nan"])
def test_kernels_flag_and_repair_the_nonfinite_rows(case, algorithm):
    """The kernels flag exactly the rows whose unchecked output or LSE is not finite, and
    their repair launch recomputes those rows by fa-fp32: ROW_REPAIRED where fa-fp32 is
    finite (and equal to it; for split decode, within the bounds between kernel orders), ROW_NONFINITE where it is not (NaN rows exactly where fa-fp32
    has them), ROW_OK elsewhere, where the rows are bit for bit the unchecked result."""
    if case.startswith("prefill"):
        q, k, v, scale = spread_inputs("first-tile" if case.endswith("some-tiles") else "all")
    elif case == "decode-split":
        q, k, v, scale = _decode_inputs(8 * 128 * 4)  # 32 kv blocks: split over the cores
    else:
        gen = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(1, N, 160, 32, generator=gen).half() for _ in range(3))
        v[0, 1, 20, 5] = float("nan")
        scale = 1 / math.sqrt(32)
    flags, out, lse, raw, raw_lse, stats = _checked_and_unchecked(q, k, v, algorithm, scale)
    bad = _nonfinite(raw, raw_lse)
    assert bad.any()
    if case == "decode-split":
        assert stats["tiling"]["kv_splits"] > 1, "the case must run the merge of split kv"
    ref, ref_lse = _call(q, k, v, "fa-fp32", scale)
    ref_bad = _nonfinite(ref, ref_lse)
    want = torch.where(ref_bad, overflow.ROW_NONFINITE, overflow.ROW_REPAIRED)
    assert torch.equal(flags, torch.where(bad, want, overflow.ROW_OK).to(torch.uint8))
    assert torch.equal(_nonfinite(out, lse), ref_bad & bad)
    assert torch.equal(out[~bad], raw[~bad]) and torch.equal(lse[~bad], raw_lse[~bad])
    fixed = bad & ~ref_bad
    if case == "decode-split":
        # the repair runs fa-fp32 without split kv, the fa-fp32 call splits and merges: the
        # two sum in another order (the torch backend's bounds between kernel orders)
        assert_matches_torch(out[fixed], lse[fixed], ref[fixed], ref_lse[fixed], "fa-fp32",
                             torch.float16)
    else:
        assert torch.equal(out[fixed], ref[fixed]) and torch.equal(lse[fixed], ref_lse[fixed])
    assert stats["report"] == (int(bad.sum()), int((bad & ref_bad).sum()))


def test_paged_kernel_flags():
    """Paged K/V (the caches read through the block table): the same flags and repair."""
    q, k, v, scale = spread_inputs("first-tile")
    block = 128
    n_blocks = -(-k.shape[2] // block)
    pad = n_blocks * block - k.shape[2]
    kc = torch.nn.functional.pad(k, (0, 0, 0, pad)).view(1, k.shape[1], n_blocks, block, -1)
    vc = torch.nn.functional.pad(v, (0, 0, 0, pad)).view(1, v.shape[1], n_blocks, block, -1)
    perm = torch.randperm(n_blocks, generator=torch.Generator().manual_seed(0))
    key_cache = kc[0].permute(1, 0, 2, 3)[perm.argsort()].contiguous()  # (blocks, Nkv, block, D)
    value_cache = vc[0].permute(1, 0, 2, 3)[perm.argsort()].contiguous()
    table = perm.view(1, -1).to(torch.int32)
    kw = dict(block_table=table, block_size=block, num_key_value_heads=k.shape[1],
              actual_seq_lengths=[q.shape[2]], actual_seq_lengths_kv=[k.shape[2]])
    flags, out, lse, raw, raw_lse, _ = _checked_and_unchecked(q, key_cache, value_cache, "pasa",
                                                              scale, **kw)
    bad = _nonfinite(raw, raw_lse)
    assert bad.any() and torch.equal(flags, bad.to(torch.uint8) * overflow.ROW_REPAIRED)
    assert torch.isfinite(out).all() and torch.equal(out[~bad], raw[~bad])


@pytest.mark.parametrize("algorithm", ["pasa", "pasa-exact"])
def test_repair_pass_without_flags_does_no_work(algorithm):
    """Nothing overflows: the attention launch runs its repair pass (no host synchronisation
    decides it, no launch of its own) and its cores find no flagged task: no cube work and no
    byte moved beyond the unchecked call's but the flags, every flag ROW_OK."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, N, 160, 32, generator=gen).half() for _ in range(3))
    flags, out, lse, raw, raw_lse, stats = _checked_and_unchecked(q, k, v, algorithm, 32 ** -0.5)
    assert stats["repair"] is None and stats["tiling"]["repair_in_launch"]
    _call(q, k, v, algorithm, 32 ** -0.5, repair_overflow=False)
    unchecked = ascendc_emu.last_run_stats()["attention"]
    assert stats["attention"]["mmad_calls"] == unchecked["mmad_calls"] > 0
    for path in ("gm_to_l1_bytes", "l0c_to_gm_bytes", "gm_to_ub_bytes"):
        assert stats["attention"][path] == unchecked[path], path
    assert not flags.any() and torch.equal(out, raw) and torch.equal(lse, raw_lse)


@pytest.mark.parametrize("algorithm", ["pasa", "pasa-exact"])
def test_check_costs_per_task_and_a_few_instructions_per_block(algorithm):
    """The overflow check runs once per task, in its finish step; the resolution check adds
    an absolute value and a maximum of the row maxima per kv block (pasa: and a product, an
    absolute value and a maximum of its block offsets), and each vector core keeps its core
    flag (zeroed at its start, joined by each task, stored at its end): against the
    unchecked call, 22 + 2 + 2 x blocks (pasa: 5 x blocks) vector instructions and 1 scalar
    UB access per vector core, for a task of 4 and one of 12 kv blocks (one 128-row tile, d = 128, on one AI Core); the empty
    repair pass in the same launch costs no vector or cube work, and less than a quarter of
    a launch's overhead: its cube and vector cores each read the core's two core bytes (6 scalar
    GM reads) and walk no task."""
    def counts(s_kv, checked):
        gen = torch.Generator().manual_seed(3)
        q = torch.randn(1, 1, 128, 128, generator=gen).half()
        k, v = (torch.randn(1, 1, s_kv, 128, generator=gen).half() for _ in range(2))
        params = dict(ascendc_emu.model_parameters(), core_num=1)
        with ascendc_emu.using_model_parameters(params):
            pasa_npu.fused_attention(q, k, v, num_heads=1, input_layout="BNSD", algorithm=algorithm,
                                     backend="ascendc-emu", repair_overflow=checked)
        stats = ascendc_emu.last_run_stats()
        att = stats["attention"]
        assert stats["repair"] is None and stats["tiling"]["repair_in_launch"] == checked
        return (att["vector_instructions"] / 2, att["scalar_ub_accesses"] / 2, att["mmad_calls"],
                att["scalar_gm_accesses"], att["cycles"], params)
    for blocks in (4, 12):
        (v1, s1, m1, g1, c1, params), (v0, s0, m0, g0, c0, _) = (counts(blocks * 128, True),
                                                                 counts(blocks * 128, False))
        per_block = 5 if algorithm == "pasa" else 2
        assert (v1 - v0, s1 - s0) == (22 + 2 + per_block * blocks, 1) and m1 == m0
        assert g1 - g0 == 6
        assert c1 - c0 < 0.25 * params["launch_overhead_cycles"], (c1 - c0)


def test_repair_of_1024_key_blocks_runs_fa_fp32_in_blocks_it_holds():
    """pasa in 1024-key blocks, whose fp32 scores fa-fp32's vector cores do not hold: the repair
    pass recomputes the flagged rows by fa-fp32 in 512-key blocks, equal to fa-fp32's call in those
    blocks; every other row is bit for bit the unchecked result."""
    q, k, v, scale = spread_inputs("first-tile")
    q, k, v = (x.repeat(1, 1, 8, 1).contiguous() for x in (q, k, v))  # 1280 rows and keys: a block and a part
    flags, out, lse, raw, raw_lse, stats = _checked_and_unchecked(q, k, v, "pasa", scale, kv_block=1024, q_block=256)
    assert (stats["tiling"]["kv_block"], stats["tiling"]["repair_kv_block"]) == (1024, 512), stats["tiling"]
    bad = _nonfinite(raw, raw_lse)
    assert bad.any() and not bad.all()
    ref, ref_lse = _call(q, k, v, "fa-fp32", scale, kv_block=512, q_block=256)
    assert not _nonfinite(ref, ref_lse).any()
    assert torch.equal(flags, torch.where(bad, overflow.ROW_REPAIRED, overflow.ROW_OK).to(torch.uint8))
    assert torch.equal(out[bad], ref[bad]) and torch.equal(lse[bad], ref_lse[bad])
    assert torch.equal(out[~bad], raw[~bad]) and torch.equal(lse[~bad], raw_lse[~bad])
