"""The public API: torch_npu signature compatibility, unimplemented keywords, bad input."""
from __future__ import annotations

import inspect
import re

import pytest
import torch

import pasa_npu
from pasa_npu.arguments import OWN_KEYWORDS, UNIMPLEMENTED_KEYWORDS

# torch_npu.npu_fused_infer_attention_score's schema as torch_npu's op-plugin documentation
# of the operator gives it.
TORCH_NPU_SCHEMA = (
    "npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, "
    "Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, "
    "SymInt[]? actual_seq_lengths_kv=None, Tensor? dequant_scale1=None, "
    "Tensor? quant_scale1=None, Tensor? dequant_scale2=None, Tensor? quant_scale2=None, "
    "Tensor? quant_offset2=None, Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, "
    "Tensor? block_table=None, Tensor? query_padding_size=None, Tensor? kv_padding_size=None, "
    "Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, "
    "Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, "
    "Tensor? key_shared_prefix=None, Tensor? value_shared_prefix=None, "
    "SymInt[]? actual_shared_prefix_len=None,Tensor? query_rope=None, Tensor? key_rope=None, "
    "Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "
    "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
    "int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, "
    "int antiquant_mode=0, bool softmax_lse_flag=False, int key_antiquant_mode=0, "
    "int value_antiquant_mode=0) -> (Tensor, Tensor)"
)


def _schema_params():
    body = TORCH_NPU_SCHEMA[TORCH_NPU_SCHEMA.index("(") + 1:TORCH_NPU_SCHEMA.index(") ->")]
    positional, keywords = body.split("*,")
    pos = [p.split()[-1] for p in positional.split(",") if p.strip()]
    kw = []
    for p in keywords.split(","):
        m = re.match(r"\s*\S+\s+(\w+)=(.+)\s*$", p)
        raw = m.group(2).strip()
        default = None if raw == "None" else eval(raw)  # literals only: ints, floats, str, bool
        if raw in ("False", "True"):
            default = raw == "True"
        kw.append((m.group(1), default))
    return pos, kw


def test_signature_matches_torch_npu():
    pos, kw = _schema_params()
    params = list(inspect.signature(pasa_npu.fused_attention).parameters.values())
    assert [p.name for p in params[:3]] == pos
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[:3])
    ours = {p.name: p for p in params[3:]}
    assert all(p.kind is p.KEYWORD_ONLY for p in ours.values())
    for name, default in kw:
        assert name in ours, f"missing torch_npu keyword {name}"
        assert ours[name].default == default and type(ours[name].default) is type(default), name
    extra = set(ours) - {n for n, _ in kw}
    assert extra == set(OWN_KEYWORDS)
    # order of torch_npu's keywords preserved, ours after them
    assert [p.name for p in params[3:3 + len(kw)]] == [n for n, _ in kw]


def _small():
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, 8, 16, generator=g).half() for _ in range(3))


@pytest.mark.parametrize("name", sorted(UNIMPLEMENTED_KEYWORDS))
def test_unimplemented_keywords_raise(name):
    q, k, v = _small()
    value = 1 if UNIMPLEMENTED_KEYWORDS[name] == 0 else torch.zeros(1)
    with pytest.raises(NotImplementedError, match=name):
        pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD", **{name: value})


def test_unimplemented_keywords_cover_every_other_torch_npu_keyword():
    _, kw = _schema_params()
    implemented = {"atten_mask", "actual_seq_lengths", "actual_seq_lengths_kv", "num_heads",
                   "scale", "pre_tokens", "next_tokens", "input_layout", "num_key_value_heads",
                   "sparse_mode", "inner_precise", "softmax_lse_flag", "block_table",
                   "block_size"}
    assert {n for n, _ in kw} - implemented == set(UNIMPLEMENTED_KEYWORDS)


BAD = [
    (dict(query="x"), TypeError, "query must be a torch.Tensor"),
    (dict(dtype=torch.float32), TypeError, "query must be float16 or bfloat16"),
    (dict(key_dtype=torch.bfloat16), TypeError, "key dtype"),
    (dict(input_layout="BHSD"), ValueError, "input_layout must be one of"),
    (dict(input_layout=3), TypeError, "input_layout must be a str"),
    (dict(query_shape=(1, 2, 8)), ValueError, "query must be 4-D for input_layout BNSD"),
    (dict(num_heads=4), ValueError, "query has 2 heads .* num_heads is 4"),
    (dict(num_heads=0), ValueError, "num_heads must be >= 1"),
    (dict(num_heads=2.0), TypeError, "num_heads must be an int"),
    (dict(num_key_value_heads=3, num_heads=2), ValueError, "multiple of num_key_value_heads"),
    (dict(key_shape=(2, 2, 8, 16)), ValueError, "key batch 2 differs"),
    (dict(key_shape=(1, 2, 8, 32)), ValueError, "key head dim 32 differs"),
    (dict(value_shape=(1, 2, 9, 16)), ValueError, "value .* differs from key"),
    (dict(scale=0.0), ValueError, "scale must be finite and positive"),
    (dict(scale=float("nan")), ValueError, "scale must be finite and positive"),
    (dict(scale="1"), TypeError, "scale must be a float"),
    (dict(inner_precise=4), ValueError, "inner_precise must be 0, 1, 2 or 3"),
    (dict(sparse_mode=5), ValueError, "sparse_mode must be 0-4"),
    (dict(sparse_mode=3), ValueError, "sparse_mode=3 needs torch_npu's optimized"),
    (dict(sparse_mode=3, atten_mask=torch.ones(8, 8, dtype=torch.bool)), ValueError,
     "optimized mask of shape"),
    (dict(sparse_mode=2, atten_mask=torch.ones(2048, 2048, dtype=torch.bool)), ValueError,
     "strict upper triangle"),
    (dict(sparse_mode=1), ValueError, "sparse_mode=1 .* needs the full atten_mask"),
    (dict(atten_mask=torch.ones(8, 8)), TypeError, "atten_mask must be bool, int8 or uint8"),
    (dict(atten_mask=torch.ones(4, 8, dtype=torch.bool)), ValueError, "atten_mask shape"),
    (dict(atten_mask=torch.ones(1, 2, 8, 8, dtype=torch.bool)), ValueError,
     r"\(B or 1, 1, S1, S2\)"),
    (dict(sparse_mode=4, atten_mask="opt", pre_tokens=-1, next_tokens=-1), ValueError,
     "cannot both be negative"),
    (dict(sparse_mode=4, atten_mask="opt", pre_tokens=2, next_tokens=-5), ValueError,
     "band is empty"),
    (dict(actual_seq_lengths=[9]), ValueError, r"actual_seq_lengths\[0\] = 9 is outside"),
    (dict(actual_seq_lengths_kv=[3, 4], batch_of_3=True), ValueError,
     "must have 1 or at least batch=3"),
    (dict(actual_seq_lengths=[1.5]), TypeError, "actual_seq_lengths must be a list of ints"),
    (dict(algorithm="pasa2"), ValueError, "algorithm must be one of"),
    (dict(algorithm="fa-fp32", beta=0.5), ValueError, "beta applies to pasa"),
    (dict(algorithm="pasa-exact", beta=0.5), ValueError, "pasa-exact always shifts fully"),
    (dict(algorithm="pasa", beta=1.0), ValueError, r"beta must lie in \[0, 1\)"),
    (dict(backend="cuda"), ValueError, "backend must be one of"),
    (dict(backend="npu"), RuntimeError, "backend 'npu' runs on npu tensors, got tensors on cpu"),
    (dict(rounding_guard=1), TypeError, "rounding_guard must be a bool"),
    (dict(softmax_lse_flag=1), TypeError, "softmax_lse_flag must be a bool"),
    (dict(kv_block=1), ValueError, "kv_block must be >= 2"),
    (dict(kv_block=2 ** 20), ValueError, "kv_block must be <= 8192"),
    (dict(q_block=2 ** 70), ValueError, "q_block must be <= 8192"),
    (dict(atten_mask=torch.zeros(8, 8, dtype=torch.bool), pre_tokens=2 ** 63), ValueError,
     r"pre_tokens must be <= 9223372036854775807 \(torch_npu's int64\), got 9223372036854775808"),
    (dict(sparse_mode=4, atten_mask="opt", next_tokens=2 ** 64), ValueError,
     "next_tokens must be <= 9223372036854775807"),
    (dict(actual_seq_lengths_kv=torch.tensor(8)), TypeError,
     r"actual_seq_lengths_kv must be a list of ints or a 1-D integer tensor, got a tensor of shape \(\)"),
    (dict(actual_seq_lengths=torch.tensor([8], device="meta")), ValueError,
     "actual_seq_lengths is on meta but query is on cpu"),
    (dict(inner_precise=1, scale=1e-8), ValueError,
     r"no beta solves PASA's optimal accuracy condition for scale=1e-08 and kv_block=128: .*pass "
     r"beta in \[0, 1\), or algorithm='pasa-exact' or 'fa-fp32' \(algorithm 'pasa', which "
     r"algorithm=None picks for inner_precise=1 and torch.float16 inputs\)"),
    (dict(algorithm="pasa-mixed", scale=7e4), ValueError, "no beta solves .* scale=70000.0"),
    (dict(dtype=torch.bfloat16, inner_precise=1, beta=0.5), ValueError,
     "algorithm 'fa-fp32', which algorithm=None picks for inner_precise=1 and torch.bfloat16 "
     "inputs, takes beta=None"),
]


@pytest.mark.parametrize("spec,exc,message", BAD, ids=[m for _, _, m in BAD])
def test_bad_input_names_the_argument(spec, exc, message):
    spec = dict(spec)
    g = torch.Generator().manual_seed(0)
    batch = 3 if spec.pop("batch_of_3", False) else 1
    dtype = spec.pop("dtype", torch.float16)
    q = torch.randn(spec.pop("query_shape", (batch, 2, 8, 16)), generator=g).to(dtype)
    k = torch.randn(spec.pop("key_shape", (batch, 2, 8, 16)), generator=g).to(
        spec.pop("key_dtype", dtype))
    v = torch.randn(spec.pop("value_shape", (batch, 2, 8, 16)), generator=g).to(dtype)
    if "query" in spec:
        q = spec.pop("query")
    if spec.get("atten_mask") == "opt":
        spec["atten_mask"] = pasa_npu.compressed_causal_mask()
    kw = dict(num_heads=2, input_layout="BNSD")
    kw.update(spec)
    with pytest.raises(exc, match=message):
        pasa_npu.fused_attention(q, k, v, **kw)


def test_packed_layout_errors():
    q = torch.randn(10, 2, 16).half()
    with pytest.raises(ValueError, match="actual_seq_lengths is required with packed layouts"):
        pasa_npu.fused_attention(q, q, q, num_heads=2, input_layout="TND")
    with pytest.raises(ValueError, match="non-decreasing"):
        pasa_npu.fused_attention(q, q, q, num_heads=2, input_layout="TND",
                                 actual_seq_lengths=[5, 3], actual_seq_lengths_kv=[5, 10])
    with pytest.raises(ValueError, match="holds only T=10 tokens"):
        pasa_npu.fused_attention(q, q, q, num_heads=2, input_layout="TND",
                                 actual_seq_lengths=[5, 11], actual_seq_lengths_kv=[5, 10])
    with pytest.raises(ValueError, match="has 1 entries but actual_seq_lengths has 2"):
        pasa_npu.fused_attention(q, q, q, num_heads=2, input_layout="TND",
                                 actual_seq_lengths=[5, 10], actual_seq_lengths_kv=[10])
    with pytest.raises(ValueError, match="packed layouts .* with an atten_mask"):
        pasa_npu.fused_attention(q, q, q, num_heads=2, input_layout="TND",
                                 actual_seq_lengths=[10], actual_seq_lengths_kv=[10],
                                 atten_mask=torch.zeros(10, 10, dtype=torch.bool))


def test_reference_attention_takes_torch_npu_arguments_only():
    q, k, v = _small()
    with pytest.raises(TypeError, match="torch_npu's arguments only"):
        pasa_npu.reference_attention(q, k, v, num_heads=2, input_layout="BNSD", algorithm="pasa")
    with pytest.raises(TypeError, match="unexpected keyword"):
        pasa_npu.reference_attention(q, k, v, num_heads=2, input_layout="BNSD", scale_value=1.0)
    out, _ = pasa_npu.reference_attention(q, k, v, num_heads=2, input_layout="BNSD")
    assert out.dtype == torch.float64


# ---- the plan cache: a repeated argument set skips validation, so nothing it skips may change


def _call(q, k, v, **kw):
    return pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD", **kw)


def test_cached_plan_still_rejects_changed_arguments():
    q, k, v = _small()
    _call(q, k, v)
    _call(q, k, v)  # a cache hit
    with pytest.raises(TypeError, match="num_heads must be an int"):
        pasa_npu.fused_attention(q, k, v, num_heads=True, num_key_value_heads=2,
                                 input_layout="BNSD")
    _call(q, k, v, inner_precise=1, softmax_lse_flag=False)
    with pytest.raises(TypeError, match="inner_precise must be an int"):
        _call(q, k, v, inner_precise=True, softmax_lse_flag=False)  # True == 1 for a dict
    with pytest.raises(TypeError, match="softmax_lse_flag must be a bool"):
        _call(q, k, v, inner_precise=1, softmax_lse_flag=0)
    with pytest.raises(ValueError, match="query must be 4-D"):
        _call(q[0], k, v)
    with pytest.raises(ValueError, match="key head dim"):
        _call(q, torch.cat([k, k], -1), v)


def test_cached_plan_revalidates_a_mask_changed_in_place():
    q, k, v = _small()
    mask = pasa_npu.compressed_causal_mask()
    _call(q, k, v, sparse_mode=3, atten_mask=mask)
    _call(q, k, v, sparse_mode=3, atten_mask=mask)
    mask[0, 1] = False  # bumps the tensor's version
    with pytest.raises(ValueError, match="strict upper triangle"):
        _call(q, k, v, sparse_mode=3, atten_mask=mask)
    other = torch.ones(2048, 2048, dtype=torch.bool)  # same metadata, another tensor
    with pytest.raises(ValueError, match="strict upper triangle"):
        _call(q, k, v, sparse_mode=3, atten_mask=other)


def test_a_full_bool_mask_is_cached_by_identity_and_version():
    """sparse_mode 0/1 with a bool mask: the same tensor unchanged reuses its plan, whose
    results are the golden's; written in place (a new version) or another tensor, a new
    plan with the new contents. An int8 mask (held converted) is never cached, and at most
    a few full masks stay cached."""
    from pasa_npu import plans

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 12, 16, generator=g).half() for _ in range(3))
    mask = torch.rand(2, 12, 12, generator=g) < 0.3
    mask[..., 0] = False  # every row sees a key
    plans.clear()

    def check(m, sparse_mode=0):
        kw = dict(num_heads=2, input_layout="BNSD", sparse_mode=sparse_mode, atten_mask=m,
                  softmax_lse_flag=True)
        call = pasa_npu.arguments.bind("fused_attention", q, k, v, kw)
        plan = plans.plan_for(call, golden=False)
        got = pasa_npu.fused_attention(q, k, v, **kw)
        want = pasa_npu.reference_attention(q, k, v, **kw)
        torch.testing.assert_close(got[0].double(), want[0], atol=2e-3, rtol=0)
        return plan

    first = check(mask)
    assert check(mask) is first
    assert check(mask, sparse_mode=1) is not first
    mask[1, 3, 5:] = True  # in place: a new version, a new plan that reads it
    assert check(mask) is not first
    assert check(mask.clone()) is not check(mask)
    as_int8 = mask.to(torch.int8)
    assert check(as_int8) is not check(as_int8)
    masks = [mask.clone() for _ in range(plans._FULL_MASK_PLANS + 1)]
    kept = [check(m) for m in masks]
    assert check(masks[-1]) is kept[-1] and check(masks[0]) is not kept[0]
    assert len(plans._FULL_MASK_KEYS) == plans._FULL_MASK_PLANS


def test_the_recent_plans_go_only_to_calls_of_their_arguments():
    """The two latest argument sets' plans are found without building a key: calls that
    alternate between them each get their own; a call that differs in a value, in a type
    (True for 1), in a mask's version or in an input's strides, or that passes a tensor
    where they had a scalar, gets another plan."""
    from pasa_npu import plans

    q, k, v = _small()
    mask = pasa_npu.compressed_causal_mask()
    base = dict(num_heads=2, input_layout="BNSD", sparse_mode=3, atten_mask=mask)

    def plan(q=q, **kw):
        return plans.plan_for(pasa_npu.arguments.bind("fused_attention", q, k, v,
                                                      {**base, **kw}), golden=False)

    plans.clear()
    first, second = plan(), plan(softmax_lse_flag=True)
    for _ in range(2):
        assert plan() is first and plan(softmax_lse_flag=True) is second
    assert plan(scale=0.5) is not first
    with_one = plan(inner_precise=1)
    assert plan(inner_precise=1) is with_one
    with pytest.raises(TypeError, match="inner_precise must be an int"):
        plan(inner_precise=True)  # equal to the latest call's 1, but validated
    strided = q.transpose(2, 3).contiguous().transpose(2, 3)
    assert plan(q=strided) is not first
    assert plan(actual_seq_lengths=torch.tensor([5])) is not first
    mask[0, 1] = False  # a new version: the plan validates the mask again
    with pytest.raises(ValueError, match="strict upper triangle"):
        plan()


def test_cached_plan_warns_on_every_call():
    q, k, v = _small()
    for _ in range(2):
        with pytest.warns(UserWarning, match="pre_tokens/next_tokens have no effect"):
            _call(q, k, v, pre_tokens=3)


def test_warnings_name_the_callers_line():
    """A warning about an argument points at the user's call, for fused_attention and for
    plan, so that Python's default filter shows it once per such line."""
    q, k, v = _small()
    for entry in (pasa_npu.fused_attention, pasa_npu.plan):
        with pytest.warns(UserWarning, match="pre_tokens/next_tokens have no effect") as caught:
            line = inspect.currentframe().f_lineno + 1
            entry(q, k, v, num_heads=2, input_layout="BNSD", pre_tokens=3)
        assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]


def test_cached_plan_keeps_the_per_call_range_check():
    q, k, v = (t.bfloat16() for t in _small())
    _call(q, k, v, algorithm="pasa-exact")
    with pytest.raises(ValueError, match="beyond fp16"):
        _call(q * 1e6, k, v, algorithm="pasa-exact")


def test_cached_plan_gives_the_uncached_result():
    from pasa_npu import plans

    q, k, v = _small()
    lens = dict(actual_seq_lengths=[5], actual_seq_lengths_kv=[7], softmax_lse_flag=True)
    first = _call(q, k, v, **lens)
    plans.clear()
    fresh = _call(q, k, v, **lens)
    again = _call(q, k, v, **lens)
    for a, b, c in zip(first, fresh, again):
        assert torch.equal(a, b) and torch.equal(b, c)


@pytest.mark.parametrize("layout", ["BNSD", "TND"])
@pytest.mark.parametrize("sparse_mode", [0, 3, 4])
def test_new_lengths_reuse_the_argument_plan(layout, sparse_mode):
    """A decode loop's lengths change every call: the plan of the same arguments is
    reused with the new lengths (and the band they set), and gives what a plan made from
    scratch gives; lengths out of range are still refused."""
    from pasa_npu import plans

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 12, 16, generator=g).half() for _ in range(3))
    kw = dict(num_heads=2, softmax_lse_flag=True, sparse_mode=sparse_mode)
    if sparse_mode:
        kw.update(atten_mask=pasa_npu.compressed_causal_mask(), pre_tokens=5, next_tokens=1)
    if layout == "TND":
        q, k, v = (t.transpose(1, 2).reshape(24, 2, 16) for t in (q, k, v))
        lengths = [dict(actual_seq_lengths=[5, 12], actual_seq_lengths_kv=[7, 19]),
                   dict(actual_seq_lengths=[4, 12], actual_seq_lengths_kv=[9, 20])]
        too_long = dict(actual_seq_lengths=[4, 12], actual_seq_lengths_kv=[9, 25])
    else:
        lengths = [dict(actual_seq_lengths=[5, 12], actual_seq_lengths_kv=[7, 12]),
                   dict(actual_seq_lengths=[3, 9], actual_seq_lengths_kv=[12, 10])]
        too_long = dict(actual_seq_lengths=[3, 9], actual_seq_lengths_kv=[13, 10])
    call = lambda **lens: pasa_npu.fused_attention(q, k, v, input_layout=layout, **kw, **lens)  # noqa: E731
    plans.clear()
    for lens in lengths:
        reused = call(**lens)
        cached = list(plans.PLANS.values())
        assert len(cached) == 1 and len(cached[0]) == lengths.index(lens) + 1
        plans.clear()
        fresh = call(**lens)
        for a, b in zip(reused, fresh):
            assert torch.equal(a, b)
        call(**lengths[0])  # the plan the next lengths derive from
    with pytest.raises(ValueError, match=r"actual_seq_lengths_kv.* (is outside|ends at)"):
        call(**too_long)


def test_emulated_backend_says_how_to_turn_its_emulator_on(monkeypatch):
    from pasa_npu import backends

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="only through its emulator: set TRITON_INTERPRET=1"):
        backends.resolve("triton", torch.device("cpu"))
    assert "triton" not in backends.available_backends("cpu", emulated=True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert backends.resolve("triton", torch.device("cpu")).name == "triton"
    assert "triton" not in backends.available_backends("cpu")  # never a default on CPU


def test_error_messages_describe_arrays_and_long_values_briefly():
    import numpy as np
    q = torch.zeros(1, 2, 8, 16, dtype=torch.float16)
    with pytest.raises(TypeError) as info:
        pasa_npu.fused_attention(np.zeros((1, 2, 400, 16)), q, q, num_heads=2,
                                 input_layout="BNSD")
    message = str(info.value)
    assert "numpy.ndarray of shape (1, 2, 400, 16) and dtype float64" in message
    assert len(message) < 200, message
    with pytest.raises(TypeError, match=r"scale must be a float, got '1{76}\.\.\.$"):
        pasa_npu.fused_attention(q, q, q, num_heads=2, input_layout="BNSD", scale="1" * 500)


def test_backends_without_a_backward_pass_refuse_inputs_that_require_grad():
    """The torch backend's outputs carry autograd (README, "Supported arguments"); every
    other backend available here raises, naming itself and the input, unless grad is off."""
    from pasa_npu.backends import BACKENDS, available_backends
    gen = torch.Generator().manual_seed(0)
    kw = dict(num_heads=2, input_layout="BNSD", algorithm="pasa-exact")
    for name in available_backends("cpu", emulated=True):
        for role in ("query", "key", "value"):
            q, k, v = (torch.randn(1, 2, 32, 16, generator=gen).half() for _ in range(3))
            inputs = dict(query=q, key=k, value=v)
            inputs[role].requires_grad_()
            if name == "torch":
                out, _ = pasa_npu.fused_attention(**inputs, backend=name, **kw)
                assert out.requires_grad
                continue
            with pytest.raises(NotImplementedError, match=rf"backend '{name}' has no backward "
                               rf"pass, and {role} requires grad"):
                pasa_npu.fused_attention(**inputs, backend=name, **kw)
        if name != "torch":  # the same inputs computed where grad is off (once: the
            with torch.no_grad():  # simulator takes seconds a call)
                out, _ = pasa_npu.fused_attention(**inputs, backend=name, **kw)
            assert not out.requires_grad
    assert [name for name, b in BACKENDS.items() if b.backward] == ["torch"]


def test_backends_without_a_backward_pass_refuse_sinks_that_require_grad():
    """A learnable sink is a parameter a model trains: where the backend has no backward
    pass it is refused by name, as the inputs are; the torch backend's sink gradient flows."""
    from pasa_npu.backends import available_backends
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(12, 2, 16, generator=gen).half() for _ in range(3))
    kw = dict(num_query_heads=2, input_layout="TND", actual_seq_qlen=[12],
              actual_seq_kvlen=[12], algorithm="pasa-exact")
    for name in available_backends("cpu", emulated=True):
        sink = torch.zeros(2, requires_grad=True)
        if name == "torch":
            out, _ = pasa_npu.fused_attention_v2(q, k, v, learnable_sink=sink, backend=name, **kw)
            out.float().sum().backward()
            assert sink.grad is not None and torch.isfinite(sink.grad).all()
            continue
        with pytest.raises(NotImplementedError, match=rf"backend '{name}' has no backward "
                           rf"pass, and learnable_sink requires grad"):
            pasa_npu.fused_attention_v2(q, k, v, learnable_sink=sink, backend=name, **kw)
