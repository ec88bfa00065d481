"""pasa_npu.fused_attention_v2's learnable sinks against an fp64 dense softmax with an extra
column written here, within each allocation's golden bounds, on the torch backend, the Triton
kernels (tests/fallback/triton/test_triton_sinks.py holds them to the torch backend) and the
AscendC kernels (ascendc-emu: also against the torch backend, on few AI Cores, with split kv,
rows without keys and the overflow repair)."""
from __future__ import annotations

import dataclasses
import math
import warnings
from unittest import mock

import pytest
import torch

import pasa_npu
from _support import (BACKENDS, assert_measured, device_kind, dtype_name, interpreted,
                      interpreter_skip, npu_visible, on_device, rel_rmse, skip_unsupported)
from _fia import _packed, _v1_v2
from _bounds import ascendc_numerics, v1_keywords
from test_golden import kv_lens
from pasa_npu import arguments, backends, plans
from pasa_npu.kernel_inputs import TILING_KEYS
from pasa_npu.problem import AttentionProblem

INT_MAX = 2147483647
GOLDEN_FACTOR = 1.5  # tests/test_golden.py's


# ----------------------------------------------------------------------------- sinks


def dense_with_sinks(q, k, v, q_cum, kv_cum, scale, sink, sparse_mode=0, pre=INT_MAX,
                     nxt=INT_MAX):
    """fp64 attention of a packed (TND) call with learnable sinks, written independently:
    per sequence and query head, softmax over [the visible scores, sink[h]] and the value
    rows [V, 0]. Rows without a visible key: 0 and LSE -inf."""
    nq, nkv = q.shape[1], k.shape[1]
    group = nq // nkv
    out = torch.zeros(q.shape[0], nq, v.shape[2], dtype=torch.float64)
    lse = torch.full((q.shape[0], nq, 1), float("-inf"), dtype=torch.float64)
    for (q0, q1), (k0, k1) in zip(zip([0] + q_cum[:-1], q_cum), zip([0] + kv_cum[:-1], kv_cum)):
        s1, s2 = q1 - q0, k1 - k0
        vis = (npu_visible(s1, s2, sparse_mode, pre, nxt) if sparse_mode else
               torch.ones(s1, s2, dtype=torch.bool))
        for h in range(nq):
            qh = q[q0:q1, h].double()
            kh, vh = k[k0:k1, h // group].double(), v[k0:k1, h // group].double()
            scores = (qh @ kh.T * scale).masked_fill(~vis, float("-inf"))
            column = torch.full((s1, 1), float(sink[h]), dtype=torch.float64)
            full = torch.cat([scores, column], dim=1)
            weights = torch.softmax(full, dim=1)
            values = torch.cat([vh, torch.zeros(1, vh.shape[1], dtype=torch.float64)])
            seen = vis.any(1)
            out[q0:q1, h] = torch.where(seen[:, None], weights @ values, 0.0)
            lse[q0:q1, h, 0] = torch.where(seen, torch.logsumexp(full, dim=1), float("-inf"))
    return out, lse


#: (family of tests/test_golden.py's bounds, the case): packed causal prefill whose kv lengths
#: end in part-filled blocks; packed decode rows with chunked prefill through a sliding window
#: (sparse_mode 4); decode (one query row per sequence) with ragged contexts ending in
#: part-filled blocks and 4 query heads per kv head; and decode whose kv the ascendc-emu
#: kernels split across AI Cores (merged by LSE), 8 query heads on one kv head, one sequence
#: without keys (its rows ignore the sink: 0 and a non-finite LSE). The decode
#: family's bounds were measured on contexts of up to 8 kv blocks: the split case takes
#: 32-key blocks to split contexts of that length, and is held to them for the allocations
#: the kernels implement only (fa-fp16's fp16 statistics over 54 blocks exceed them).
SINK_CASES = {
    "tnd-causal": ("packed", dict(q_cum=[50, 250], kv_cum=[50, 250], sparse_mode=3)),
    "tnd-mixed-band": ("mixed", dict(q_cum=[1, 41, 42, 102], kv_cum=[90, 250, 330, 390],
                                     sparse_mode=4, pre=50, nxt=0)),
    "tnd-decode-gqa": ("decode", dict(q_cum=[1, 2, 3], kv_cum=[700, 737, 1437], nq=8, nkv=2)),
    "tnd-decode-split": ("decode", dict(q_cum=[1, 2, 3], kv_cum=[1000, 1000, 1700], nq=8,
                                        nkv=1, kv_block=32, split=True)),
}
#: from negligible to dominant, a different logit for every query head (a sink read for the
#: wrong head shows)
SINK_LOGITS = (-1.0, 0.5, 2.0, 4.0, -3.0, 1.0, 3.0, 0.0)
#: the backends here held against the golden with sinks
SINK_BACKENDS = [b for b in ("torch", "triton", "ascendc-emu") if b in BACKENDS]
#: (case, allocation) pairs held to the golden bounds (see SINK_CASES)
SINK_MATRIX = [(name, algorithm) for name, (_, case) in SINK_CASES.items()
               for algorithm in pasa_npu.ALGORITHM_NAMES
               if not case.get("split") or algorithm in TILING_KEYS]


@pytest.fixture(scope="module")
def sink_golden():
    return {}


def _sink_case(cache, name, dtype):
    if (name, dtype) not in cache:
        _, case = SINK_CASES[name]
        nq, nkv = case.get("nq", 4), case.get("nkv", 2)
        q, k, v = _packed(3, case["q_cum"], case["kv_cum"], nq, nkv, 32, dtype)
        sink = torch.tensor(SINK_LOGITS[:nq])
        kw = dict(num_query_heads=nq, num_key_value_heads=nkv, softmax_scale=1 / math.sqrt(32),
                  input_layout="TND", actual_seq_qlen=case["q_cum"],
                  actual_seq_kvlen=case["kv_cum"], return_softmax_lse=True,
                  sparse_mode=case.get("sparse_mode", 0))
        if kw["sparse_mode"]:
            kw["atten_mask"] = pasa_npu.compressed_causal_mask()
        if "pre" in case:
            kw.update(pre_tokens=case["pre"], next_tokens=case["nxt"])
        if "kv_block" in case:
            kw["kv_block"] = case["kv_block"]
        gold = dense_with_sinks(q, k, v, case["q_cum"], case["kv_cum"], kw["softmax_scale"],
                                sink, kw["sparse_mode"], case.get("pre", INT_MAX),
                                case.get("nxt", INT_MAX))
        cache[(name, dtype)] = (q, k, v, sink, kw, gold)
    return cache[(name, dtype)]


def _kv_block(name) -> int:
    """The kv block of a SINK_CASES case (the default tiling's unless it sets one)."""
    return SINK_CASES[name][1].get("kv_block", pasa_npu.DEFAULT_TILING.kv_block)


def _kv_blocks(name) -> int:
    """The most kv blocks a row of a SINK_CASES case folds."""
    return -(-max(kv_lens(SINK_CASES[name][1])) // _kv_block(name))


@pytest.mark.parametrize("name", list(SINK_CASES))
def test_golden_with_sinks_matches_the_dense_softmax(name, sink_golden):
    q, k, v, sink, kw, (gold, gold_lse) = _sink_case(sink_golden, name, torch.float16)
    kw = {key: value for key, value in kw.items() if key not in arguments.OWN_KEYWORDS}
    out, lse = pasa_npu.reference_attention_v2(q, k, v, learnable_sink=sink, **kw)
    assert torch.equal(torch.isfinite(lse), torch.isfinite(gold_lse))
    assert torch.allclose(out, gold, rtol=1e-12, atol=1e-12)
    finite = torch.isfinite(gold_lse)
    assert torch.allclose(lse[finite], gold_lse[finite], rtol=1e-12, atol=1e-12)
    without, without_lse = pasa_npu.reference_attention_v2(q, k, v, **kw)
    assert bool((lse[finite] > without_lse[finite]).all())  # the sink adds to every row's sum


def _assert_matches_torch_backend(out, lse, q, k, v, sink, kw, algorithm, dtype, name, gold, gold_lse):
    """ascendc-emu against the torch backend's same allocation with the same sinks, at the
    derived bounds of tests/ascend_kernels/test_ascendc_emu.py. pasa with split kv restarts its fp16
    statistics per kv range (and joins the sink in the merge), so there, as in
    tests/ascend_kernels/test_ascendc_emu_shapes.py, it is held against the fp64 golden instead: relative
    RMSE and largest LSE error each within 1.1x the torch backend's."""
    from pasa_npu import ascendc_emu
    from test_ascendc_emu import assert_matches_torch
    tiling = ascendc_emu.last_run_stats()["tiling"]
    split = tiling["kv_splits"] > 1
    with ascendc_numerics(tiling):  # the kernels' numerics: decode shifts the scores
        ref, ref_lse = pasa_npu.fused_attention_v2(q, k, v, learnable_sink=sink, algorithm=algorithm,
                                                   backend="torch", **kw)
    if split and algorithm == "pasa":
        finite = torch.isfinite(gold_lse)
        assert rel_rmse(out, gold) <= 1.1 * rel_rmse(ref, gold)
        lse_err = float((lse.double() - gold_lse)[finite].abs().max())
        assert lse_err <= 1.1 * float((ref_lse.double() - gold_lse)[finite].abs().max())
        return
    assert_matches_torch(out, lse, ref, ref_lse, algorithm, dtype, _kv_blocks(name),
                         call=(q, k, v, v1_keywords(kw)), kv_lens=kv_lens(SINK_CASES[name][1]),
                         kv_block=_kv_block(name))


@pytest.mark.parametrize("backend", SINK_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name,algorithm", SINK_MATRIX)
def test_sinks_within_each_allocations_golden_bounds(name, algorithm, dtype, backend, sink_golden):
    """Every allocation a backend computes, with sinks, within the allocation's golden bounds
    (tests/test_golden.py's, of the case's family); ascendc-emu also against the torch
    backend's same allocation (the decode-split case splits its kv across AI Cores there)."""
    if reason := interpreter_skip(backend, algorithm, dtype):
        pytest.skip(reason)
    if interpreted(backend) and dtype == torch.bfloat16:
        pytest.skip("Triton's CPU interpreter truncates its bf16 outputs (numpy has no bf16), "
                    "which the golden bounds do not allow; bf16 runs on the GPU")
    family, _ = SINK_CASES[name]
    q, k, v, sink, kw, (gold, gold_lse) = _sink_case(sink_golden, name, dtype)
    with skip_unsupported(backend):
        out, lse = pasa_npu.fused_attention_v2(
            *on_device(backend, q, k, v), learnable_sink=on_device(backend, sink)[0].bfloat16(),
            algorithm=algorithm, backend=backend,
            **dict(zip(kw, on_device(backend, *kw.values()))))
    out, lse = out.cpu(), lse.cpu()
    assert out.dtype == dtype and lse.dtype == torch.float32 and torch.isfinite(out).all()
    finite = torch.isfinite(gold_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    lse_err = float((lse.double() - gold_lse)[finite].abs().max())
    # Triton's interpreter computes what the torch backend does (tests/fallback/triton/test_triton_sinks.py),
    # at these full sizes; its own measured golden errors are of test_golden's shrunk cases
    where = "cpu" if interpreted(backend) else device_kind(backend)
    key = f"{where}/{dtype_name(dtype)}/{algorithm}/{family}"
    assert_measured(rel_rmse(out, gold), "golden-rmse", key, GOLDEN_FACTOR, f"{name}+sinks")
    assert_measured(lse_err, "golden-lse", key, GOLDEN_FACTOR, f"{name}+sinks")
    if backend == "ascendc-emu":
        from pasa_npu import ascendc_emu
        tiling = ascendc_emu.last_run_stats()["tiling"]
        assert (tiling["kv_splits"] > 1) == bool(SINK_CASES[name][1].get("split")), tiling
        _assert_matches_torch_backend(out, lse, q, k, v, sink.to(torch.bfloat16), kw, algorithm,
                                      dtype, name, gold, gold_lse)


@pytest.mark.skipif("ascendc-emu" not in BACKENDS, reason="the ascendc-emu backend is not here")
@pytest.mark.parametrize("algorithm", list(TILING_KEYS))
@pytest.mark.parametrize("name", list(SINK_CASES))
def test_ascendc_sinks_on_few_ai_cores(name, algorithm, sink_golden):
    """The kernels with 2 emulated AI Cores, each walking several tasks (decode-split: 4, each
    walking several kv ranges of the split tasks, merged with the sink joined once): the torch
    backend's result at tests/ascend_kernels/test_ascendc_emu.py's bounds (pasa split: the golden's, as
    above)."""
    from pasa_npu import ascendc_emu
    from test_ascendc_emu import emulated_cores
    q, k, v, sink, kw, (gold, gold_lse) = _sink_case(sink_golden, name, torch.float16)
    split = bool(SINK_CASES[name][1].get("split"))
    with emulated_cores(4 if split else 2):
        out, lse = pasa_npu.fused_attention_v2(q, k, v, learnable_sink=sink, algorithm=algorithm,
                                               backend="ascendc-emu", **kw)
    tiling = ascendc_emu.last_run_stats()["tiling"]
    assert tiling["num_tasks"] * tiling["kv_splits"] > tiling["block_dim"], tiling
    assert (tiling["kv_splits"] > 1) == split, tiling
    _assert_matches_torch_backend(out, lse, q, k, v, sink, kw, algorithm, torch.float16, name,
                                  gold, gold_lse)


def _problem_of(q, k, v, **kw) -> AttentionProblem:
    """The AttentionProblem the API layer builds for ``fused_attention_v2(q, k, v, **kw)``."""
    captured = []

    def capture(**fields):
        captured.append(AttentionProblem(**fields))
        return captured[-1]

    with mock.patch.object(plans, "AttentionProblem", capture), mock.patch.dict(plans.PLANS, clear=True):
        pasa_npu.fused_attention_v2(q, k, v, backend="torch", **kw)
    return captured[-1]


#: the problems of test_ascendc_rows_without_keys_ignore_the_sink: causal (bottom right) with
#: a sequence of 30 queries on 10 keys, whose first 20 rows see no key in the tiles of rows that
#: do (on the model's AI Cores and on 2); and SINK_CASES' split decode, whose second sequence
#: has no key (every split's partial of its rows empty)
EMPTY_ROW_CASES = {"causal": None, "causal-few-cores": 2, "decode-split": None}


@pytest.mark.skipif("ascendc-emu" not in BACKENDS, reason="the ascendc-emu backend is not here")
@pytest.mark.parametrize("algorithm", list(TILING_KEYS))
@pytest.mark.parametrize("case", list(EMPTY_ROW_CASES))
def test_ascendc_rows_without_keys_ignore_the_sink(case, algorithm, sink_golden):
    """The backends' own results (before the API layer's rules for empty rows, which overwrite
    them): rows that see no key ignore the sink, 0 and LSE -inf, on the kernels as on the torch
    backend; the other rows take it, the torch backend's result at tests/ascend_kernels/test_ascendc_emu.py's
    bounds (pasa split: their non-finite pattern only, see above)."""
    from pasa_npu import ascendc_emu
    from test_ascendc_emu import assert_matches_torch, emulated_cores
    if case == "decode-split":
        q, k, v, sink, kw, _ = _sink_case(sink_golden, "tnd-decode-split", torch.float16)
        q_cum, kv_cum, mode, blocks = [1, 2, 3], [1000, 1000, 1700], 0, _kv_blocks("tnd-decode-split")
    else:
        q_cum, kv_cum, mode, blocks = [30, 230], [10, 210], 3, 2
        q, k, v = _packed(5, q_cum, kv_cum)
        sink = torch.tensor(SINK_LOGITS[:4])
        _, kw = _v1_v2(4, 2, 32, input_layout="TND", actual_seq_qlen=q_cum, actual_seq_kvlen=kv_cum,
                       sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask())
    problem = _problem_of(q, k, v, learnable_sink=sink, algorithm=algorithm, repair_overflow=False, **kw)
    runs = {}
    for backend in ("ascendc-emu", "torch"):  # the torch backend in the kernels' numerics
        runs[backend] = dataclasses.replace(problem, out=torch.full_like(problem.out, 7.0),
                                            lse=torch.full_like(problem.lse, 7.0))
        cores = EMPTY_ROW_CASES[case] or ascendc_emu.model_parameters()["core_num"]
        with emulated_cores(cores):
            if backend == "torch":
                with ascendc_numerics(tiling):
                    backends.BACKENDS[backend].runner()(runs[backend])
            else:
                backends.BACKENDS[backend].runner()(runs[backend])
        if backend == "ascendc-emu":
            tiling = ascendc_emu.last_run_stats()["tiling"]
            assert (tiling["kv_splits"] > 1) == (case == "decode-split"), tiling
    _, gold_lse = dense_with_sinks(q, k, v, q_cum, kv_cum, kw["softmax_scale"], sink, mode)
    empty = ~torch.isfinite(gold_lse[..., 0]).T[None]  # (1, Nq, T), the problem's rows
    assert int(empty.sum()) == (20 * 4 if case.startswith("causal") else 8)
    for p in runs.values():
        assert not p.out[empty].any() and bool((p.lse[empty] == -math.inf).all())
        assert bool(torch.isfinite(p.lse[~empty]).all())
    emu, ref = runs["ascendc-emu"], runs["torch"]
    if case != "decode-split" or algorithm != "pasa":
        assert_matches_torch(emu.out, emu.lse, ref.out, ref.lse, algorithm, torch.float16, blocks)


#: (query lengths, kv lengths, query heads, kv heads, kv_block) of the extreme-sink checks: one
#: prefill sequence, and decode whose kv ascendc-emu splits across AI Cores (the sink joins in
#: the merge)
EXTREME_SINK_CASES = {"prefill": ([64], [64], 4, 2, 128),
                      "decode-split": ([1, 2], [1000, 1700], 8, 1, 32)}


@pytest.mark.parametrize("backend", SINK_BACKENDS)
@pytest.mark.parametrize("algorithm", pasa_npu.ALGORITHM_NAMES)
@pytest.mark.parametrize("case", list(EXTREME_SINK_CASES))
def test_pasa_shift_never_moves_the_sink(case, algorithm, backend):
    """A sink far above every score takes (almost) all the mass: the output is ~0 and the
    LSE ~ the sink, under PASA's shift as without it; a sink far below changes nothing
    measurable: the result is bit for bit the call's without a sink."""
    q_cum, kv_cum, nq, nkv, kv_block = EXTREME_SINK_CASES[case]
    q, k, v = _packed(4, q_cum, kv_cum, nq, nkv)
    _, kw = _v1_v2(nq, nkv, 32, input_layout="TND", actual_seq_qlen=q_cum,
                   actual_seq_kvlen=kv_cum, kv_block=kv_block)
    kw.update(algorithm=algorithm, backend=backend)
    q, k, v = on_device(backend, q, k, v)
    with skip_unsupported(backend):
        out, lse = pasa_npu.fused_attention_v2(q, k, v, learnable_sink=torch.full((nq,), 30.0,
                                                                                   device=q.device),
                                               **kw)
    if backend == "ascendc-emu" and case == "decode-split":
        from pasa_npu import ascendc_emu
        assert ascendc_emu.last_run_stats()["tiling"]["kv_splits"] > 1
    assert float(out.abs().max()) < 1e-6
    assert float((lse - 30.0).abs().max()) < 0.05
    low, low_lse = pasa_npu.fused_attention_v2(q, k, v, **kw,
                                               learnable_sink=torch.full((nq,), -60.0,
                                                                         device=q.device))
    base, base_lse = pasa_npu.fused_attention_v2(q, k, v, **kw)
    assert torch.equal(low, base) and torch.equal(low_lse, base_lse)


@pytest.mark.parametrize("backend", ["golden", *SINK_BACKENDS])
@pytest.mark.parametrize("algorithm", ["fa-fp32", "pasa", "pasa-exact"])
def test_non_finite_sinks(algorithm, backend):
    """Per head: a -inf logit is no sink (bit for bit the call without one); +inf and NaN
    make that head's rows NaN, output and LSE, as a softmax over them does; the other heads
    are the call's with their own sinks (as the documented ``learnable_sink`` says)."""
    q, k, v = _packed(5, [6, 20], [9, 40], 4, 2)
    _, kw = _v1_v2(4, 2, 32, input_layout="TND", actual_seq_qlen=[6, 20],
                   actual_seq_kvlen=[9, 40])
    sinks = torch.tensor([float("-inf"), float("inf"), float("nan"), 0.5])
    if backend == "golden":
        def call(*args, **keywords):
            return pasa_npu.reference_attention_v2(*args, **keywords)
    else:
        kw.update(algorithm=algorithm, backend=backend)
        q, k, v, sinks = on_device(backend, q, k, v, sinks)

        def call(*args, **keywords):
            with warnings.catch_warnings():  # the NaN rows are reported as such
                warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
                with skip_unsupported(backend):
                    return pasa_npu.fused_attention_v2(*args, **keywords)
    out, lse = call(q, k, v, learnable_sink=sinks, **kw)
    base, base_lse = call(q, k, v, **kw)
    finite, finite_lse = call(q, k, v, learnable_sink=torch.where(sinks.isfinite(), sinks, -9.0),
                              **kw)
    assert torch.equal(out[:, 0], base[:, 0]) and torch.equal(lse[:, 0], base_lse[:, 0])
    assert out[:, 1:3].isnan().all() and lse[:, 1:3].isnan().all()
    assert torch.equal(out[:, 3], finite[:, 3]) and torch.equal(lse[:, 3], finite_lse[:, 3])


@pytest.mark.skipif("ascendc-emu" not in BACKENDS, reason="the ascendc-emu backend is not here")
@pytest.mark.parametrize("algorithm", ("pasa", "pasa-exact"))
def test_ascendc_overflow_repair_keeps_the_sink(algorithm):
    """Rows whose scores overflow fp16 (tests/api/test_overflow.py's inputs, as TND) are flagged and
    recomputed by the kernels' fa-fp32 repair launch, which joins the sink as the first launch
    does: those rows are bit for bit the fa-fp32 call's with the same sinks. The sinks sit at
    those rows' LSE, so that they take a share of the mass there."""
    from test_overflow import spread_inputs
    q, k, v, scale = spread_inputs("first-tile")
    nq, s = q.shape[1], q.shape[2]
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))  # (T, N, D)
    kw = dict(num_query_heads=nq, num_key_value_heads=nq, softmax_scale=scale, input_layout="TND",
              actual_seq_qlen=[s], actual_seq_kvlen=[s], return_softmax_lse=True,
              backend="ascendc-emu")
    _, plain_lse = pasa_npu.fused_attention_v2(q, k, v, algorithm="fa-fp32", **kw)
    sink = plain_lse[:48, :, 0].median(0).values.float()  # the overflowing rows' LSE, per head
    want, want_lse = pasa_npu.fused_attention_v2(q, k, v, learnable_sink=sink, algorithm="fa-fp32", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
        out, lse = pasa_npu.fused_attention_v2(q, k, v, learnable_sink=sink, algorithm=algorithm, **kw)
        report = pasa_npu.overflow_report()
        assert report.rows > 0 and report.nonfinite_rows == 0
    raw, raw_lse = pasa_npu.fused_attention_v2(q, k, v, learnable_sink=sink, algorithm=algorithm,
                                               repair_overflow=False, **kw)
    bad = ~torch.isfinite(raw.float()).all(-1) | ~torch.isfinite(raw_lse[..., 0])
    assert int(bad.sum()) == report.rows
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert torch.equal(out[bad], want[bad]) and torch.equal(lse[bad], want_lse[bad])
    assert torch.equal(out[~bad], raw[~bad]) and torch.equal(lse[~bad], raw_lse[~bad])
    # the sink took a share of the repaired rows' mass: their LSE rose by log 2 or so
    assert float((want_lse[bad] - plain_lse[bad]).min()) > 0.1


def test_sink_limits_and_other_backends(monkeypatch):
    q, k, v = _packed(0, [8], [8])
    _, kw = _v1_v2(4, 2, 32, input_layout="TND", actual_seq_qlen=[8], actual_seq_kvlen=[8])
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        pasa_npu.fused_attention_v2(q, k, v, **kw, learnable_sink=torch.zeros(2))
    with pytest.raises(TypeError, match="learnable_sink"):
        pasa_npu.fused_attention_v2(q, k, v, **kw, learnable_sink=torch.zeros(4, dtype=torch.int32))
    bsh = dict(kw, input_layout="BSH")
    del bsh["actual_seq_qlen"], bsh["actual_seq_kvlen"]
    with pytest.raises(ValueError, match="TND or NTD_TND"):
        pasa_npu.fused_attention_v2(q.view(1, 8, 128), k.view(1, 8, 64), v.view(1, 8, 64),
                                    **bsh, learnable_sink=torch.zeros(4))
    assert all(backends.BACKENDS[name].sinks for name in ("torch", "ascendc-emu", "npu"))
    for backend in BACKENDS:
        qd, kd, vd, sink = on_device(backend, q, k, v, torch.zeros(4))
        if backends.BACKENDS[backend].sinks:  # computes them (held to the golden above)
            out, _ = pasa_npu.fused_attention_v2(qd, kd, vd, **kw, learnable_sink=sink, backend=backend)
            assert torch.isfinite(out).all()
            continue
        with pytest.raises(NotImplementedError, match="learnable_sink is not implemented by backend"):
            pasa_npu.fused_attention_v2(qd, kd, vd, **kw, learnable_sink=sink, backend=backend)
    # a backend without sinks refuses them by name, whether or not one is registered: the
    # torch backend's entry with its flag off (no plan made with the real entry)
    monkeypatch.setitem(backends.BACKENDS, "torch",
                        dataclasses.replace(backends.BACKENDS["torch"], sinks=False))
    monkeypatch.setattr(plans, "PLANS", {})
    with pytest.raises(NotImplementedError, match="learnable_sink is not implemented by backend 'torch'"):
        pasa_npu.fused_attention_v2(q, k, v, **kw, learnable_sink=torch.zeros(4), backend="torch")
