"""Every form of every argument the README's supported-arguments table documents: each
mask shape and dtype (decode's too, and masks larger than the problem), the optimized
mask's three shapes, lengths given once, per batch, with more than B entries and as a
tensor, strided inputs, the decode rules for sparse_mode and the tokens, and our tiling
and backend keywords. Each form is checked against an independent dense attention
(tests/_support.py) or against its canonical form, bit for bit, on every backend here."""
from __future__ import annotations

import pathlib
import re

import pytest
import torch

import pasa_npu
from _bounds import assert_same_allocation
from _support import (BACKENDS, assert_same_in_fp64, naive_attention, npu_visible, on_device,
                      skip_unsupported)

ROOT = pathlib.Path(__file__).resolve().parents[2]
B, NQ, NKV, S1, S2, D = 2, 4, 2, 12, 40, 16
SCALE = 0.3


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).half()


def _qkv(s1=S1, s2=S2):
    return _rand(B, NQ, s1, D, seed=1), _rand(B, NKV, s2, D, seed=2), _rand(B, NKV, s2, D, seed=3)


def _arguments(backend, q, **kw) -> dict:
    args = dict(num_heads=NQ, num_key_value_heads=NKV, input_layout="BNSD", scale=SCALE,
                softmax_lse_flag=True, kv_block=16, backend=backend, algorithm="pasa-exact",
                inner_precise=2 if q.shape[2] > 1 else 0)  # decode takes 0 or 1 only
    args.update(kw)
    return args


def _call(backend, q, k, v, **kw):
    args = _arguments(backend, q, **kw)
    if isinstance(args.get("atten_mask"), torch.Tensor):
        args["atten_mask"] = on_device(backend, args["atten_mask"])[0]
    with skip_unsupported(backend):
        out, lse = pasa_npu.fused_attention(*on_device(backend, q, k, v), **args)
    return out.cpu(), lse.cpu()


def _assert_identical(a, b, what):
    for x, y in zip(a, b):
        assert torch.equal(x, y), what


# --------------------------------------------------------------------------- masks

# A random (B, S1 + 3, S2 + 5) mask, larger than the problem (sliced to it), with a row
# that sees nothing; True = masked.
_BIG = torch.rand(B, S1 + 3, S2 + 5, generator=torch.Generator().manual_seed(4)) < 0.4
_BIG[:, 5] = True
_ONE = _BIG[:1]

#: name -> (the mask as passed, the (B, S1, S2) mask it means)
MASK_FORMS = {
    "(S1,S2) bool": (_ONE[0, :S1, :S2], _ONE[:, :S1, :S2].expand(B, -1, -1)),
    "(1,S1,S2) int8": (_ONE[:, :S1, :S2].to(torch.int8), _ONE[:, :S1, :S2].expand(B, -1, -1)),
    "(B,S1,S2) uint8": (_BIG[:, :S1, :S2].to(torch.uint8), _BIG[:, :S1, :S2]),
    "(1,1,S1,S2) bool": (_ONE[:, None, :S1, :S2], _ONE[:, :S1, :S2].expand(B, -1, -1)),
    "(B,1,S1,S2) int8": (_BIG[:, None, :S1, :S2].to(torch.int8), _BIG[:, :S1, :S2]),
    "larger (B,1,S1+3,S2+5) bool": (_BIG[:, None], _BIG[:, :S1, :S2]),
    "larger (S1+3,S2+5) uint8": (_ONE[0].to(torch.uint8), _ONE[:, :S1, :S2].expand(B, -1, -1)),
}


@pytest.mark.parametrize("form", list(MASK_FORMS))
def test_mask_forms_mean_what_the_table_says(form):
    """The golden's reading of each mask form against the dense attention of the mask
    written out by hand."""
    mask, meaning = MASK_FORMS[form]
    q, k, v = _qkv()
    gold, _ = pasa_npu.reference_attention(q, k, v, num_heads=NQ, num_key_value_heads=NKV,
                                           input_layout="BNSD", scale=SCALE, atten_mask=mask,
                                           inner_precise=2)
    want = naive_attention(q, k, v, SCALE, ~meaning, empty_rows_mean_v=False)
    assert_same_in_fp64(gold, want, form)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", list(MASK_FORMS))
def test_mask_forms_compute_as_the_canonical_mask(form, backend):
    """Every backend gives, for each form, its result for the (B, 1, S1, S2) bool mask."""
    mask, meaning = MASK_FORMS[form]
    q, k, v = _qkv()
    got = _call(backend, q, k, v, atten_mask=mask)
    _assert_identical(got, _call(backend, q, k, v, atten_mask=meaning[:, None].clone()), form)


DECODE_FORMS = {
    "(B,S2) bool": lambda m: m,
    "(B,1,S2) int8": lambda m: m[:, None].to(torch.int8),
    "(B,1,1,S2) uint8": lambda m: m[:, None, None].to(torch.uint8),
    "larger (B,S2+5) bool": lambda m: torch.cat([m, torch.ones(B, 5, dtype=torch.bool)], 1),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", list(DECODE_FORMS))
def test_decode_mask_forms(form, backend):
    """S1 = 1: a 2-D mask is (B, S2), not (S1, S2); each form masks the keys of its batch,
    in the golden (against the dense attention) and in every backend (as the canonical
    form)."""
    meaning = torch.rand(B, S2, generator=torch.Generator().manual_seed(6)) < 0.5
    mask = DECODE_FORMS[form](meaning)
    q, k, v = _qkv(s1=1)
    gold, _ = pasa_npu.reference_attention(q, k, v, num_heads=NQ, num_key_value_heads=NKV,
                                           input_layout="BNSD", scale=SCALE, atten_mask=mask)
    assert_same_in_fp64(gold, naive_attention(q, k, v, SCALE, ~meaning[:, None]), form)
    _assert_identical(_call(backend, q, k, v, atten_mask=mask),
                      _call(backend, q, k, v, atten_mask=meaning[:, None, None].clone()), form)


@pytest.mark.parametrize("backend", BACKENDS)
def test_optimized_mask_shapes(backend):
    """sparse_mode 2, 3 and 4 take torch_npu's 2048 x 2048 mask as (2048, 2048),
    (1, 2048, 2048) and (1, 1, 2048, 2048), all meaning the same."""
    q, k, v = _qkv()
    opt = pasa_npu.compressed_causal_mask()
    shapes = ((2048, 2048), (1, 2048, 2048), (1, 1, 2048, 2048))
    for mode, tokens in ((2, {}), (3, {}), (4, dict(pre_tokens=6, next_tokens=2))):
        base, *others = (_call(backend, q, k, v, atten_mask=opt.reshape(shape), sparse_mode=mode,
                               **tokens) for shape in shapes)
        for shape, got in zip(shapes[1:], others):
            _assert_identical(got, base, f"sparse_mode={mode} {shape}")
    vis = npu_visible(S1, S2, 4, 6, 2)[None].expand(B, -1, -1)
    for shape in shapes:
        gold, _ = pasa_npu.reference_attention(q, k, v, num_heads=NQ, num_key_value_heads=NKV,
                                               input_layout="BNSD", scale=SCALE, sparse_mode=4,
                                               atten_mask=opt.reshape(shape), pre_tokens=6,
                                               next_tokens=2, inner_precise=2)
        assert_same_in_fp64(gold, naive_attention(q, k, v, SCALE, vis, False), str(shape))


# --------------------------------------------------------------------------- lengths


@pytest.mark.parametrize("backend", BACKENDS)
def test_length_forms(backend):
    """One entry for every batch; exactly B; more than B (the first B count, as torch_npu);
    a tuple or an integer tensor as the list."""
    q, k, v = _qkv()
    per_batch = _call(backend, q, k, v, actual_seq_lengths=[9, 9], actual_seq_lengths_kv=[31, 31])
    _assert_identical(_call(backend, q, k, v, actual_seq_lengths=[9],
                            actual_seq_lengths_kv=[31]), per_batch, "one entry")
    ragged = _call(backend, q, k, v, actual_seq_lengths=[9, 4], actual_seq_lengths_kv=[31, 17])
    for extra in ([9, 4, 12, 1], [9, 4, 3]):
        _assert_identical(_call(backend, q, k, v, actual_seq_lengths=extra,
                                actual_seq_lengths_kv=[31, 17, 2, 40]), ragged,
                          f"more than B entries: {extra}")
    _assert_identical(_call(backend, q, k, v, actual_seq_lengths=(9, 4),
                            actual_seq_lengths_kv=torch.tensor([31, 17])), ragged,
                      "a tuple and a tensor")
    # and what the lengths mean, against the dense attention written out by hand
    vis = torch.zeros(B, S1, S2, dtype=torch.bool)
    vis[0, :9, :31] = True
    vis[1, :4, :17] = True
    gold, _ = pasa_npu.reference_attention(q, k, v, num_heads=NQ, num_key_value_heads=NKV,
                                           input_layout="BNSD", scale=SCALE, inner_precise=2,
                                           actual_seq_lengths=[9, 4, 12, 1],
                                           actual_seq_lengths_kv=[31, 17, 2, 40])
    assert_same_in_fp64(gold, naive_attention(q, k, v, SCALE, vis, False))


# --------------------------------------------------------------------------- inputs


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_inputs(backend):
    """Any strides: views with a strided head dim, a transposed storage and a broadcast
    batch compute what their contiguous copies compute."""
    q, k, v = _qkv()
    wide = _rand(B, NQ, S1, 2 * D, seed=9)
    q_strided = wide[..., ::2]                                   # stride 2 along D
    k_strided = _rand(B, S2, NKV, D, seed=2).transpose(1, 2)     # BSND storage, BNSD view
    v_strided = v[:1].expand(B, -1, -1, -1)                      # batch stride 0
    got = _call(backend, q_strided, k_strided, v_strided)
    want = _call(backend, *(t.contiguous() for t in (q_strided, k_strided, v_strided)))
    _assert_identical(got, want, "strided views")


def test_every_documented_layout_has_a_golden_case():
    """The README's input_layout row lists exactly the layouts the API accepts, and the
    golden matrix runs each of them."""
    from pasa_npu.options import LAYOUTS
    from test_golden import CASES

    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `input_layout`"))
    assert set(re.findall(r"[A-Z_]{3,}", row)) == set(LAYOUTS)
    assert {case["layout"] for case in CASES.values()} == set(LAYOUTS)


# --------------------------------------------------------------------------- decode rules


@pytest.mark.parametrize("kwargs,warns", [
    (dict(sparse_mode=2, atten_mask="opt"), True),
    (dict(sparse_mode=3, atten_mask="opt"), False),
    (dict(sparse_mode=4, atten_mask="opt", pre_tokens=3, next_tokens=0), True),
    (dict(atten_mask="decode", pre_tokens=3, next_tokens=0), True),
], ids=["mode2", "mode3", "mode4-tokens", "mode0-mask-tokens"])
def test_decode_ignores_sparse_mode_and_tokens(kwargs, warns):
    """S1 = 1: the sparse modes and the tokens change nothing; a warning says so where they
    would have mattered (bottom-right causal is the whole row in decode)."""
    q, k, v = _qkv(s1=1)
    kw = dict(num_heads=NQ, num_key_value_heads=NKV, input_layout="BNSD", scale=SCALE,
              softmax_lse_flag=True)
    if kwargs.get("atten_mask") == "decode":
        mask = torch.rand(B, S2, generator=torch.Generator().manual_seed(8)) < 0.5
        kw["atten_mask"] = mask
        kwargs = {key: value for key, value in kwargs.items() if key != "atten_mask"}
    plain = pasa_npu.fused_attention(q, k, v, **kw)
    if kwargs.get("atten_mask") == "opt":
        kwargs = dict(kwargs, atten_mask=pasa_npu.compressed_causal_mask())
    if warns:
        with pytest.warns(UserWarning, match="no effect"):
            got = pasa_npu.fused_attention(q, k, v, **kw, **kwargs)
    else:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = pasa_npu.fused_attention(q, k, v, **kw, **kwargs)
    _assert_identical(got, plain, str(kwargs))


# --------------------------------------------------------------------------- our keywords


def test_auto_backend_on_cpu_is_the_torch_backend():
    q, k, v = _qkv()
    _assert_identical(_call("auto", q, k, v), _call("torch", q, k, v), "backend auto")


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "triton"])  # Triton picks its own
@pytest.mark.parametrize("algorithm", pasa_npu.ALGORITHM_NAMES)
def test_q_block_never_changes_the_numbers(algorithm, backend):
    """Every statistic is per row: the query tile height changes no result. On the torch
    backend it changes how many rows each of torch's matmuls takes, which on some CPUs sums
    them in another order: there, within the derived bounds of one allocation summed in
    another order (tests/_bounds.py)."""
    q, k, v = _qkv(s1=40)
    kw = dict(algorithm=algorithm, sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask())
    tall, short = (_call(backend, q, k, v, q_block=n, **kw) for n in (32, 16))
    if backend != "torch":
        _assert_identical(short, tall, f"{algorithm} q_block")
        return
    assert_same_allocation(*short, *tall, algorithm, f"{algorithm} q_block",
                           call=(q, k, v, _arguments(backend, q, **kw)), kv_lens=[k.shape[2]],
                           kv_block=16)
