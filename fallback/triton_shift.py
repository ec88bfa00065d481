"""PASA's key shift on the GPU: K' per kv block, in a separate pass over K
(:func:`prepare_keys`, the ``_shift_keys`` kernel) or inside an attention kernel
(:func:`_shift_in_kernel`, the one definition both use).

``pasa`` / ``pasa-mixed``: K' = M^T K per kv block (the stored shifting matrix, scale
folded), evaluated element-wise from M's two distinct entries: in fp32, rounded once, as a
matmul's fp32 accumulation is (the n x n matmul it replaces would read M in every
program). ``pasa-exact``: mean16 per block and K' = fp16((K - mean16) * scale). Zero-padded
to whole blocks, as the means must see the padded rows.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from pasa_npu.beta import shift_matrix
from pasa_npu.fallback.kernel_common import cdiv, interpreting, launch
from pasa_npu.problem import AttentionProblem


@triton.jit
def _shift_keys(K, KS, MEAN, SHIFT, kv_starts, kv_lens,
                stride_kb, stride_kh, stride_ks, stride_kd,
                stride_sb, stride_sh, stride_ss,
                stride_mb, stride_mh, stride_mblk,
                n_kv_heads, n_blocks, scale, head_dim,
                EXACT_SHIFT: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """K' for one kv block of one (batch, kv head) (:func:`_shift_in_kernel`, the one
    definition decode uses too); rows past the valid length are zero."""
    blk = tl.program_id(0) % n_blocks  # a 1-D grid: CUDA caps the other axes at 65535
    bh = tl.program_id(0) // n_blocks
    b = bh // n_kv_heads
    h = bh % n_kv_heads
    kv_len = tl.load(kv_lens + b)
    kv_start = tl.load(kv_starts + b)
    rows = blk * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    k_ptrs = (K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
              + (kv_start + rows)[:, None].to(tl.int64) * stride_ks + dims[None, :] * stride_kd)
    k = tl.load(k_ptrs, mask=(rows[:, None] < kv_len) & (dims[None, :] < head_dim), other=0.0)
    shifted, mean = _shift_in_kernel(k, SHIFT, scale, EXACT_SHIFT, BLOCK_N)
    if EXACT_SHIFT:
        tl.store(MEAN + b.to(tl.int64) * stride_mb + h * stride_mh + blk * stride_mblk + dims,
                 mean.to(tl.float16))
    tl.store(KS + b.to(tl.int64) * stride_sb + h.to(tl.int64) * stride_sh
             + rows[:, None].to(tl.int64) * stride_ss + dims[None, :], shifted)


@triton.jit
def _shift_in_kernel(k, SHIFT, scale, EXACT_SHIFT: tl.constexpr, BLOCK_N: tl.constexpr):
    """K' of one zero-padded raw K tile: in the preprocessing pass (``_shift_keys``) and
    inside the attention loop (fused: decode, and prefill with ``Tuning.shift == "fused"``).
    Returns K' and, for pasa-exact, the block's mean16 (fp32)."""
    if EXACT_SHIFT:
        mean16 = (tl.sum(k.to(tl.float32), 0) / BLOCK_N).to(tl.float16)
        shifted = ((k.to(tl.float32) - mean16.to(tl.float32)[None, :]) * scale).to(tl.float16)
        mean = mean16.to(tl.float32)
    else:
        # M^T K without the n x n matmul: row i of M^T K is diag * K_i - off * (sum_j K_j - K_i)
        # for M's stored entries (diag, -off), evaluated in fp32 and rounded once, as the
        # matmul's fp32 accumulation is; an n-times cheaper pass where K is read once anyway
        diag = tl.load(SHIFT).to(tl.float32)
        off = -tl.load(SHIFT + 1).to(tl.float32)
        k32 = k.to(tl.float32)
        shifted = ((diag + off) * k32 - off * tl.sum(k32, 0)[None, :]).to(tl.float16)
        mean = tl.zeros([k.shape[1]], tl.float32)
    return shifted, mean


@functools.lru_cache(maxsize=64)
def cached_shift_matrix(beta: float, n: int, scale: float, device: torch.device) -> torch.Tensor:
    """The stored fp16 shifting matrix M (scale folded) on ``device``."""
    return shift_matrix(beta, n, torch.float16, scale, device).contiguous()


def prepare_keys(problem: AttentionProblem, k: torch.Tensor, kv_starts: torch.Tensor,
                 kv_lens: torch.Tensor, block_n: int, head_dim_p: int):
    """The separate preprocessing pass: K' (B, Nkv, blocks*block_n, head_dim_p) padded to
    whole blocks, and the block means (B, Nkv, blocks, head_dim_p; written for pasa-exact
    only)."""
    dev = k.device
    batch, n_kv = problem.batch, k.shape[1]
    n_blocks = max(1, cdiv(problem.max_kv_len, block_n))
    k_shift = torch.empty(batch, n_kv, n_blocks * block_n, head_dim_p, dtype=torch.float16,
                          device=dev)
    means = torch.empty(batch, n_kv, n_blocks, head_dim_p, dtype=torch.float16, device=dev)
    exact = problem.allocation.exact_shift
    shift = means if exact else cached_shift_matrix(problem.beta, block_n, problem.scale, dev)
    launch(
        _shift_keys, (n_blocks * batch * n_kv,),
        k, k_shift, means, shift, kv_starts, kv_lens,
        0 if problem.packed else k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        k_shift.stride(0), k_shift.stride(1), k_shift.stride(2),
        means.stride(0), means.stride(1), means.stride(2),
        n_kv, n_blocks, problem.scale, k.shape[3],
        EXACT_SHIFT=exact, BLOCK_N=block_n, HEAD_DIM=head_dim_p,
        num_warps=1 if interpreting() else 4)
    return k_shift, means
