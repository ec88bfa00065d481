"""The torch backend against an independent rounding model of every allocation
(tests/_oracle.py), bit for bit.

The model is written from the allocation table, not from the backend, and holds every
rounding step of every allocation: dropping, adding or moving one changes outputs or LSE
here. A bound against the fp64 golden cannot see that, as a dropped rounding makes a
result more accurate. Two things may differ between two correct implementations and are
fixed here so that equality is the test: the order of fp32 sums (every matmul contraction
and kv block has two terms, D = 2 and kv_block = 2, whose sum is the same in any order) and
the elementary functions (exp and log are the correctly rounded ones in both, by replacing
torch's for the backend's call). A part-filled last kv block holds one key of two, or (the
"part-filled" case, kv_block = 4) one or two keys of four, whose shift coefficients
σ(a − bn/v) and σbn/v are then exact and its sums still of at most two terms."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import _oracle
import pasa_npu
from _support import INT_MAX, npu_visible

D = 2
KV_BLOCK = 2
SCALE = 0.35  # not a power of two: the scaling steps round

# name -> (inputs, call arguments). Inputs: B, Nq, Nkv, S1, S2, offset and spread of Q and K.
CASES = {
    "gqa": dict(B=2, Nq=4, Nkv=2, S1=5, S2=11),
    "bias-20": dict(B=1, Nq=2, Nkv=1, S1=6, S2=12, x0=20.0),
    "overflow": dict(B=1, Nq=2, Nkv=2, S1=4, S2=9, x0=200.0, spread=10.0),
    # odd kv lengths: a last block half padding, which PASA's shift leaves out
    "ragged": dict(B=2, Nq=2, Nkv=2, S1=5, S2=11, q_lens=[5, 3], kv_lens=[11, 5]),
    # one block of four rows holding two keys or one, under a key bias
    "part-filled": dict(B=2, Nq=2, Nkv=1, S1=3, S2=2, kv_lens=[2, 1], kv_block=4, x0=6.0),
    "causal": dict(B=1, Nq=2, Nkv=1, S1=6, S2=11, sparse_mode=3),
    "band": dict(B=1, Nq=2, Nkv=2, S1=7, S2=9, sparse_mode=4, pre=3, next=1),
    "mask": dict(B=2, Nq=2, Nkv=1, S1=6, S2=10, mask=True),
    "decode": dict(B=2, Nq=6, Nkv=2, S1=1, S2=9, kv_lens=[9, 3]),
    "tied-guard": dict(B=1, Nq=2, Nkv=1, S1=6, S2=12, tied=True, guard=True),
    "beta-0.9": dict(B=1, Nq=2, Nkv=2, S1=4, S2=10, x0=8.0, beta=0.9),
}


def _inputs(case: dict, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    b, nq, nkv, s1, s2 = (case[k] for k in ("B", "Nq", "Nkv", "S1", "S2"))
    x0, spread = case.get("x0", 0.0), case.get("spread", 1.0)
    q = torch.randn(b, nq, s1, D, generator=gen) * spread + x0
    k = torch.randn(b, nkv, s2, D, generator=gen) * spread + x0
    v = torch.randn(b, nkv, s2, D, generator=gen)
    if case.get("tied"):
        k[:, :, 1::2] = k[:, :, 0::2]          # every block holds a repeated key
        q[:, :, :2] = 0                        # and rows whose scores are all equal
        v = v.abs() + 1
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _visible_and_kwargs(case: dict):
    """The call's keyword arguments and, from torch_npu's rules written out in
    tests/_support.py, which keys each row sees (B, S1, S2)."""
    b, s1, s2 = case["B"], case["S1"], case["S2"]
    q_lens = case.get("q_lens", [s1] * b)
    kv_lens = case.get("kv_lens", [s2] * b)
    kw = dict(num_heads=case["Nq"], num_key_value_heads=case["Nkv"], input_layout="BNSD",
              scale=SCALE, kv_block=case.get("kv_block", KV_BLOCK), softmax_lse_flag=True,
              inner_precise=2 if s1 > 1 else 0,  # decode takes 0 or 1 only
              actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens,
              rounding_guard=case.get("guard", False))
    mode = case.get("sparse_mode", 0)
    pre, nxt = case.get("pre", INT_MAX), case.get("next", INT_MAX)
    visible = torch.stack([npu_visible(s1, s2, mode, pre, nxt, ql, kl)
                           for ql, kl in zip(q_lens, kv_lens)])
    if mode:
        kw.update(sparse_mode=mode, atten_mask=pasa_npu.compressed_causal_mask(),
                  pre_tokens=pre, next_tokens=nxt)
    if case.get("mask"):
        mask = torch.rand(b, 1, s1, s2, generator=torch.Generator().manual_seed(7)) < 0.5
        mask[:, :, 2] = True                   # a row that sees nothing
        mask[:, :, :, 2:4] = True              # a kv block no row sees
        kw["atten_mask"] = mask
        visible &= ~mask[:, 0]
    return visible, q_lens, kv_lens, kw


@pytest.fixture
def correctly_rounded_exp_and_log(monkeypatch):
    """torch.exp and torch.log correctly rounded (fp64, rounded once), as the oracle's."""
    exp, log = torch.exp, torch.log
    monkeypatch.setattr(torch, "exp", lambda x: exp(x.double()).to(x.dtype))
    monkeypatch.setattr(torch, "log", lambda x: log(x.double()).to(x.dtype))


def _assert_same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(actual), nan), f"{what}: NaN pattern differs from the oracle"
    differ = (actual != expected) & ~nan
    assert not differ.any(), (f"{what}: {int(differ.sum())} of {differ.numel()} values differ "
                              f"from the oracle, first at {differ.nonzero()[0].tolist()}")


#: (case, algorithm): every case with every allocation it applies to (an explicit beta:
#: pasa and pasa-mixed)
PAIRS = [(name, algorithm) for name in CASES for algorithm in pasa_npu.ALGORITHM_NAMES
         if "beta" not in CASES[name] or algorithm in ("pasa", "pasa-mixed")]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name,algorithm", PAIRS, ids=[f"{n}-{a}" for n, a in PAIRS])
def test_torch_backend_rounds_as_the_oracle(name, algorithm, dtype,
                                            correctly_rounded_exp_and_log):
    case = CASES[name]
    q, k, v = _inputs(case, dtype)
    visible, q_lens, kv_lens, kw = _visible_and_kwargs(case)
    # the allocation's own arithmetic: the overflow check would recompute rows by fa-fp32
    out, lse = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="torch",
                                        beta=case.get("beta"), repair_overflow=False, **kw)
    want, want_lse = _oracle.attention(
        *(t.float().numpy() for t in (q, k, v)), algorithm=algorithm, scale=SCALE,
        kv_block=kw["kv_block"], visible=visible.numpy(), kv_lens=kv_lens,
        beta=case.get("beta"), guard=case.get("guard", False),
        input_dtype="fp16" if dtype == torch.float16 else "bf16")
    want, want_lse = torch.from_numpy(want), torch.from_numpy(want_lse)
    past = torch.arange(case["S1"])[None, :] >= torch.tensor(q_lens)[:, None]
    # the API's row rules over the kernel's (docs/fia-conformance.md r17, r30, r31): rows
    # past the query length have an LSE of 0; rows that see no key are invalid, LSE +inf
    # (inner_precise bit 1 here, or decode, where only lengths can empty a row)
    empty = ~visible.any(-1) & ~past
    want_lse[empty[:, None].expand_as(want_lse)] = float("inf")
    want_lse[past[:, None].expand_as(want_lse)] = 0.0
    _assert_same(out.float(), want, "output")
    _assert_same(lse[..., 0], want_lse, "LSE")


#: the pseudo-average cases of every kind: the block means from the keys
KEY_MEAN_PAIRS = [(name, algorithm) for name in CASES for algorithm in ("pasa", "pasa-mixed")]


@pytest.mark.parametrize("name,algorithm", KEY_MEAN_PAIRS, ids=[f"{n}-{a}" for n, a in KEY_MEAN_PAIRS])
def test_block_means_from_the_keys_round_as_the_oracle(name, algorithm, correctly_rounded_exp_and_log):
    """Under block_means_from_keys (the AscendC kernels' numerics where they form K') the torch
    backend's pseudo-average allocations take each block mean as the oracle writes it from
    docs/design.md: fp16(Q . fp16(colsum(K) r / v)), bit for bit."""
    from pasa_npu.fallback.torch import blockwise
    case = CASES[name]
    q, k, v = _inputs(case, torch.float16)
    visible, q_lens, kv_lens, kw = _visible_and_kwargs(case)
    with blockwise.block_means_from_keys():
        out, lse = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="torch",
                                            beta=case.get("beta"), repair_overflow=False, **kw)
    want, want_lse = _oracle.attention(
        *(t.float().numpy() for t in (q, k, v)), algorithm=algorithm, scale=SCALE,
        kv_block=kw["kv_block"], visible=visible.numpy(), kv_lens=kv_lens,
        beta=case.get("beta"), guard=case.get("guard", False), key_means=True)
    want, want_lse = torch.from_numpy(want), torch.from_numpy(want_lse)
    rows = visible.any(-1)[:, None].expand_as(want_lse)
    _assert_same(out.float(), want, "output")
    _assert_same(lse[..., 0][rows], want_lse[rows], "LSE")
    plain, plain_lse = _oracle.attention(
        *(t.float().numpy() for t in (q, k, v)), algorithm=algorithm, scale=SCALE,
        kv_block=kw["kv_block"], visible=visible.numpy(), kv_lens=kv_lens,
        beta=case.get("beta"), guard=case.get("guard", False))
    if name in ("bias-20", "beta-0.9"):  # the two means differ here: the test can tell them apart
        assert not (np.array_equal(plain, want.numpy()) and np.array_equal(plain_lse, want_lse.numpy()))


@pytest.mark.parametrize("valid", [128, 77, 1])
def test_key_block_means_are_the_mean_of_the_unrounded_shifted_keys(valid):
    """key_block_means is fp16 of the column mean, over the block's keys, of K' = M^T K in fp64
    (the stored fp16 matrix; a part-filled block's from partial_block_shift), under a key bias
    that leaves a large remnant in K': within one fp16 rounding of it (half an ulp, plus the
    fp32 roundings before it)."""
    from pasa_npu.beta import partial_block_shift, shift_matrix
    from pasa_npu.fallback.torch.blockwise import key_block_means
    n, beta, scale = 128, 0.984375, 128 ** -0.5
    gen = torch.Generator().manual_seed(valid)
    k = (torch.randn(2, n, 128, generator=gen) * 3 + 40).half().double()
    k[:, valid:] = 0
    if valid == n:
        shifted = shift_matrix(beta, n, torch.float16, scale).double().T @ k
    else:
        diag_v, off_v, _ = partial_block_shift(beta, valid, n, torch.float16, scale)
        m = torch.full((valid, valid), -off_v, dtype=torch.float64)
        m.fill_diagonal_(diag_v)
        shifted = m.T @ k[:, :valid]
    exact = shifted[:, :valid].mean(-2)
    got = key_block_means(k.float().view(1, 2, 1, n, 128), torch.tensor([[valid]]), beta, scale)[0, :, 0].double()
    ulp = torch.exp2(torch.floor(torch.log2(exact.abs())) - 10)
    assert exact.abs().min() > 0.02  # the remnant of the bias is what the mean carries
    assert bool(((got - exact).abs() <= ulp * (0.5 + 2 ** -10)).all()), float(((got - exact).abs() / ulp).max())


def test_the_cases_reach_what_they_name():
    """The inputs do what the cases are for: fp16 scores overflow in "overflow", the
    guard's repeated maxima occur in "tied-guard", and the default beta is not 0.9."""
    q, k, _ = _inputs(CASES["overflow"], torch.float16)
    assert (q.float() @ k.float().transpose(-1, -2)).abs().max() > 65504
    q, k, _ = _inputs(CASES["tied-guard"], torch.float16)
    s = (q.float() @ k.float().transpose(-1, -2)).unflatten(-1, (-1, KV_BLOCK))
    assert ((s == s.amax(-1, keepdim=True)).sum(-1) > 1).all()
    assert abs(_oracle.optimal_beta(_oracle.BETA0, KV_BLOCK, SCALE) - 0.9) > 0.01


def test_oracle_solves_beta_as_the_package():
    """The two solvers of the optimal accuracy condition agree; the oracle's is written from
    docs/design.md, "Choosing β", and reproduces the paper's Table 3 (n = 128, fp16, no
    scale: 0.937500, 0.968994, 0.984497 from 1 - 2^-4, 1 - 2^-5, 1 - 2^-6)."""
    for beta0, paper in ((1 - 2 ** -4, 0.937500), (1 - 2 ** -5, 0.968994), (1 - 2 ** -6, 0.984497)):
        assert round(_oracle.optimal_beta(beta0, 128, 1.0), 6) == paper
    for n, scale in ((2, SCALE), (32, 0.125), (128, 128 ** -0.5)):
        ours = _oracle.optimal_beta(_oracle.BETA0, n, scale)
        assert ours == pytest.approx(pasa_npu.optimal_beta(_oracle.BETA0, n, scale=scale),
                                     rel=1e-9, abs=0)


def test_bf16_rounding_of_the_oracle():
    """The oracle's bf16 rounding: to nearest, ties to even, overflow to inf, as torch's."""
    x = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -9, 3.0e38, -7.7, 0.0, 2 ** -130])
    x = torch.cat([x, torch.randn(2000, generator=torch.Generator().manual_seed(1)) * 100])
    got = torch.from_numpy(_oracle.rounder("bf16")(x.numpy()))
    assert torch.equal(got, x.to(torch.bfloat16).float())
    assert np.isinf(_oracle.rounder("bf16")(np.array([3.4e38], np.float32)))[0]
