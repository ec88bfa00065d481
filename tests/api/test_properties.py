"""Property test over random shapes, layouts, GQA ratios and causal masks."""
from __future__ import annotations

import math

import torch
from hypothesis import assume, example, given
from hypothesis import strategies as st

import pasa_npu
from _support import BACKENDS, assert_measured, interpreted, on_device, rel_rmse

# Relative RMSE against the golden within 2x the largest measured over the drawn shapes and
# backends, per allocation. Not 1.5x: the draws are fixed (the "ci" profile derandomizes),
# but a failing run's shrinking tries other shapes, and a tiny one (two query rows against
# 36 keys) has shown 2.5x the largest error of the draws on the same backend.
PROPERTY_FACTOR = 2


@given(
    batch=st.integers(1, 3), kv_heads=st.integers(1, 3), group=st.integers(1, 3),
    s1=st.integers(1, 150), s2=st.integers(1, 300), d=st.sampled_from([16, 32, 64]),
    layout=st.sampled_from(["BNSD", "BSND", "BSH"]), causal=st.booleans(),
    algorithm=st.sampled_from(pasa_npu.ALGORITHM_NAMES), backend=st.sampled_from(BACKENDS),
    kv_block=st.sampled_from([32, 64, 128]), seed=st.integers(0, 2 ** 16))
# a part-filled last kv block of 5 keys: pasa-mixed's mean of S' over so few keys carries the
# most rounding noise (the shrinking of a failing run found it)
@example(batch=1, kv_heads=1, group=1, s1=1, s2=37, d=16, layout="BNSD", causal=False,
         algorithm="pasa-mixed", backend="torch", kv_block=32, seed=0)
def test_any_shape_matches_golden(batch, kv_heads, group, s1, s2, d, layout, causal,
                                  algorithm, backend, kv_block, seed):
    if backend == "ascendc-emu":  # the kernels implement three allocations
        from pasa_npu.ascendc_emu import TILING_KEYS
        assume(algorithm in TILING_KEYS)
    gen = torch.Generator().manual_seed(seed)
    nq = kv_heads * group
    if interpreted(backend):  # the interpreter is slow: same draws, smaller sequences
        s1, s2, batch = 1 + s1 % 40, 1 + s2 % 80, 1

    def make(s, n):
        x = torch.randn(batch, n, s, d, generator=gen).half()
        if layout == "BNSD":
            return x
        x = x.transpose(1, 2)
        return x.flatten(2) if layout == "BSH" else x

    q, k, v = make(s1, nq), make(s2, kv_heads), make(s2, kv_heads)
    kw = dict(num_heads=nq, num_key_value_heads=kv_heads, input_layout=layout,
              scale=1 / math.sqrt(d), inner_precise=2 if s1 > 1 else 0)  # decode: 0/1 only
    if causal:
        kw.update(sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask())
    gold, _ = pasa_npu.reference_attention(q, k, v, **kw)
    if "atten_mask" in kw:
        kw["atten_mask"] = on_device(backend, kw["atten_mask"])[0]
    out, _ = pasa_npu.fused_attention(*on_device(backend, q, k, v), algorithm=algorithm,
                                      backend=backend, kv_block=kv_block, **kw)
    out = out.cpu()
    assert out.shape == gold.shape and out.dtype == torch.float16
    assert torch.isfinite(out).all()
    if gold.abs().max() > 0:
        assert_measured(rel_rmse(out, gold), "property-rmse", f"fp16/{algorithm}",
                        PROPERTY_FACTOR)
    else:
        assert (out == 0).all()
