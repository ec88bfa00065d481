"""The torch backend's backward pass (README, "Supported arguments": backward through the
``torch`` backend only): the gradients of query, key and value through every shift against
those of the fp64 golden, over the forms whose rows or entries see no key (rows past the
query lengths, keys past the kv lengths, a row the mask empties, a hidden key whose score
would overflow exp), where an untaken branch must not turn a zero gradient into NaN.

Bounds: the gradients' relative error is a factor of the largest measured
(tests/measured.json, kind "backward"); every gradient is finite."""
from __future__ import annotations

import pytest
import torch

import pasa_npu
from _support import assert_measured

B, NQ, NKV, S, D = 2, 4, 2, 24, 16
FACTOR = 2.0


def _case(name: str):
    """(q, k, v) fp16 BNSD and the call's arguments."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(B, n, S, D, generator=gen).half() for n in (NQ, NKV, NKV))
    kw = dict(num_heads=NQ, num_key_value_heads=NKV, input_layout="BNSD", scale=D ** -0.5,
              softmax_lse_flag=True)
    if name == "causal":
        kw.update(sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask())
    elif name == "query lengths":  # batch 0's rows past 17: zero outputs, zero gradients
        kw.update(actual_seq_lengths=[17, S])
    elif name == "kv lengths":
        kw.update(actual_seq_lengths_kv=[9, S])
    elif name == "empty row":  # the mask hides every key of one row
        mask = torch.zeros(B, S, S, dtype=torch.bool)
        mask[0, 5] = True
        mask[1, :, :3] = True
        kw.update(atten_mask=mask)
    elif name == "hidden large score":  # a hidden key whose score is far above the others
        k[:, :, 7] = 60.0
        q = q.abs()
        mask = torch.zeros(S, S, dtype=torch.bool)
        mask[:, 7] = True
        kw.update(atten_mask=mask)
    return q, k, v, kw


CASES = ("plain", "causal", "query lengths", "kv lengths", "empty row", "hidden large score")


def _gradients(fn, q, k, v, kw):
    """The gradients (fp16, as the inputs) of a fixed random linear function of out and LSE."""
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = fn(*inputs, **kw)
    weights = torch.Generator().manual_seed(5)
    dout = torch.randn(out.shape, generator=weights).to(out.dtype)
    dlse = torch.randn(lse.shape, generator=weights).to(lse.dtype)
    finite = torch.isfinite(lse)  # rows that see no key: LSE +inf or fp32's lowest
    loss = (out * dout).sum() + (lse.masked_fill(~finite, 0) * dlse).sum()
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("algorithm", ["fa-fp32", "pasa-exact", "pasa"])
@pytest.mark.parametrize("case", CASES)
def test_gradients_match_the_golden(algorithm, case):
    q, k, v, kw = _case(case)
    want = _gradients(pasa_npu.reference_attention, q, k, v, kw)
    got = _gradients(pasa_npu.fused_attention, q, k, v,
                     dict(kw, algorithm=algorithm, backend="torch"))
    for name, g, w in zip(("query", "key", "value"), got, want):
        assert torch.isfinite(g).all(), f"{name}: non-finite gradient"
        error = float((g.double() - w.double()).norm() / w.double().norm())
        assert_measured(error, "backward", f"cpu/{algorithm}/{name}", FACTOR, case)
