"""pasa_npu.fused_attention_v2, the drop-in for torch_npu.npu_fused_infer_attention_score_v2:
its signature (v1's table renamed, plus v2's additions), the same results as v1 bit for bit on
every backend here, out_dtype and the refusals. Learnable sinks: test_fia_v2_sinks.py."""
from __future__ import annotations

import inspect

import pytest
import torch

import pasa_npu
from _support import BACKENDS, interpreted, on_device, skip_unsupported
from _fia import _packed, _v1_v2
from pasa_npu import arguments


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


@pytest.mark.parametrize("entry", ["fused_attention_v2", "plan_v2", "reference_attention_v2"])
@pytest.mark.parametrize("keywords, error, message", [
    (dict(return_softmax_lse=1), TypeError, "^return_softmax_lse must be a bool, got 1"),
    (dict(num_query_heads=0), ValueError, "^num_query_heads must be >= 1, got 0"),
    (dict(softmax_scale="x"), TypeError, "^softmax_scale must be a float, got 'x'"),
    (dict(actual_seq_qlen=[3, 2]), ValueError, "^actual_seq_qlen must be non-decreasing"),
    (dict(actual_seq_kvlen=[5, 10]), ValueError, "^actual_seq_kvlen ends at 10"),
])
def test_v2_errors_name_v2_arguments(entry, keywords, error, message):
    """A v2 call's refusals name its arguments as v2 does, not as the v1 call it becomes."""
    q, k, v = (torch.randn(9, 2, 16).half() for _ in range(3))
    call = dict(dict(num_query_heads=2, input_layout="TND", actual_seq_qlen=[4, 9],
                     actual_seq_kvlen=[4, 9]), **keywords)
    with pytest.raises(error, match=message):
        getattr(pasa_npu, entry)(q, k, v, **call)
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_heads'"):
        getattr(pasa_npu, entry)(q, k, v, num_heads=2)


def test_a_v2_plans_run_names_v2_arguments():
    q, k, v = (torch.randn(9, 2, 16).half() for _ in range(3))
    planned = pasa_npu.plan_v2(q, k, v, num_query_heads=2, input_layout="TND",
                               actual_seq_qlen=[4, 9], actual_seq_kvlen=[4, 9])
    with pytest.raises(ValueError, match="^actual_seq_qlen ends at 9"):
        planned.run(q[:7], k, v)
