"""Pieces both GPU prefill kernels use, the Triton kernel (``triton_attention``) and the
warp-specialised Gluon kernel (``gluon_prefill``): the kv blocks a query tile visits, the
fp16 roundings, and the strides a TMA descriptor takes. Gluon kernels call these
``triton.jit`` helpers as they are (scalar and element-wise code has no layout of its own)."""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

#: the kernels run in the interpreter (decided at import, as triton.jit decides it)
INTERPRET = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def _rl(x, low: tl.constexpr):
    """One rounding to the compute dtype ``low``, kept in fp32 (a low-precision step)."""
    return x.to(low).to(tl.float32)


@triton.jit
def _fp16(x):
    """fp32 -> fp16, round to nearest even, two elements per instruction. The compiler
    converts a tile that stays in registers one element at a time (and then packs pairs
    for the fp16 arithmetic); ``cvt.rn.f16x2.f32`` halves that. Same values."""
    if INTERPRET:
        return x.to(tl.float16)
    else:
        return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [x],
                                         dtype=tl.float16, is_pure=True, pack=2)


@triton.jit
def _tile_kv_blocks(m0, q_len, kv_len, band_pre, band_next, b, HAS_BAND: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The kv blocks [lo, hi) the query tile of rows m0 .. m0+BLOCK_M-1 can see, the
    interior ones [full_lo, full_hi) every valid row sees whole, and the band limits
    (pre, next) of batch b (0 without a band)."""
    m_last = tl.minimum(m0 + BLOCK_M, q_len) - 1
    lo_col = kv_len * 0
    hi_col = kv_len
    full_lo_col = lo_col
    full_hi_col = kv_len
    pre = lo_col
    nxt = lo_col
    if HAS_BAND:
        pre = tl.load(band_pre + b)
        nxt = tl.load(band_next + b)
        lo_col = tl.maximum(lo_col, m0 - pre)
        hi_col = tl.minimum(hi_col, m_last + nxt + 1)
        full_lo_col = tl.maximum(full_lo_col, m_last - pre)
        full_hi_col = tl.minimum(full_hi_col, m0 + nxt + 1)
    lo = lo_col // BLOCK_N
    hi = tl.maximum((hi_col + BLOCK_N - 1) // BLOCK_N, lo)
    full_lo = tl.minimum(tl.maximum((full_lo_col + BLOCK_N - 1) // BLOCK_N, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi_col // BLOCK_N, full_lo), hi)
    return lo, hi, full_lo, full_hi, pre, nxt


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    """The number of SMs of CUDA device ``device_index``."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def tma_strides(t: torch.Tensor, batch_stride: int):
    """The strides a TMA descriptor takes for the (B, N, S, D) view ``t`` whose batch axis
    steps by ``batch_stride`` (0: packed, never stepped), or None where TMA cannot address
    it (a strided last dim, strides or base not 16-byte aligned)."""
    strides = [batch_stride, *t.stride()[1:]]
    if t.numel() == 0 or strides[-1] != 1 or t.data_ptr() % 16:
        return None
    if t.shape[0] == 1 or strides[0] == 0:  # never stepped: any aligned stride will do
        strides[0] = max(n * st for n, st in zip(t.shape[1:], strides[1:]))
        strides[0] += -strides[0] % 8
    if any(st * t.element_size() % 16 for st in strides[:-1]):
        return None
    return strides
