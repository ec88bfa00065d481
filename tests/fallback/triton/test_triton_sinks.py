"""Learnable sinks on the Triton kernels: packed prefill with part-filled kv blocks, decode
whose kv is split and merged by LSE, and the overflow repair (rows recomputed by fa-fp32),
each against the torch backend's same allocation within the derived bounds
(tests/_bounds.py); the torch backend with sinks is held to an independent fp64 softmax in
tests/api/test_fia_v2_sinks.py."""
from __future__ import annotations

import warnings

import pytest
import torch

import pasa_npu
from _support import BACKENDS, on_device
from _bounds import (assert_triton_matches_cpu, row_scale_ulps, triton_numerics, ulp,
                     v1_keywords)
from test_overflow import spread_inputs

pytestmark = pytest.mark.skipif("triton" not in BACKENDS, reason="triton is not installed")

#: packed (TND) calls: causal prefill whose sequences end in part-filled kv blocks, and
#: decode (one query row a sequence) with contexts of many kv blocks, which the decode
#: kernel splits and merges; one sink logit a query head, from negligible to dominant
CASES = {
    "prefill-causal": dict(q_cum=[40, 140], kv_cum=[40, 170], sparse_mode=3, nq=4, nkv=2),
    "decode-split": dict(q_cum=[1, 2, 3], kv_cum=[150, 187, 450], nq=8, nkv=2),
}
SINKS = (-1.0, 0.5, 2.0, 4.0, -3.0, 1.0, 3.0, 0.0)
KV_BLOCK = 16  # several kv blocks and decode splits at sizes the interpreter runs quickly


def _call(name: str, dtype=torch.float16):
    case = CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    nq, nkv, d = case["nq"], case["nkv"], 32
    q = torch.randn(case["q_cum"][-1], nq, d, generator=gen).to(dtype)
    k, v = (torch.randn(case["kv_cum"][-1], nkv, d, generator=gen).to(dtype) for _ in range(2))
    kw = dict(num_query_heads=nq, num_key_value_heads=nkv, input_layout="TND",
              softmax_scale=d ** -0.5, return_softmax_lse=True, actual_seq_qlen=case["q_cum"],
              actual_seq_kvlen=case["kv_cum"], kv_block=KV_BLOCK,
              learnable_sink=torch.tensor(SINKS[:nq]))
    if "sparse_mode" in case:
        kw.update(sparse_mode=case["sparse_mode"], atten_mask=pasa_npu.compressed_causal_mask())
    return q, k, v, kw


def _lengths(cum):
    return [b - a for a, b in zip([0, *cum[:-1]], cum)]


def _on_triton(q, k, v, kw, algorithm):
    qd, kd, vd = on_device("triton", q, k, v)
    kw_dev = dict(zip(kw, on_device("triton", *kw.values())))
    return pasa_npu.fused_attention_v2(qd, kd, vd, algorithm=algorithm, backend="triton",
                                       **kw_dev)


@pytest.mark.parametrize("algorithm", pasa_npu.ALGORITHM_NAMES)
@pytest.mark.parametrize("name", list(CASES))
def test_sinks_match_the_cpu_backend(name, algorithm):
    q, k, v, kw = _call(name)
    path = "decode" if max(_lengths(kw["actual_seq_qlen"])) == 1 else "prefill"
    with triton_numerics(path):
        ref, ref_lse = pasa_npu.fused_attention_v2(q, k, v, algorithm=algorithm,
                                                   backend="torch", **kw)
    out, lse = _on_triton(q, k, v, kw, algorithm)
    assert_triton_matches_cpu(out, lse, ref, ref_lse, algorithm, f"sinks-{name}", path=path,
                              call=(q, k, v, v1_keywords(kw)),
                              kv_lens=_lengths(kw["actual_seq_kvlen"]), kv_block=KV_BLOCK)
    # the sink took mass: every row's LSE above the one without it, its output smaller
    bare, bare_lse = _on_triton(q, k, v, {n: t for n, t in kw.items() if n != "learnable_sink"},
                                algorithm)
    assert bool((lse.cpu() > bare_lse.cpu()).all())
    assert out.float().norm() < bare.float().norm()


@pytest.mark.parametrize("algorithm", ["pasa", "pasa-exact"])
def test_sinks_join_the_repaired_rows(algorithm):
    """Rows whose fp16 scores overflow are recomputed by fa-fp32 (tests/api/test_overflow.py's
    inputs), the sink joining them there as it does on the rows that did not overflow:
    each row equals the same call's row without the sink, folded with it in fp64
    (O exp(LSE - LSE'), LSE' = log(exp(LSE) + exp(sink))), to its final rounding (fa-fp32
    differs from the torch backend's on these rows by its sum order, which test_overflow.py
    bounds). Without the sink in a repaired row, that row is off by its factor, up to 300x. Head 0's sink is of the overflowing rows' scale (about half their mass), head
    1's of the others'."""
    q, k, v, scale = spread_inputs("first-tile")
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))  # (S, N, D): TND
    s, n = q.shape[0], q.shape[1]
    sink = torch.tensor([104994.5, 2.0])
    kw = dict(num_query_heads=n, num_key_value_heads=n, input_layout="TND",
              softmax_scale=scale, return_softmax_lse=True, actual_seq_qlen=[s],
              actual_seq_kvlen=[s])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
        out, lse = _on_triton(q, k, v, dict(kw, learnable_sink=sink), algorithm)
        assert pasa_npu.overflow_report().rows > 0, "the inputs must overflow PASA's fp16"
        bare, bare_lse = _on_triton(q, k, v, kw, algorithm)
    lse, bare_lse = lse.cpu().double(), bare_lse.cpu().double()
    joined = torch.logaddexp(bare_lse, sink.double()[None, :, None])
    folded = bare.cpu().double() * torch.exp(bare_lse - joined)
    # the fold's factor exp(LSE - LSE') is as exact as the fp32 LSEs (0.008 at 1e5): a
    # relative error of two of their ulps, in fp16 ulps, above the output's final rounding
    lse_ulp = float(ulp(joined.abs().max(), torch.float32))
    assert row_scale_ulps(out.cpu(), folded.half()) <= 1 + 2 * lse_ulp / 2 ** -10
    assert float((lse - joined).abs().max()) <= 4 * lse_ulp
    head0, bare0 = lse[:, 0, 0], bare_lse[:, 0, 0]
    near = (bare0 - sink[0]).abs() < 2  # overflowing rows the sink weighs on
    assert near.any() and bool((head0[near] > bare0[near] + 0.1).all())
