"""torch_npu semantics, checked against an independent dense attention (tests/_support.py):
sparse modes, layouts, GQA, packed lengths, row rules, LSE, decode, bf16, the guard."""
from __future__ import annotations


import pytest
import torch

import pasa_npu
from _support import (BACKENDS, INT_MAX, assert_measured, assert_same_in_fp64, device_kind,
                      naive_attention, npu_visible, on_device, rel_rmse, skip_unsupported)
from _bounds import row_scale_ulps

# The accuracy checks here hold each error within SEMANTICS_FACTOR x its measured value
# (tests/measured.json, "semantics"); they guard the rules, which the exact comparisons
# with the dense attention written in tests/_support.py check.
SEMANTICS_FACTOR = 2


def _rand(*shape, seed=0, dtype=torch.float16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _bnsd(b=2, nq=2, nkv=2, s1=70, s2=150, d=32, seed=0, dtype=torch.float16):
    return (_rand(b, nq, s1, d, seed=seed, dtype=dtype), _rand(b, nkv, s2, d, seed=seed + 1, dtype=dtype),
            _rand(b, nkv, s2, d, seed=seed + 2, dtype=dtype))


OPT = pasa_npu.compressed_causal_mask()


@pytest.mark.parametrize("mode,pre,nxt,s1,s2,q_lens,kv_lens", [
    (2, INT_MAX, INT_MAX, 90, 90, None, None),
    (2, INT_MAX, INT_MAX, 60, 140, None, None),
    (3, INT_MAX, INT_MAX, 60, 140, None, None),
    (3, INT_MAX, INT_MAX, 140, 60, None, None),
    (3, INT_MAX, INT_MAX, 80, 150, [80, 33], [150, 101]),
    (4, 20, 0, 100, 100, None, None),
    (4, 30, 5, 60, 130, [60, 41], [130, 77]),
    (4, 50, -10, 70, 90, None, None),
    (4, -5, 40, 70, 90, None, None),
])
def test_sparse_modes_follow_torch_npu(mode, pre, nxt, s1, s2, q_lens, kv_lens):
    q, k, v = _bnsd(s1=s1, s2=s2)
    kw = dict(num_heads=2, input_layout="BNSD", scale=0.2, sparse_mode=mode, atten_mask=OPT,
              pre_tokens=pre, next_tokens=nxt, inner_precise=2)
    if q_lens:
        kw.update(actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens)
    gold, _ = pasa_npu.reference_attention(q, k, v, **kw)
    q_lens = q_lens or [s1, s1]
    kv_lens = kv_lens or [s2, s2]
    vis = torch.stack([npu_visible(s1, s2, mode, pre, nxt, ql, kl)
                       for ql, kl in zip(q_lens, kv_lens)])
    want = naive_attention(q, k, v, 0.2, vis, empty_rows_mean_v=False)
    assert_same_in_fp64(gold, want)
    out, _ = pasa_npu.fused_attention(q, k, v, algorithm="fa-fp32", **kw)
    assert_measured(rel_rmse(out, want), "semantics", "cpu/sparse-modes/fa-fp32",
                    SEMANTICS_FACTOR)


def test_mode0_mask_with_tokens_is_band_and_mask():
    q, k, v = _bnsd(s1=80, s2=120)
    mask = torch.rand(2, 1, 80, 120, generator=torch.Generator().manual_seed(3)) < 0.3
    kw = dict(num_heads=2, input_layout="BNSD", scale=0.2, atten_mask=mask, pre_tokens=15,
              next_tokens=4, inner_precise=2)
    gold, _ = pasa_npu.reference_attention(q, k, v, **kw)
    vis = npu_visible(80, 120, 0, 15, 4)[None] & ~mask[:, 0]
    assert_same_in_fp64(gold, naive_attention(q, k, v, 0.2, vis, False))


def test_mode1_ignores_tokens_and_mode0_without_mask_ignores_tokens():
    q, k, v = _bnsd()
    mask = torch.rand(70, 150, generator=torch.Generator().manual_seed(4)) < 0.3
    base = dict(num_heads=2, input_layout="BNSD", scale=0.2)
    with pytest.warns(UserWarning, match="no effect"):
        a, _ = pasa_npu.reference_attention(q, k, v, atten_mask=mask, sparse_mode=1,
                                            pre_tokens=3, next_tokens=3, **base)
    b, _ = pasa_npu.reference_attention(q, k, v, atten_mask=mask, sparse_mode=1, **base)
    assert torch.equal(a, b)
    with pytest.warns(UserWarning, match="no effect"):
        c, _ = pasa_npu.reference_attention(q, k, v, pre_tokens=3, next_tokens=3, **base)
    d, _ = pasa_npu.reference_attention(q, k, v, **base)
    assert torch.equal(c, d)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layouts_give_identical_results(backend):
    q, k, v = on_device(backend, *_bnsd(b=2, nq=4, nkv=2, s1=50, s2=90))
    common = dict(num_heads=4, num_key_value_heads=2, scale=0.2, algorithm="pasa",
                  backend=backend, softmax_lse_flag=True, kv_block=32)
    ref, ref_lse = pasa_npu.fused_attention(q, k, v, input_layout="BNSD", **common)
    bsnd = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
    out, lse = pasa_npu.fused_attention(*bsnd, input_layout="BSND", **common)
    assert torch.equal(out.transpose(1, 2), ref) and torch.equal(lse, ref_lse)
    bsh = [t.flatten(2) for t in bsnd]
    out, _ = pasa_npu.fused_attention(*bsh, input_layout="BSH", **common)
    assert torch.equal(out.view(2, 50, 4, 32).transpose(1, 2), ref)
    out, _ = pasa_npu.fused_attention(q, k, v, input_layout="BNSD_BSND", **common)
    assert torch.equal(out, ref.permute(0, 2, 1, 3))
    # BNSD_NBSD takes at most 16 query rows (torch_npu's limit)
    short, _ = pasa_npu.fused_attention(q[:, :, :16], k, v, input_layout="BNSD", **common)
    out, _ = pasa_npu.fused_attention(q[:, :, :16], k, v, input_layout="BNSD_NBSD", **common)
    assert torch.equal(out, short.permute(1, 0, 2, 3))
    out, _ = pasa_npu.fused_attention(*bsh, input_layout="BSH_NBSD", **common)
    assert torch.equal(out, ref.permute(1, 0, 2, 3))
    # strided (non-contiguous) views compute the same as contiguous tensors
    out, _ = pasa_npu.fused_attention(*(t.transpose(1, 2) for t in bsnd), input_layout="BNSD",
                                      **common)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["TND", "TND_NTD", "NTD_TND"])
def test_packed_equals_per_sequence(layout, backend):
    q_lens, kv_lens = [33, 0, 60], [70, 20, 90]
    nq, nkv, d = 4, 2, 32
    q, k, v = on_device(backend, _rand(sum(q_lens) + 5, nq, d, seed=1),
                        _rand(sum(kv_lens) + 3, nkv, d, seed=2), _rand(sum(kv_lens) + 3, nkv, d, seed=3))
    cum = lambda lens: [sum(lens[:i + 1]) for i in range(len(lens))]  # noqa: E731
    inputs = (q, k, v) if layout != "NTD_TND" else tuple(t.transpose(0, 1) for t in (q, k, v))
    with skip_unsupported(backend):
        out, lse = pasa_npu.fused_attention(
            *inputs, num_heads=nq, num_key_value_heads=nkv, scale=0.2, input_layout=layout,
            actual_seq_lengths=cum(q_lens), actual_seq_lengths_kv=cum(kv_lens),
            softmax_lse_flag=True, algorithm="pasa-exact", backend=backend, kv_block=32)
    if layout == "TND_NTD":
        out = out.transpose(0, 1)
    assert out.shape == q.shape and lse.shape == (q.shape[0], nq, 1)
    qs = ks = 0
    for ql, kl in zip(q_lens, kv_lens):
        one, one_lse = pasa_npu.fused_attention(
            q[qs:qs + ql].transpose(0, 1)[None], k[ks:ks + kl].transpose(0, 1)[None],
            v[ks:ks + kl].transpose(0, 1)[None], num_heads=nq, num_key_value_heads=nkv,
            scale=0.2, input_layout="BNSD", softmax_lse_flag=True, algorithm="pasa-exact",
            backend=backend, kv_block=32)
        assert torch.equal(out[qs:qs + ql], one[0].transpose(0, 1))
        assert torch.equal(lse[qs:qs + ql, :, 0], one_lse[0, :, :, 0].T)
        qs, ks = qs + ql, ks + kl
    assert (out[qs:] == 0).all() and (lse[qs:] == 0).all()  # tokens past the last sequence


@pytest.mark.parametrize("algorithm", pasa_npu.ALGORITHM_NAMES)
def test_gqa_equals_repeated_kv(algorithm):
    """The same arithmetic per row: bit for bit on this machine (measured). One ulp of the
    row's scale is allowed, as a CPU's BLAS may pick another kernel for the group's
    stacked rows than for one head's."""
    q, k, v = _bnsd(b=1, nq=6, nkv=2, s1=40, s2=200)
    kw = dict(input_layout="BNSD", scale=0.2, algorithm=algorithm, softmax_lse_flag=True)
    gqa, gqa_lse = pasa_npu.fused_attention(q, k, v, num_heads=6, num_key_value_heads=2, **kw)
    mha, mha_lse = pasa_npu.fused_attention(q, k.repeat_interleave(3, 1),
                                            v.repeat_interleave(3, 1), num_heads=6, **kw)
    assert row_scale_ulps(gqa, mha) <= 1
    assert row_scale_ulps(gqa_lse[..., 0], mha_lse[..., 0]) <= 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("inner_precise", [0, 1, 2, 3])
def test_row_rules(inner_precise, backend):
    """Rows that only the mask leaves without a key: with bit 1 (row-invalid handling) 0
    and an LSE of +inf; without, the mean of V over valid keys and an LSE of float32's
    lowest. Rows past actual_seq_lengths: 0 output and 0 LSE (docs/fia-conformance.md)."""
    q, k, v = _bnsd(b=2, s1=60, s2=100)
    mask = torch.zeros(2, 1, 60, 100, dtype=torch.bool)
    mask[:, :, 5] = True
    mask[1, :, 10, :40] = True  # row 10 of batch 1 sees nothing in its 40 valid keys
    dq, dk, dv, dmask = on_device(backend, q, k, v, mask)
    kw = dict(num_heads=2, input_layout="BNSD", scale=0.2, atten_mask=dmask,
              actual_seq_lengths=[60, 50], actual_seq_lengths_kv=[100, 40],
              inner_precise=inner_precise, softmax_lse_flag=True, backend=backend,
              algorithm="pasa-exact", kv_block=32)
    with skip_unsupported(backend):
        out, lse = (t.cpu() for t in pasa_npu.fused_attention(dq, dk, dv, **kw))
    assert torch.isfinite(out).all()
    if inner_precise & 2:
        assert (out[:, :, 5] == 0).all() and (out[1, :, 10] == 0).all()
    else:  # the mean of V over the valid keys, rounded once to the output dtype
        mean0 = v[0].double().mean(1).half()
        mean1 = v[1, :, :40].double().mean(1).half()
        assert torch.equal(out[0, :, 5], mean0)
        assert torch.equal(out[1, :, 10], mean1)
    empty_lse = float("inf") if inner_precise & 2 else torch.finfo(torch.float32).min
    assert (lse[:, :, 5] == empty_lse).all() and (lse[1, :, 10] == empty_lse).all()
    assert (out[1, :, 50:] == 0).all() and (lse[1, :, 50:] == 0).all()
    vis = torch.ones(2, 60, 100, dtype=torch.bool) & ~mask[:, 0]
    vis[1, :, 40:] = False
    vis[1, 50:] = False
    want = naive_attention(q, k, v, 0.2, vis, empty_rows_mean_v=not inner_precise & 2,
                           kv_lens=[100, 40])
    want[1, :, 50:] = 0
    assert_measured(rel_rmse(out, want), "semantics",
                    f"{device_kind(backend)}/row-rules/pasa-exact", SEMANTICS_FACTOR)


def test_lse_placeholder_and_shapes():
    q, k, v = _bnsd(b=1, s1=10, s2=20)
    out, lse = pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD")
    assert lse.shape == (0,) and lse.dtype == torch.float32  # op-plugin 7.2.0 on
    _, lse = pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD",
                                      softmax_lse_flag=True)
    assert lse.shape == (1, 2, 10, 1)


def test_lse_matches_logsumexp():
    q, k, v = _bnsd(b=1, s1=30, s2=300)
    _, lse = pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD", scale=0.25,
                                      softmax_lse_flag=True, algorithm="pasa-exact")
    s = torch.einsum("bnid,bnjd->bnij", q.double(), k.double()) * 0.25
    err = float((lse[..., 0].double() - torch.logsumexp(s, -1)).abs().max())
    assert_measured(err, "semantics", "cpu/lse-logsumexp/pasa-exact", SEMANTICS_FACTOR)


def test_decode_ignores_sparse_mode_like_torch_npu():
    q, k, v = _bnsd(b=2, s1=1, s2=300)
    base = dict(num_heads=2, input_layout="BNSD", scale=0.2)
    plain, _ = pasa_npu.fused_attention(q, k, v, **base)
    causal, _ = pasa_npu.fused_attention(q, k, v, sparse_mode=3, atten_mask=OPT, **base)
    assert torch.equal(plain, causal)
    with pytest.warns(UserWarning, match="no effect"):
        left, _ = pasa_npu.fused_attention(q, k, v, sparse_mode=2, atten_mask=OPT, **base)
    assert torch.equal(plain, left)


def test_empty_key_value_gives_zeros():
    q = _rand(1, 2, 5, 16)
    k = v = torch.zeros(1, 2, 0, 16, dtype=torch.float16)
    for ip in (0, 2):
        out, lse = pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD",
                                            inner_precise=ip, softmax_lse_flag=True)
        assert (out == 0).all() and torch.isposinf(lse).all()  # invalid rows: +inf


@pytest.mark.parametrize("layout", ["BNSD", "BSH", "TND"])
def test_empty_key_value_reference_agrees(layout):
    """S2 = 0: the golden returns what fused_attention does, zeros and an LSE of +inf."""
    q = _rand(1, 2, 5, 16)
    k = v = torch.zeros(1, 2, 0, 16, dtype=torch.float16)
    kw = dict(num_heads=2, input_layout=layout)
    if layout == "BSH":
        q, k, v = (t.transpose(1, 2).flatten(2) for t in (q, k, v))
    if layout == "TND":
        q, k, v = (t[0].transpose(0, 1) for t in (q, k, v))
        kw.update(actual_seq_lengths=[5], actual_seq_lengths_kv=[0])
    for ip in (0, 2):
        for flag in (True, False):
            out, lse = pasa_npu.fused_attention(q, k, v, inner_precise=ip, softmax_lse_flag=flag,
                                                **kw)
            gold, gold_lse = pasa_npu.reference_attention(q, k, v, inner_precise=ip,
                                                          softmax_lse_flag=flag, **kw)
            assert gold.shape == out.shape and lse.shape == gold_lse.shape
            assert torch.equal(gold, out.double()) and torch.equal(gold_lse, lse.double())


def test_mask_dtypes_and_oversized_masks_agree():
    q, k, v = _bnsd(s1=40, s2=70)
    big = torch.rand(2, 1, 48, 96, generator=torch.Generator().manual_seed(5)) < 0.4
    outs = [pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD", atten_mask=m)[0]
            for m in (big, big.to(torch.int8), big.to(torch.uint8), big[:, :, :40, :70],
                      big[:, 0, :40, :70])]
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


def test_bf16_through_fp16_and_range_check():
    q, k, v = _bnsd(dtype=torch.bfloat16)
    out, _ = pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD", algorithm="pasa")
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    k_big = k.clone()
    k_big[0, 0, 3, 1] = 70000.0
    with pytest.raises(ValueError, match="key holds values up to .* beyond fp16"):
        pasa_npu.fused_attention(q, k_big, v, num_heads=2, input_layout="BNSD", algorithm="pasa")
    out, _ = pasa_npu.fused_attention(q, k_big, v, num_heads=2, input_layout="BNSD",
                                      algorithm="fa-fp32")
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name, index, value, shown", [
    ("value", 2, -70000.0, "70144"),  # the most negative element decides (bf16 rounds it)
    ("query", 0, 1e30, "1.00026e\\+30"),
])
def test_bf16_range_check_names_the_tensor_and_its_peak(name, index, value, shown):
    """PASA's bf16 -> fp16 refuses a tensor with a finite element fp16 cannot hold, in
    either sign, naming that tensor, while the others pass the check; beside an inf, the
    finite peak is the one named."""
    tensors = list(_bnsd(dtype=torch.bfloat16))
    tensors[index] = tensors[index].clone()
    tensors[index][0, 1, 2, 3] = value
    tensors[index][0, 1, 2, 4] = float("inf")
    with pytest.raises(ValueError, match=f"^{name} holds values up to {shown} in magnitude"):
        pasa_npu.fused_attention(*tensors, num_heads=2, input_layout="BNSD",
                                 algorithm="pasa-exact")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rows_past_the_lengths_are_never_read(backend, dtype):
    """Whatever lies past the query and kv lengths (NaN, inf, values beyond fp16 in bf16
    PASA's range check) changes nothing: the outputs equal those with zeros there, bit for
    bit, on every backend and in the golden; the same in a masked key is read (PASA's block
    mean takes it in), so bf16 PASA refuses it."""
    q, k, v = _bnsd(b=2, nq=2, nkv=1, s1=40, s2=150, dtype=dtype)
    lengths = dict(actual_seq_lengths=[40, 23], actual_seq_lengths_kv=[150, 97])
    common = dict(num_heads=2, num_key_value_heads=1, input_layout="BNSD", softmax_lse_flag=True,
                  **lengths)
    filled = [t.clone() for t in (q, k, v)]
    filled[0][1, :, 23:] = float("nan")
    filled[1][1, :, 97:100] = float("inf")
    filled[1][1, :, 100:] = 1e30 if dtype == torch.bfloat16 else float("nan")
    filled[2][1, :, 97:] = float("nan")
    want = pasa_npu.reference_attention(q, k, v, **common)
    got = pasa_npu.reference_attention(*filled, **common)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    for algorithm in ("fa-fp32", "pasa", "pasa-exact"):
        kw = dict(common, algorithm=algorithm, backend=backend)
        with skip_unsupported(backend):
            want = pasa_npu.fused_attention(*on_device(backend, q, k, v), **kw)
        got = pasa_npu.fused_attention(*on_device(backend, *filled), **kw)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), algorithm
    if dtype == torch.bfloat16:
        mask = torch.zeros(40, 150, dtype=torch.bool)
        mask[:, 5] = True
        big = k.clone()
        big[0, 0, 5] = 1e30
        with pytest.raises(ValueError, match="key holds values up to"):
            pasa_npu.fused_attention(*on_device(backend, q, big, v), algorithm="pasa-exact",
                                     backend=backend, atten_mask=on_device(backend, mask)[0],
                                     **common)


def test_default_algorithm_follows_inner_precise_bit0():
    q, k, v = _bnsd()
    kw = dict(num_heads=2, input_layout="BNSD", scale=0.2)
    for ip, name in ((0, "fa-fp32"), (1, "pasa"), (2, "fa-fp32"), (3, "pasa")):
        a, _ = pasa_npu.fused_attention(q, k, v, inner_precise=ip, **kw)
        b, _ = pasa_npu.fused_attention(q, k, v, inner_precise=ip, algorithm=name, **kw)
        assert torch.equal(a, b)


def test_beta_is_used():
    q, k, v = _bnsd(s2=300)
    kw = dict(num_heads=2, input_layout="BNSD", scale=0.2, algorithm="pasa")
    a, _ = pasa_npu.fused_attention(q, k, v, beta=0.0, **kw)
    b, _ = pasa_npu.fused_attention(q, k, v, **kw)
    gold, _ = pasa_npu.reference_attention(q, k, v, num_heads=2, input_layout="BNSD", scale=0.2)
    assert not torch.equal(a, b)
    assert_measured(rel_rmse(a, gold), "semantics", "cpu/beta-0/pasa", SEMANTICS_FACTOR)
    assert_measured(rel_rmse(b, gold), "semantics", "cpu/beta-default/pasa", SEMANTICS_FACTOR)


# --------------------------------------------------------------------------- rounding guard


def _tied_inputs():
    """Keys repeated in pairs and a few all-equal rows: many repeated row maxima."""
    q, k, v = _bnsd(b=1, s1=64, s2=256)
    k = k.clone()
    k[:, :, 1::2] = k[:, :, 0::2]
    q = q.clone()
    q[:, :, :8] = 0  # all-equal score rows (rm = 0)
    v = v.abs() + 1  # same-signed values, the setting of seed 002
    return q, k, v


@pytest.mark.parametrize("algorithm", pasa_npu.ALGORITHM_NAMES)
def test_rounding_guard_is_exact_in_real_arithmetic(algorithm):
    q, k, v = _tied_inputs()
    kw = dict(num_heads=2, input_layout="BNSD", scale=0.2, algorithm=algorithm,
              softmax_lse_flag=True)
    gold, gold_lse = pasa_npu.reference_attention(
        q, k, v, num_heads=2, input_layout="BNSD", scale=0.2, softmax_lse_flag=True)
    guarded, lse = pasa_npu.fused_attention(q, k, v, rounding_guard=True, **kw)
    plain, _ = pasa_npu.fused_attention(q, k, v, **kw)
    assert_measured(rel_rmse(guarded, gold), "semantics", f"cpu/guard-rmse/{algorithm}", 1.5)
    assert_measured(float((lse.double() - gold_lse).abs().max()), "semantics",
                    f"cpu/guard-lse/{algorithm}", 1.5)
    assert not torch.equal(guarded, plain)  # the guard acted on the tied rows


def test_rounding_guard_acts_only_on_rows_with_a_repeated_block_maximum():
    q, k, v = _bnsd(s2=256)
    kw = dict(num_heads=2, input_layout="BNSD", scale=0.2)
    for algorithm in ("fa-fp32", "fa-fp16s"):
        a, _ = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, rounding_guard=True, **kw)
        b, _ = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, **kw)
        changed = (a != b).any(-1)
        scores = q.float() @ k.float().transpose(-1, -2)  # fp32-accumulated, as the kernels
        if algorithm == "fa-fp16s":
            scores = scores.half().float()  # unscaled fp16 scores: ties do happen
        blocks = scores.unflatten(-1, (2, 128))
        tied = ((blocks == blocks.amax(-1, keepdim=True)).sum(-1) > 1).any(-1)
        assert not (changed & ~tied).any(), algorithm
        if algorithm == "fa-fp32":
            assert not changed.any()
