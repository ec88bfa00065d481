"""pasa_npu.fused_attention_v2, the drop-in for torch_npu.npu_fused_infer_attention_score_v2:
its signature (v1's table renamed, plus v2's additions), the same results as v1 bit for bit on
every backend here, out_dtype, the refusals, and learnable sinks against an fp64 dense
softmax with an extra column written here, within each allocation's golden bounds."""
from __future__ import annotations

import inspect
import math

import pytest
import torch

import pasa_npu
from _support import (BACKENDS, assert_measured, dtype_name, interpreted, npu_visible,
                      on_device, rel_rmse, skip_unsupported)
from pasa_npu import arguments

INT_MAX = 2147483647
GOLDEN_FACTOR = 1.5  # tests/test_golden.py's


def _packed(seed, q_cum, kv_cum, nq=4, nkv=2, d=32, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(q_cum[-1], nq, d, generator=g).to(dtype)
    k = torch.randn(kv_cum[-1], nkv, d, generator=g).to(dtype)
    v = torch.randn(kv_cum[-1], nkv, d, generator=g).to(dtype)
    return q, k, v


def _v1_v2(nq, nkv, d, **common):
    """The same call's keywords for v1 and v2."""
    v1 = dict(num_heads=nq, num_key_value_heads=nkv, scale=1 / math.sqrt(d),
              softmax_lse_flag=True, **common)
    v2 = dict(num_query_heads=nq, num_key_value_heads=nkv, softmax_scale=1 / math.sqrt(d),
              return_softmax_lse=True, **common)
    return v1, v2


# ----------------------------------------------------------------------------- signature


def test_v2_signature_is_v1_table_renamed_in_v2_order():
    params = inspect.signature(pasa_npu.fused_attention_v2).parameters
    names = list(params)
    assert names[:3] == ["query", "key", "value"]
    assert tuple(names[3:3 + len(arguments.V2_ORDER)]) == arguments.V2_ORDER
    assert tuple(names[3 + len(arguments.V2_ORDER):]) == arguments.OWN_KEYWORDS
    v1 = inspect.signature(pasa_npu.fused_attention).parameters
    for v2_name, v1_name in arguments.V2_RENAMES.items():
        assert params[v2_name].default == v1[v1_name].default
        assert params[v2_name].annotation == v1[v1_name].annotation
    assert params["learnable_sink"].default is None and params["out_dtype"].default is None
    for name in ("num_heads", "scale", "softmax_lse_flag", "query_padding_size",
                 "key_shared_prefix", "antiquant_mode"):  # v1 only
        assert name not in params
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_heads'"):
        pasa_npu.fused_attention_v2(*_packed(0, [8], [8]), num_heads=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'learnable_sink'"):
        pasa_npu.fused_attention(*_packed(0, [8], [8]), learnable_sink=torch.zeros(4))


@pytest.mark.parametrize("name", sorted(arguments.V2_UNIMPLEMENTED_KEYWORDS))
def test_unimplemented_v2_arguments_are_refused_by_name(name):
    q, k, v = _packed(0, [8], [8])
    default = arguments.V2_UNIMPLEMENTED_KEYWORDS[name]
    value = torch.ones(2) if default is None and not name.endswith("_dtype") else 1
    _, kw = _v1_v2(4, 2, 32, input_layout="TND", actual_seq_qlen=[8], actual_seq_kvlen=[8])
    with pytest.raises(NotImplementedError, match=name):
        pasa_npu.fused_attention_v2(q, k, v, **kw, **{name: value})
    pasa_npu.fused_attention_v2(q, k, v, **kw, **{name: default})  # the default is accepted


def test_sparse_mode_9_is_refused():
    q, k, v = _packed(0, [8], [8])
    _, kw = _v1_v2(4, 2, 32, input_layout="TND", actual_seq_qlen=[8], actual_seq_kvlen=[8])
    with pytest.raises(NotImplementedError, match="sparse_mode=9"):
        pasa_npu.fused_attention_v2(q, k, v, **kw, sparse_mode=9,
                                    atten_mask=torch.zeros(64, dtype=torch.bool))


# ----------------------------------------------------------------------------- v1 == v2

#: small problems (the Triton interpreter runs them): packed causal prefill with a decode
#: row, a sliding window (sparse_mode 4), and a ragged BNSD decode
V1_V2_CASES = {
    "tnd-causal": dict(q_cum=[1, 21, 40], kv_cum=[30, 50, 69], input_layout="TND",
                       sparse_mode=3, mask=True),
    "tnd-window": dict(q_cum=[24, 40], kv_cum=[24, 56], input_layout="TND", sparse_mode=4,
                       mask=True, pre_tokens=8, next_tokens=0),
    "bnsd-decode": dict(input_layout="BNSD", kv_lens=[40, 13]),
}


def _case_inputs(name):
    case = V1_V2_CASES[name]
    nq, nkv, d = 4, 2, 32
    common = {key: case[key] for key in ("input_layout", "sparse_mode", "pre_tokens",
                                         "next_tokens") if key in case}
    if case.get("mask"):
        common["atten_mask"] = pasa_npu.compressed_causal_mask()
    if "q_cum" in case:
        q, k, v = _packed(1, case["q_cum"], case["kv_cum"], nq, nkv, d)
        v1, v2 = _v1_v2(nq, nkv, d, **common)
        v1.update(actual_seq_lengths=case["q_cum"], actual_seq_lengths_kv=case["kv_cum"])
        v2.update(actual_seq_qlen=case["q_cum"], actual_seq_kvlen=case["kv_cum"])
    else:
        g = torch.Generator().manual_seed(2)
        q = torch.randn(2, nq, 1, d, generator=g).half()
        k, v = (torch.randn(2, nkv, 40, d, generator=g).half() for _ in range(2))
        v1, v2 = _v1_v2(nq, nkv, d, **common)
        v1["actual_seq_lengths_kv"] = v2["actual_seq_kvlen"] = case["kv_lens"]
    return q, k, v, v1, v2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(V1_V2_CASES))
def test_v2_equals_v1_bit_for_bit(name, backend):
    q, k, v, v1, v2 = _case_inputs(name)
    own = dict(backend=backend, q_block=16, kv_block=32) if interpreted(backend) else dict(
        backend=backend)
    q, k, v = on_device(backend, q, k, v)
    if "atten_mask" in v1:
        v1["atten_mask"] = v2["atten_mask"] = on_device(backend, v1["atten_mask"])[0]
    with skip_unsupported(backend):
        out1, lse1 = pasa_npu.fused_attention(q, k, v, **v1, **own)
    out2, lse2 = pasa_npu.fused_attention_v2(q, k, v, **v2, **own)
    assert torch.equal(out1, out2) and torch.equal(lse1, lse2)
    gold1 = pasa_npu.reference_attention(q.cpu(), k.cpu(), v.cpu(), **{
        key: (val.cpu() if isinstance(val, torch.Tensor) else val) for key, val in v1.items()})
    gold2 = pasa_npu.reference_attention_v2(q.cpu(), k.cpu(), v.cpu(), **{
        key: (val.cpu() if isinstance(val, torch.Tensor) else val) for key, val in v2.items()})
    assert torch.equal(gold1[0], gold2[0]) and torch.equal(gold1[1], gold2[1])


# ----------------------------------------------------------------------------- out_dtype


@pytest.mark.parametrize("backend", [b for b in ("torch", "ascendc-emu") if b in BACKENDS])
@pytest.mark.parametrize("dtype,out_dtype", [(torch.float16, torch.bfloat16),
                                             (torch.bfloat16, torch.float16),
                                             (torch.float16, torch.float16)])
def test_out_dtype_without_quantisation(backend, dtype, out_dtype):
    q, k, v, _, kw = _case_inputs("tnd-causal")
    q, k, v = (t.to(dtype) for t in (q, k, v))
    with skip_unsupported(backend):
        base, base_lse = pasa_npu.fused_attention_v2(q, k, v, **kw, backend=backend)
        out, lse = pasa_npu.fused_attention_v2(q, k, v, **kw, backend=backend, out_dtype=out_dtype)
    code = {torch.float16: 5, torch.bfloat16: 15}[out_dtype]
    by_code, _ = pasa_npu.fused_attention_v2(q, k, v, **kw, backend=backend, out_dtype=code)
    assert out.dtype == out_dtype and torch.equal(out, by_code)
    assert torch.equal(lse, base_lse)  # the LSE is float32 whatever the output
    # the same fp32 result rounded once to each dtype: within one ulp of the coarser one
    # (bf16 has 7 fraction bits) plus the fp16 rounding of the base
    tol = base.double().abs() * 2.0 ** -7 + out.double().abs() * 2.0 ** -10 + 1e-6
    assert bool(((out.double() - base.double()).abs() <= tol).all())
    if out_dtype == dtype:
        assert torch.equal(out, base)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.int8, 6, 1, "float16"])
def test_other_out_dtypes_are_refused(out_dtype):
    q, k, v, _, kw = _case_inputs("tnd-causal")
    error = TypeError if isinstance(out_dtype, str) else NotImplementedError
    with pytest.raises(error, match="out_dtype"):
        pasa_npu.fused_attention_v2(q, k, v, **kw, out_dtype=out_dtype)


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


#: (family of tests/test_golden.py's bounds, the case): packed causal prefill, and packed
#: decode rows with chunked prefill through a sliding window (sparse_mode 4)
SINK_CASES = {
    "tnd-causal": ("packed", dict(q_cum=[50, 250], kv_cum=[50, 250], sparse_mode=3)),
    "tnd-mixed-band": ("mixed", dict(q_cum=[1, 41, 42, 102], kv_cum=[90, 250, 330, 390],
                                     sparse_mode=4, pre=50, nxt=0)),
}


@pytest.fixture(scope="module")
def sink_golden():
    return {}


def _sink_case(cache, name, dtype):
    if (name, dtype) not in cache:
        _, case = SINK_CASES[name]
        q, k, v = _packed(3, case["q_cum"], case["kv_cum"], 4, 2, 32, dtype)
        sink = torch.tensor([-1.0, 0.5, 2.0, 4.0])  # from negligible to dominant
        kw = dict(num_query_heads=4, num_key_value_heads=2, softmax_scale=1 / math.sqrt(32),
                  input_layout="TND", actual_seq_qlen=case["q_cum"],
                  actual_seq_kvlen=case["kv_cum"], return_softmax_lse=True,
                  sparse_mode=case["sparse_mode"])
        if case["sparse_mode"]:
            kw["atten_mask"] = pasa_npu.compressed_causal_mask()
        if "pre" in case:
            kw.update(pre_tokens=case["pre"], next_tokens=case["nxt"])
        gold = dense_with_sinks(q, k, v, case["q_cum"], case["kv_cum"], kw["softmax_scale"],
                                sink, case["sparse_mode"], case.get("pre", INT_MAX),
                                case.get("nxt", INT_MAX))
        cache[(name, dtype)] = (q, k, v, sink, kw, gold)
    return cache[(name, dtype)]


@pytest.mark.parametrize("name", list(SINK_CASES))
def test_golden_with_sinks_matches_the_dense_softmax(name, sink_golden):
    q, k, v, sink, kw, (gold, gold_lse) = _sink_case(sink_golden, name, torch.float16)
    out, lse = pasa_npu.reference_attention_v2(q, k, v, learnable_sink=sink, **kw)
    assert torch.equal(torch.isfinite(lse), torch.isfinite(gold_lse))
    assert torch.allclose(out, gold, rtol=1e-12, atol=1e-12)
    finite = torch.isfinite(gold_lse)
    assert torch.allclose(lse[finite], gold_lse[finite], rtol=1e-12, atol=1e-12)
    without, without_lse = pasa_npu.reference_attention_v2(q, k, v, **kw)
    assert bool((lse[finite] > without_lse[finite]).all())  # the sink adds to every row's sum


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("algorithm", pasa_npu.ALGORITHM_NAMES)
@pytest.mark.parametrize("name", list(SINK_CASES))
def test_sinks_within_each_allocations_golden_bounds(name, algorithm, dtype, sink_golden):
    family, _ = SINK_CASES[name]
    q, k, v, sink, kw, (gold, gold_lse) = _sink_case(sink_golden, name, dtype)
    out, lse = pasa_npu.fused_attention_v2(q, k, v, learnable_sink=sink.to(torch.bfloat16),
                                           algorithm=algorithm, backend="torch", **kw)
    assert out.dtype == dtype and lse.dtype == torch.float32 and torch.isfinite(out).all()
    finite = torch.isfinite(gold_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    lse_err = float((lse.double() - gold_lse)[finite].abs().max())
    key = f"cpu/{dtype_name(dtype)}/{algorithm}/{family}"
    assert_measured(rel_rmse(out, gold), "golden-rmse", key, GOLDEN_FACTOR, f"{name}+sinks")
    assert_measured(lse_err, "golden-lse", key, GOLDEN_FACTOR, f"{name}+sinks")


def test_pasa_shift_never_moves_the_sink():
    """A sink far above every score takes (almost) all the mass: the output is ~0 and the
    LSE ~ the sink, under PASA's shift as without it; a sink far below changes nothing
    measurable."""
    q, k, v = _packed(4, [64], [64])
    _, kw = _v1_v2(4, 2, 32, input_layout="TND", actual_seq_qlen=[64], actual_seq_kvlen=[64])
    for algorithm in pasa_npu.ALGORITHM_NAMES:
        out, lse = pasa_npu.fused_attention_v2(q, k, v, learnable_sink=torch.full((4,), 30.0),
                                               algorithm=algorithm, backend="torch", **kw)
        assert float(out.abs().max()) < 1e-6
        assert float((lse - 30.0).abs().max()) < 0.05
        low, low_lse = pasa_npu.fused_attention_v2(q, k, v, learnable_sink=torch.full((4,), -60.0),
                                                   algorithm=algorithm, backend="torch", **kw)
        base, base_lse = pasa_npu.fused_attention_v2(q, k, v, algorithm=algorithm,
                                                     backend="torch", **kw)
        assert torch.equal(low, base) and torch.equal(low_lse, base_lse)


def test_sink_limits_and_other_backends():
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
    for backend in BACKENDS:
        if backend == "torch":
            continue
        qd, kd, vd, sink = on_device(backend, q, k, v, torch.zeros(4))
        with pytest.raises(NotImplementedError, match="learnable_sink"):
            pasa_npu.fused_attention_v2(qd, kd, vd, **kw, learnable_sink=sink, backend=backend)
