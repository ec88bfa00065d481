"""Helpers of the torch_npu conformance tests of tests/api/: the small inputs, runs and
golden comparisons of test_fia_conformance*.py (one check per row of docs/fia-conformance.md)
and the packed inputs and v1/v2 keywords of test_fia_v2*.py (fused_attention_v2)."""
from __future__ import annotations

import math

import pytest
import torch

import pasa_npu
from _support import interpreter_skip, on_device, skip_unsupported
from pasa_npu.options import resolve_allocation

# ----------------------------------------------------------------- test_fia_conformance*.py

OPT = pasa_npu.compressed_causal_mask()
F32_LOWEST = torch.finfo(torch.float32).min
D = 16  # small and a whole fractal of the AscendC cube: no padding


def _rand(*shape, seed=0, dtype=torch.float16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _bnsd(b=2, n=2, nkv=2, s1=6, s2=10, d=D, dtype=torch.float16, seed=0):
    return (_rand(b, n, s1, d, seed=seed, dtype=dtype),
            _rand(b, nkv, s2, d, seed=seed + 1, dtype=dtype),
            _rand(b, nkv, s2, d, seed=seed + 2, dtype=dtype))


def _run(backend, q, k, v, **kw):
    """fused_attention on ``backend`` (tensors moved to its device), results on the CPU."""
    kw.setdefault("num_heads", q.shape[1])
    kw.setdefault("input_layout", "BNSD")
    algorithm = resolve_allocation(kw.get("algorithm"), kw.get("inner_precise", 0), q.dtype).name
    if reason := interpreter_skip(backend, algorithm, q.dtype):
        pytest.skip(reason)
    if isinstance(kw.get("atten_mask"), torch.Tensor):
        kw["atten_mask"] = on_device(backend, kw["atten_mask"])[0]
    with skip_unsupported(backend):
        out, lse = pasa_npu.fused_attention(*on_device(backend, q, k, v), backend=backend,
                                            **kw)
    return out.cpu(), lse.cpu()


def _gold(q, k, v, **kw):
    kw.setdefault("num_heads", q.shape[1])
    kw.setdefault("input_layout", "BNSD")
    return pasa_npu.reference_attention(q, k, v, **kw)


def _close(out, gold, atol=2e-2):
    """Finite rows agree with the golden within fp16's reach; non-finite entries (the LSE
    of invalid rows) agree exactly."""
    gold = gold.double()
    out = out.double()
    fin = torch.isfinite(gold)
    assert torch.equal(fin, torch.isfinite(out))
    assert torch.equal(out[~fin], gold[~fin])
    assert float((out[fin] - gold[fin]).abs().max(), ) <= atol if fin.any() else True


# ------------------------------------------------------------------------- test_fia_v2*.py

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
