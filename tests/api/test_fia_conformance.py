"""One check per row of docs/fia-conformance.md: pasa_npu.fused_attention held against
torch_npu.npu_fused_infer_attention_score's documented behaviour, on every backend here.
Expected values come from the fp64 golden (pasa_npu.reference_attention), itself checked
against the rules written out in tests/_support.py; shapes stay small for the Triton
interpreter. Test names carry the row ids of the document (r01 ... ). Here r01-r19: the
signature, dtypes, layouts, heads and lengths; test_fia_conformance_masks.py: r20-r39."""
from __future__ import annotations

import inspect

import pytest
import torch

import pasa_npu
from _support import BACKENDS, INT_MAX
from _fia import D, _bnsd, _close, _gold, _rand, _run


# --- r01-r03: the signature and defaults -------------------------------------------------

FIA_DEFAULTS = dict(
    pse_shift=None, atten_mask=None, actual_seq_lengths=None, actual_seq_lengths_kv=None,
    dequant_scale1=None, quant_scale1=None, dequant_scale2=None, quant_scale2=None,
    quant_offset2=None, antiquant_scale=None, antiquant_offset=None, block_table=None,
    query_padding_size=None, kv_padding_size=None, key_antiquant_scale=None,
    key_antiquant_offset=None, value_antiquant_scale=None, value_antiquant_offset=None,
    key_shared_prefix=None, value_shared_prefix=None, actual_shared_prefix_len=None,
    query_rope=None, key_rope=None, key_rope_antiquant_scale=None, num_heads=1, scale=1.0,
    pre_tokens=INT_MAX, next_tokens=INT_MAX, input_layout="BSH", num_key_value_heads=0,
    sparse_mode=0, inner_precise=0, block_size=0, antiquant_mode=0, softmax_lse_flag=False,
    key_antiquant_mode=0, value_antiquant_mode=0)


def test_r01_signature_names_order_and_defaults():
    params = list(inspect.signature(pasa_npu.fused_attention).parameters.values())
    assert [p.name for p in params[:3]] == ["query", "key", "value"]
    fia = [(p.name, p.default) for p in params[3:3 + len(FIA_DEFAULTS)]]
    assert fia == list(FIA_DEFAULTS.items())


@pytest.mark.parametrize("backend", BACKENDS)
def test_r02_default_scale_is_one_and_layout_bsh(backend):
    q, k, v = _bnsd(b=1, n=1, nkv=1)
    bsh = [t.transpose(1, 2).flatten(2) for t in (q, k, v)]
    plain, _ = _run(backend, *bsh, num_heads=1, input_layout="BSH")
    explicit, _ = _run(backend, *bsh, num_heads=1, input_layout="BSH", scale=1.0)
    assert torch.equal(plain, explicit)
    _close(plain, _gold(*bsh, num_heads=1, input_layout="BSH")[0])


@pytest.mark.parametrize("name", [n for n, d in FIA_DEFAULTS.items()
                                  if n in pasa_npu.arguments.UNIMPLEMENTED_KEYWORDS])
def test_r03_unimplemented_features_raise(name):
    q, k, v = _bnsd()
    value = torch.ones(1) if FIA_DEFAULTS[name] is None else 1
    with pytest.raises(NotImplementedError, match=name):
        pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD", **{name: value})


# --- r04-r06: dtypes ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int8, torch.float32, torch.int32])
def test_r04_query_dtypes_other_than_fp16_bf16_raise(dtype):
    q, k, v = (t.to(dtype) for t in _bnsd())
    with pytest.raises(TypeError, match="query must be float16 or bfloat16"):
        pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_r05_output_dtype_and_value_head_dim(backend, dtype):
    q, k, v = _bnsd(dtype=dtype)
    out, lse = _run(backend, q, k, v, softmax_lse_flag=True)
    assert out.dtype == dtype and out.shape == q.shape and lse.dtype == torch.float32
    _close(out, _gold(q, k, v)[0], atol=6e-2)


def test_r06_key_value_dtype_must_match_query():
    q, k, v = _bnsd()
    with pytest.raises(TypeError, match="key dtype"):
        pasa_npu.fused_attention(q, k.bfloat16(), v, num_heads=2, input_layout="BNSD")


# --- r07-r10: layouts --------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD", "BNSD_BSND", "BSH_NBSD",
                                    "BSND_NBSD", "BNSD_NBSD"])
def test_r07_layouts_shapes_and_values(backend, layout):
    q, k, v = _bnsd()
    ref = _gold(q, k, v)[0]
    src = layout.split("_")[0]
    to = {"BNSD": lambda t: t, "BSND": lambda t: t.transpose(1, 2).contiguous(),
          "BSH": lambda t: t.transpose(1, 2).flatten(2).contiguous()}[src]
    out, _ = _run(backend, *(to(t) for t in (q, k, v)), num_heads=2, input_layout=layout)
    dst = layout.split("_")[-1]
    want = {"BNSD": ref, "BSND": ref.transpose(1, 2), "BSH": ref.transpose(1, 2).flatten(2),
            "NBSD": ref.permute(1, 0, 2, 3)}[dst]
    assert out.shape == want.shape
    _close(out, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["TND", "TND_NTD", "NTD_TND"])
def test_r08_packed_layouts(backend, layout):
    t, n = 9, 2
    q, k, v = (_rand(t, n, D, seed=s) for s in (1, 2, 3))
    kw = dict(num_heads=n, actual_seq_lengths=[4, 9], actual_seq_lengths_kv=[5, 9],
              softmax_lse_flag=True)
    inputs = (q, k, v) if layout != "NTD_TND" else tuple(x.transpose(0, 1) for x in (q, k, v))
    out, lse = _run(backend, *inputs, input_layout=layout, **kw)
    gold, gold_lse = _gold(*inputs, input_layout=layout, **kw)
    assert out.shape == gold.shape and lse.shape == (t, n, 1) == gold_lse.shape
    _close(out, gold)
    _close(lse, gold_lse)


def test_r09_bnsd_nbsd_takes_at_most_16_query_rows():
    q, k, v = _bnsd(s1=17)
    with pytest.raises(ValueError, match="BNSD_NBSD takes a query length of at most 16"):
        pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD_NBSD")
    out, _ = pasa_npu.fused_attention(q[:, :, :16], k, v, num_heads=2, input_layout="BNSD_NBSD")
    assert out.shape == (2, 2, 16, D)


def test_r10_packed_layouts_need_cumulative_lengths():
    q = k = v = _rand(6, 2, D)
    with pytest.raises(ValueError, match="actual_seq_lengths is required"):
        pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="TND",
                                 actual_seq_lengths_kv=[6])
    with pytest.raises(ValueError, match="non-decreasing"):
        pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="TND",
                                 actual_seq_lengths=[4, 3], actual_seq_lengths_kv=[3, 6])


# --- r11-r15: heads, head dim, batch -----------------------------------------------------

@pytest.mark.parametrize("kw, message", [
    (dict(num_heads=3, num_key_value_heads=2), "must be a multiple of num_key_value_heads"),
    (dict(num_heads=65, num_key_value_heads=1), "num_heads / num_key_value_heads must be at most 64"),
    (dict(num_heads=257, num_key_value_heads=257), "num_heads must be at most 256"),
])
def test_r11_head_counts(kw, message):
    n, nkv = kw["num_heads"], kw["num_key_value_heads"]
    q = torch.zeros(1, n, 2, D, dtype=torch.float16)
    k = v = torch.zeros(1, nkv, 3, D, dtype=torch.float16)
    with pytest.raises(ValueError, match=message):
        pasa_npu.fused_attention(q, k, v, input_layout="BNSD", **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_r12_gqa_and_default_kv_heads(backend):
    q, k, v = _bnsd(n=4, nkv=2)
    out, _ = _run(backend, q, k, v, num_key_value_heads=2)
    _close(out, _gold(q, k, v, num_key_value_heads=2)[0])
    q, k, v = _bnsd(n=2, nkv=2)
    a, _ = _run(backend, q, k, v, num_key_value_heads=0)
    b, _ = _run(backend, q, k, v, num_key_value_heads=2)
    assert torch.equal(a, b)


def test_r13_head_dim_at_most_512():
    q = k = v = torch.zeros(1, 1, 2, 520, dtype=torch.float16)
    with pytest.raises(ValueError, match="head dim must be at most 512"):
        pasa_npu.fused_attention(q, k, v, input_layout="BNSD")


def test_r14_batch_limits():
    q = k = v = torch.zeros(65537, 1, 1, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="batch must be at most 65536"):
        pasa_npu.fused_attention(q, k, v, input_layout="BNSD")
    q = k = v = torch.zeros(8, 1, 8, dtype=torch.float16)
    ends = [min(i, 8) for i in range(4097)]
    with pytest.raises(ValueError, match="at most 4096 entries"):
        pasa_npu.fused_attention(q, k, v, input_layout="TND", actual_seq_lengths=ends,
                                 actual_seq_lengths_kv=ends)


def test_r15_heads_must_match_the_tensors():
    q, k, v = _bnsd()
    with pytest.raises(ValueError, match="num_heads is 3"):
        pasa_npu.fused_attention(q, k, v, num_heads=3, input_layout="BNSD")


# --- r16-r19: actual sequence lengths ----------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_r16_lengths_broadcast_and_prefix(backend):
    q, k, v = _bnsd(b=2)
    one, _ = _run(backend, q, k, v, actual_seq_lengths=[4], actual_seq_lengths_kv=[7])
    both, _ = _run(backend, q, k, v, actual_seq_lengths=[4, 4, 99], actual_seq_lengths_kv=[7, 7])
    assert torch.equal(one, both)
    _close(one, _gold(q, k, v, actual_seq_lengths=[4], actual_seq_lengths_kv=[7])[0])
    with pytest.raises(ValueError, match="outside"):
        pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD",
                                 actual_seq_lengths=[7, 7])


@pytest.mark.parametrize("backend", BACKENDS)
def test_r17_rows_past_the_query_length_are_zero(backend):
    q, k, v = _bnsd(b=2)
    out, lse = _run(backend, q, k, v, actual_seq_lengths=[6, 3], softmax_lse_flag=True)
    assert (out[1, :, 3:] == 0).all() and (lse[1, :, 3:] == 0).all()
    gold, gold_lse = _gold(q, k, v, actual_seq_lengths=[6, 3], softmax_lse_flag=True)
    _close(out, gold)
    _close(lse, gold_lse)


@pytest.mark.parametrize("backend", BACKENDS)
def test_r18_decode_ignores_actual_seq_lengths(backend):
    """S1 = 1, not packed: actual_seq_lengths has no effect (issue item 3)."""
    q, k, v = _bnsd(b=2, s1=1)
    plain, plain_lse = _run(backend, q, k, v, softmax_lse_flag=True)
    given, given_lse = _run(backend, q, k, v, actual_seq_lengths=[0, 1], softmax_lse_flag=True)
    assert torch.equal(plain, given) and torch.equal(plain_lse, given_lse)
    assert (given[0] != 0).any()
    gold, _ = _gold(q, k, v, actual_seq_lengths=[0, 1])
    _close(given, gold)
    assert (gold[0] != 0).any()


@pytest.mark.parametrize("bad", ["12", 3, [1.5], torch.tensor([1.0]), torch.ones(1, 2).long()])
def test_r18_decode_checks_the_type_of_the_lengths_it_ignores(bad):
    """Ignored in decode, actual_seq_lengths is still checked as torch_npu's schema checks
    it: a value that is no list of ints is refused, by name, with host kv lengths and with
    kv lengths left on the device (planned at the capacity, never read)."""
    q, k, v = _bnsd(b=2, s1=1)
    with pytest.raises(TypeError, match="actual_seq_lengths must be a list of ints"):
        pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD",
                                 actual_seq_lengths=bad)
    call = pasa_npu.arguments.bind("fused_attention", q, k, v, dict(
        num_heads=2, input_layout="BNSD", actual_seq_lengths=bad,
        actual_seq_lengths_kv=torch.tensor([3, 5])))
    with pytest.raises(TypeError, match="actual_seq_lengths must be a list of ints"):
        pasa_npu.planner.make_plan(call, False, None, True, True,
                                   device_lengths=("actual_seq_lengths_kv",))


def test_r19_paged_kv_needs_kv_lengths_and_block_size_rules():
    q = _rand(1, 2, 2, D)
    cache = _rand(4, 128, 2 * D)
    table = torch.arange(4, dtype=torch.int32)[None]
    with pytest.raises(ValueError, match="actual_seq_lengths_kv is required"):
        pasa_npu.fused_attention(q, cache, cache, num_heads=2, input_layout="BNSD",
                                 block_table=table, block_size=128)
    cache = _rand(4, 64, 2 * D)
    with pytest.raises(ValueError, match="block_size must be a multiple of 128"):
        pasa_npu.fused_attention(q, cache, cache, num_heads=2, input_layout="BNSD",
                                 block_table=table, block_size=64, actual_seq_lengths_kv=[100])
