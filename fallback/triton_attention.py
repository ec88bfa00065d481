"""Triton backend: every precision allocation on CUDA GPUs (and on CPU under TRITON_INTERPRET=1).

Numerics mirror :mod:`pasa_npu.fallback.torch_blockwise` allocation by allocation:
fp16 operands, fp32 accumulation in the tensor cores, rounding to fp16 exactly
where the allocation says. An "fp16 step" of the CPU backend (fp32 arithmetic,
one rounding) is computed here in native fp16 where that gives the same
correctly rounded result (+ - * / of fp16 values). Differences to the CPU
backend come only from the order of fp32 accumulation and the hardware exp.

Kernels:

* ``_shift_keys``: the preprocessing pass over K, once per call. ``pasa`` /
  ``pasa-mixed``: K' = M^T K per kv block (the stored shifting matrix, scale
  folded), evaluated element-wise from M's two distinct entries (:func:`_shift_in_kernel`:
  in fp32, rounded once, as a matmul's fp32 accumulation is; the n x n matmul it
  replaces read M from L2 in every program and held the pass to about two thirds of
  copy bandwidth). ``pasa-exact``: mean16 per block and K' = fp16((K - mean16) * scale).
  Zero-padded to whole blocks, as the means must see the padded rows.
* ``_attention_fwd``: one program per (query tile, batch, query head). (On Hopper, the
  warp-specialised Gluon kernel of :mod:`gluon_prefill` computes the same where it
  applies, pasa's and pasa-exact's block sums in another order, and ``TUNING["prefill"]``
  picks it.) The kv blocks a tile can see are walked in ascending order in three loops:
  masked edge blocks, then branch-free interior blocks (read through TMA tensor
  descriptors where the layout allows), then masked edge blocks; the loops a problem can
  never enter are compiled out (:func:`_block_loops`).
  Causal and band limits are computed from the per-batch band; no S1 x S2 mask
  is ever built for sparse modes 2-4.
* ``_decode_split`` + ``_decode_combine``: query length 1. One program per
  (kv split, batch, kv head) stacks the query heads of its group as rows, so
  K/V are read once per group and a single query row still fills the GPU (the
  splits make one wave of resident programs, :func:`_decode_splits`); the partial
  results are merged by their log-sum-exp in fp32, one program per query head (as
  FlashDecoding).
  For PASA each split starts its own pseudo-average, and K' is computed there from
  each raw K block (:func:`_shift_in_kernel`, as in ``_shift_keys``).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from pasa_npu import numerics
from pasa_npu.beta import ideal_invariance, shift_matrix
from pasa_npu.fallback import gluon_prefill
from pasa_npu.fallback.kernel_common import (INTERPRET, _fp16, _rl, _tile_kv_blocks,
                                             allocation_flags, device_capability, launch,
                                             sm_count, tma_strides)
from pasa_npu.problem import AttentionProblem

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
COMBINE_CHUNK = 32  # decode splits merged per load
GRID_AXIS_MAX = 65535  # CUDA's limit on a grid's second and third axes
INT_BIG = 1 << 30  # stands for "no band limit" (index math is int32)

#: Tuning switch, measured with tools/bench.py on an H100 (the default is the faster):
#: ``prefill``: which kernel computes prefill, "warp-specialised" (fallback/gluon_prefill.py:
#: Hopper only, pasa-exact, pasa and fa-fp32 at d = 64 and 128 without ragged lengths or an
#: explicit mask; the same results, bit for bit but for pasa and pasa-exact, whose block
#: sums it adds on the tensor cores), "triton" (``_attention_fwd``, everything)
#: or "auto": the Gluon kernel wherever it applies (measured faster there), unless a
#: switch below, which only the Triton kernel has, is set away from its default (the
#: Gluon kernel shifts K in a separate pass, loads through TMA and computes pasa-exact's
#: row constants in the kernel, gluon_prefill.MEAN_ROWS blocks at a time).
#: ``shift``: how prefill shifts K for PASA, "separate" (one preprocessing pass over K;
#: pasa-exact 351 TFLOP/s at d=128, S=16k) or "fused" (recomputed inside every query
#: tile; 209). Decode always fuses: each K block is read by one program there.
#: (Row sums of fp16 tiles as a thin matmul on the tensor cores were tried too, in scratch
#: code: slower, as their operand leaves no room for a third pipeline stage; not kept.)
#: ``loads``: how the interior kv blocks of prefill are read, "tma" (tensor descriptors,
#: Hopper and newer; falls back to pointers where a layout is not TMA-addressable) or
#: "pointers" (masked pointer loads).
#: ``row_constant``: pasa-exact's c = scale * Q . mean16 per (row, block): "precomputed"
#: (each query tile computes its constants for all the blocks it visits before its kv
#: loop, 16 blocks per thin matmul, into a workspace of B*N*S1*S2/kv_block fp32 values it
#: reads back per block; 1-16% faster at d=64 and 128 in tools/ablate.py), "in-kernel"
#: (a thin matmul per block inside the loop, no workspace) or
#: "auto": precomputed while that workspace is no larger than Q, K and V together
#: (S1 <= 24k at d=128), in-kernel beyond, where it would grow as S1 * S2.
TUNING = {"prefill": "auto", "shift": "separate", "loads": "tma", "row_constant": "auto"}
TUNING_CHOICES = {"prefill": ("auto", "warp-specialised", "triton"),
                  "shift": ("separate", "fused"), "loads": ("tma", "pointers"),
                  "row_constant": ("auto", "precomputed", "in-kernel")}


# --------------------------------------------------------------------------- helpers


@triton.jit
def _exp(x):
    """e^x as ``ex2.approx.ftz`` of x * log2(e). ``tl.exp`` emits the same multiply and the
    non-ftz ex2, whose subnormal-range fix-up adds a compare and two multiplies per element
    to the softmax loop; the two differ only where e^x < 2^-126, far below fp16's smallest
    value and below any fp32 sum they enter."""
    return tl.exp2(x * 1.4426950408889634)


@triton.jit
def _guarded_max(s, rm, vis, MASKED: tl.constexpr, GUARD: tl.constexpr, ROUND: tl.constexpr,
                 low: tl.constexpr):
    """Row maximum with the rounding guard of DESIGN.md §2.5 (natural-log units)."""
    if GUARD:
        tie = s == rm[:, None]
        if MASKED:
            tie = tie & vis
        ties = tl.sum(tie.to(tl.int32), 1)
        offset = tl.where(rm > 0, (GUARD_FACTOR - 1.0) * rm, -rm)
        offset = tl.minimum(tl.maximum(offset, GUARD_MIN), GUARD_MAX)
        guarded = rm + offset
        if ROUND:
            guarded = _rl(guarded, low)
        rm = tl.where((ties > 1) & (rm > float("-inf")), guarded, rm)
    return rm


GUARD_FACTOR = tl.constexpr(numerics.GUARD_FACTOR)
GUARD_MIN = tl.constexpr(numerics.GUARD_MIN_OFFSET)
GUARD_MAX = tl.constexpr(numerics.GUARD_MAX_OFFSET)


@triton.jit
def _block_update(q, k, v, c, vis, row_any, m, l, acc, f, cnt, scale, gamma,
                  PSEUDO_AVERAGE_SHIFT: tl.constexpr, EXACT_SHIFT: tl.constexpr,
                  LOW_SCORES: tl.constexpr, LOW_STATISTICS: tl.constexpr,
                  MASKED: tl.constexpr, GUARD: tl.constexpr, BLOCK_N: tl.constexpr):
    """One kv block of online softmax for the allocation the flags name
    (:func:`pasa_npu.fallback.kernel_common.allocation_flags`). Rows that see no key of
    the block (MASKED only: ``row_any`` False) keep their state. ``c``: pasa-exact's
    per-row constant scale * (Q . mean16) of this block (fp32). With low-precision
    statistics (fa-fp16, pasa) ``acc`` is fp16 too and the steps run as native fp16
    operations: each rounds once, as the CPU backend's fp32-then-round steps do (the
    kernels are launched without FMA contraction). Returns the new state."""
    qk = tl.dot(q, tl.trans(k))  # fp32 accumulation
    low: tl.constexpr = q.dtype  # fp16, or bf16 for fa-* on bf16 inputs
    if not (PSEUDO_AVERAGE_SHIFT or EXACT_SHIFT or LOW_STATISTICS):  # fa-fp32, fa-fp16s
        if LOW_SCORES:
            qk = _rl(qk, low)  # fp16 unscaled scores: overflow happens here
        s = qk * scale
        if MASKED:
            s = tl.where(vis, s, float("-inf"))
        rm = _guarded_max(s, tl.max(s, 1), vis, MASKED, GUARD, False, low)
        m_new = tl.maximum(m, rm)
        alpha = tl.exp2((m - m_new) * 1.4426950408889634)
        p = tl.exp2(s * 1.4426950408889634 - (m_new * 1.4426950408889634)[:, None])
        l_new = alpha * l + tl.sum(p, 1)
        acc_new = acc * alpha[:, None] + tl.dot(p.to(low), v)
        f_new = f
    elif not (PSEUDO_AVERAGE_SHIFT or EXACT_SHIFT):  # fa-fp16: every step fp16
        s = _rl(_rl(qk, low) * scale, low)
        if MASKED:
            s = tl.where(vis, s, float("-inf"))
        rm = _guarded_max(s, tl.max(s, 1), vis, MASKED, GUARD, True, low)
        m_new = tl.maximum(m, rm)
        alpha = _rl(_exp(_rl(m - m_new, low)), low)
        p = _rl(_exp(_rl(s - m_new[:, None], low)), low)
        l_new = _rl(_rl(alpha * l, low) + _rl(tl.sum(p, 1), low), low)
        pv = tl.dot(p.to(low), v).to(low)
        acc_new = acc * alpha.to(low)[:, None] + pv
        f_new = f
    elif PSEUDO_AVERAGE_SHIFT:  # pasa (fp16 statistics), pasa-mixed (fp32 statistics)
        sp16 = _fp16(qk)
        sp = sp16.to(tl.float32)
        s_mean = tl.sum(sp16.to(tl.float32), 1) / BLOCK_N  # all columns M averaged, masked or not
        if LOW_STATISTICS:
            s_mean = _rl(s_mean, low)
        if MASKED:
            sp = tl.where(vis, sp, float("-inf"))
            sp16 = tl.where(vis, sp16, float("-inf"))
        # the max of fp16 values is an fp16 value: packed fp16 max, the same result
        m_loc = _guarded_max(sp, tl.max(sp16, 1).to(tl.float32), vis, MASKED, GUARD,
                             LOW_STATISTICS, low)
        cnt1 = cnt + 1.0
        if LOW_STATISTICS:
            p16 = _exp((sp16 - m_loc.to(low)[:, None]).to(tl.float32)).to(low)
            if MASKED:
                p16 = tl.where(vis, p16, 0.0)
            l_loc = _rl(tl.sum(p16.to(tl.float32), 1), low)
            f_new = _rl(_rl(_rl((cnt1 - 1.0) * f, low) + s_mean, low) / cnt1, low)
            x = _rl(m + _rl(gamma * _rl(f - f_new, low), low), low)
            y = _rl(m_loc + _rl(gamma * _rl(s_mean - f_new, low), low), low)
            m_new = tl.maximum(x, y)
            alpha = _rl(_exp(_rl(x - m_new, low)), low)
            beta_w = _rl(_exp(_rl(y - m_new, low)), low)
            l_new = _rl(_rl(alpha * l, low) + _rl(beta_w * l_loc, low), low)
            pv = _fp16(tl.dot(p16, v))
            acc_new = acc * alpha.to(low)[:, None] + pv * beta_w.to(low)[:, None]
        else:
            p = _exp(sp - m_loc[:, None])
            l_loc = tl.sum(p, 1)
            f_new = ((cnt1 - 1.0) * f + s_mean) / cnt1
            x = m + gamma * (f - f_new)
            y = m_loc + gamma * (s_mean - f_new)
            m_new = tl.maximum(x, y)
            alpha = _exp(x - m_new)
            beta_w = _exp(y - m_new)
            l_new = alpha * l + beta_w * l_loc
            acc_new = acc * alpha[:, None] + tl.dot(p.to(low), v) * beta_w[:, None]
    else:  # pasa-exact: per-row constant c carried in fp32, FA-2 update
        sp16 = _fp16(qk)
        if MASKED:
            sp16 = tl.where(vis, sp16, float("-inf"))
        rm = tl.max(sp16, 1).to(tl.float32)  # the max of fp16 values is an fp16 value
        sp = sp16.to(tl.float32)
        m_new = tl.maximum(m, _guarded_max(sp, rm, vis, MASKED, GUARD, False, low) + c)
        alpha = tl.exp2((m - m_new) * 1.4426950408889634)
        p16 = tl.exp2(sp * 1.4426950408889634 - ((m_new - c) * 1.4426950408889634)[:, None]).to(low)
        l_new = alpha * l + tl.sum(p16.to(tl.float32), 1)
        acc_new = acc * alpha[:, None] + _fp16(tl.dot(p16, v)).to(tl.float32)
        f_new = f
    cnt_new = cnt + 1.0
    if MASKED:
        m_new = tl.where(row_any, m_new, m)
        l_new = tl.where(row_any, l_new, l)
        acc_new = tl.where(row_any[:, None], acc_new, acc)
        f_new = tl.where(row_any, f_new, f)
        cnt_new = tl.where(row_any, cnt_new, cnt)
    return m_new, l_new, acc_new, f_new, cnt_new


@triton.jit
def _initial_state(ROWS: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                   LOW_ACCUMULATOR: tl.constexpr, low: tl.constexpr):
    """Empty online-softmax state (m, l, acc, f, cnt) and pasa-exact's row constant c;
    a low-precision accumulator is kept in ``low``."""
    m = tl.full([ROWS], float("-inf"), tl.float32)
    zeros = tl.zeros([ROWS], tl.float32)
    if LOW_ACCUMULATOR:
        acc = tl.zeros([ROWS, HEAD_DIM_V], low)
    else:
        acc = tl.zeros([ROWS, HEAD_DIM_V], tl.float32)
    return m, zeros, acc, zeros, zeros, zeros


@triton.jit
def _finish(m, l, acc, f, cnt, gamma, PSEUDO_AVERAGE_SHIFT: tl.constexpr):
    """Normalised output and LSE; 0 and -inf for rows that saw no key."""
    seen = cnt > 0
    l_safe = tl.where(seen, l, 1.0)
    o = tl.where(seen[:, None], acc / l_safe[:, None], 0.0)
    true_max = m
    if PSEUDO_AVERAGE_SHIFT:
        true_max = m + gamma * f
    lse = tl.where(seen, true_max + tl.log(l_safe), float("-inf"))
    return o, lse


# --------------------------------------------------------------------------- preprocessing


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
def _row_constant(q, mean, scale):
    """pasa-exact's c = scale * (Q . mean16) for one block: a thin extra matmul column with
    fp32 accumulation; the other 15 columns are zero, so the row sum is column 0 exactly."""
    col = tl.arange(0, 16)
    mean_tile = tl.where(col[None, :] == 0, mean[:, None], 0.0).to(q.dtype)
    return tl.sum(tl.dot(q, mean_tile), 1) * scale


@triton.jit
def _tile_row_constants(q, mean_base, c_base, rows, q_len, dims, lo, hi, stride_mblk,
                        stride_cblk, scale):
    """pasa-exact: c = scale * (Q . mean16) of one query tile for the kv blocks [lo, hi) it
    will visit, 16 blocks per matmul (fp32 accumulation), stored in the tile's own rows of
    the workspace C[b, h, blk, row] for the kv loop to load block by block (from L2)."""
    sixteen = tl.arange(0, 16)
    for blk0 in range(lo, hi, 16):
        blks = blk0 + sixteen
        means = tl.load(mean_base + blks[:, None].to(tl.int64) * stride_mblk + dims[None, :],
                        mask=blks[:, None] < hi, other=0.0)
        c = tl.dot(q, tl.trans(means)) * scale  # (BLOCK_M, 16)
        tl.store(c_base + blks[None, :].to(tl.int64) * stride_cblk + rows[:, None], c,
                 mask=(blks[None, :] < hi) & (rows[:, None] < q_len))
    tl.debug_barrier()  # the loop reads constants other threads of the program wrote


@triton.jit
def _shift_in_kernel(k, SHIFT, scale, EXACT_SHIFT: tl.constexpr, BLOCK_N: tl.constexpr):
    """K' of one zero-padded raw K tile: in the preprocessing pass (``_shift_keys``) and
    inside the attention loop (fused: decode, and prefill when TUNING["shift"] == "fused").
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


# --------------------------------------------------------------------------- prefill


@triton.jit
def _attention_fwd(
    Q, K, V, O, LSE, C, MEANS, MASK, SHIFT, K_DESC, V_DESC,
    q_starts, q_lens, kv_starts, kv_lens, band_pre, band_next,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_ob, stride_oh, stride_os, stride_od,
    stride_lb, stride_lh, stride_ls,
    stride_cb, stride_ch, stride_cblk,
    stride_mb, stride_mh, stride_mblk,
    stride_xb, stride_xs, stride_xk,
    n_heads, n_tiles, group, scale, gamma, head_dim, head_dim_v,
    PSEUDO_AVERAGE_SHIFT: tl.constexpr, EXACT_SHIFT: tl.constexpr, LOW_SCORES: tl.constexpr,
    LOW_STATISTICS: tl.constexpr, LOW_ACCUMULATOR: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BAND: tl.constexpr, HAS_LSE: tl.constexpr,
    GRID_1D: tl.constexpr,
    GUARD: tl.constexpr, K_PADDED: tl.constexpr, FUSED_SHIFT: tl.constexpr,
    USE_TMA: tl.constexpr, C_PER_BLOCK: tl.constexpr, LOOPS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
):
    # heaviest tiles first: under causal and band masks the last query tiles see the most keys
    if GRID_1D:  # more (batch, head) pairs than CUDA's 65535 on a grid's second axis
        pid_m = n_tiles - 1 - tl.program_id(0) % n_tiles
        bh = tl.program_id(0) // n_tiles
    else:  # the same order from a 2-D grid: the 1-D form, and even n_tiles in place of
        # num_programs here, ran a few percent slower for pasa-exact on an H100
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
        bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    hk = h // group
    q_len = tl.load(q_lens + b)
    m0 = pid_m * BLOCK_M
    if m0 >= q_len:
        return
    q_start = tl.load(q_starts + b)
    kv_start = tl.load(kv_starts + b)
    kv_len = tl.load(kv_lens + b)

    # index arithmetic in int32 (lengths and bands are clamped to it on the host);
    # int64 only for the base offsets of pointers
    rows = m0 + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    dims_v = tl.arange(0, HEAD_DIM_V)
    cols = tl.arange(0, BLOCK_N)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
                + (q_start + rows)[:, None].to(tl.int64) * stride_qs + dims[None, :] * stride_qd,
                mask=(rows[:, None] < q_len) & (dims[None, :] < head_dim), other=0.0)

    # the kv range this tile can see, and the interior blocks every valid row sees whole
    lo, hi, full_lo, full_hi, pre, nxt = _tile_kv_blocks(m0, q_len, kv_len, band_pre, band_next,
                                                         b, HAS_BAND, BLOCK_M, BLOCK_N)
    if HAS_MASK:  # an explicit mask: every block goes through the masked loop
        full_lo = hi
        full_hi = hi

    k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    if not K_PADDED:
        k_base += kv_start.to(tl.int64) * stride_ks
    v_base += kv_start.to(tl.int64) * stride_vs
    k_offs = cols[:, None] * stride_ks + dims[None, :] * stride_kd
    v_offs = cols[:, None] * stride_vs + dims_v[None, :] * stride_vd
    # pasa-exact's row constants from the block means mean16 (B, Nkv, blocks, D): one thin
    # matmul per block in the loop (C_PER_BLOCK), or computed for the whole tile up front
    # into the workspace C (B, N, blocks, S1) and loaded per block
    mean_base = MEANS + b.to(tl.int64) * stride_mb + hk.to(tl.int64) * stride_mh
    c_base = C + b.to(tl.int64) * stride_cb + h.to(tl.int64) * stride_ch
    mask_base = MASK + b.to(tl.int64) * stride_xb
    if EXACT_SHIFT and not FUSED_SHIFT and not C_PER_BLOCK:
        _tile_row_constants(q, mean_base, c_base, rows, q_len, dims, lo, hi, stride_mblk,
                            stride_cblk, scale)

    m, l, acc, f, cnt, c = _initial_state(BLOCK_M, HEAD_DIM_V, LOW_ACCUMULATOR, q.dtype)

    for stage in tl.static_range(3):
        if (LOOPS >> stage) & 1:  # a loop that can never run is compiled out
            if stage == 0:
                start, stop = lo, full_lo
            elif stage == 1:
                start, stop = full_lo, full_hi
            else:
                start, stop = full_hi, hi
            for blk in range(start, stop):
                n0 = blk * BLOCK_N
                k_ptrs = k_base + tl.cast(n0, tl.int64) * stride_ks + k_offs
                v_ptrs = v_base + tl.cast(n0, tl.int64) * stride_vs + v_offs
                if EXACT_SHIFT and not FUSED_SHIFT:
                    if C_PER_BLOCK:
                        mean = tl.load(mean_base + tl.cast(blk, tl.int64) * stride_mblk + dims)
                        c = _row_constant(q, mean.to(tl.float32), scale)
                    else:
                        c = tl.load(c_base + tl.cast(blk, tl.int64) * stride_cblk + rows,
                                    mask=rows < q_len, other=0.0)
                if stage == 1:
                    if USE_TMA:  # interior blocks lie inside the tensors: no masks needed
                        k_row = n0 if K_PADDED else kv_start + n0
                        k = K_DESC.load([tl.where(stride_kb == 0, 0, b), hk, k_row, 0]).reshape(
                            BLOCK_N, HEAD_DIM)
                        v = V_DESC.load([tl.where(stride_vb == 0, 0, b), hk, kv_start + n0, 0]
                                        ).reshape(BLOCK_N, HEAD_DIM_V)
                    else:
                        if K_PADDED:
                            k = tl.load(k_ptrs)
                        else:
                            k = tl.load(k_ptrs, mask=dims[None, :] < head_dim, other=0.0)
                        v = tl.load(v_ptrs, mask=dims_v[None, :] < head_dim_v, other=0.0)
                    vis = None  # interior: every row sees every key of the block
                    row_any = None
                else:
                    n = n0 + cols
                    in_kv = n < kv_len
                    if K_PADDED:
                        k = tl.load(k_ptrs)
                    else:
                        k = tl.load(k_ptrs, mask=in_kv[:, None] & (dims[None, :] < head_dim),
                                    other=0.0)
                    v = tl.load(v_ptrs, mask=in_kv[:, None] & (dims_v[None, :] < head_dim_v),
                                other=0.0)
                    if stage == 2 and not HAS_MASK:
                        # a trailing block (the diagonal, a block past kv_len) lies past
                        # every row's lower edge: a key is visible where its column is at
                        # most the row's last visible one (-1: none), one compare per score
                        last = kv_len - 1 + rows * 0
                        if HAS_BAND:
                            last = tl.minimum(last, rows + nxt)
                        last = tl.where(rows < q_len, last - n0, -1)
                        vis = cols[None, :] <= last[:, None]
                        row_any = last >= 0
                    else:
                        vis = in_kv[None, :] & (rows[:, None] < q_len)
                        # which rows see a key of this block: analytic from the band (1-D
                        # work), from the tile itself only under an explicit mask
                        first = n0 + rows * 0
                        last = tl.minimum(n0 + BLOCK_N, kv_len) - 1
                        if HAS_BAND:
                            vis = (vis & (n[None, :] >= rows[:, None] - pre)
                                   & (n[None, :] <= rows[:, None] + nxt))
                            first = tl.maximum(first, rows - pre)
                            last = tl.minimum(last, rows + nxt)
                        row_any = (first <= last) & (rows < q_len)
                    if HAS_MASK:
                        masked = tl.load(mask_base + rows[:, None].to(tl.int64) * stride_xs
                                         + n[None, :] * stride_xk,
                                         mask=(rows[:, None] < q_len) & in_kv[None, :], other=1)
                        vis = vis & (masked == 0)
                        row_any = tl.max(vis.to(tl.int32), 1) > 0
                if FUSED_SHIFT:
                    k, mean = _shift_in_kernel(k, SHIFT, scale, EXACT_SHIFT, BLOCK_N)
                    if EXACT_SHIFT:
                        c = _row_constant(q, mean, scale)
                m, l, acc, f, cnt = _block_update(q, k, v, c, vis, row_any, m, l, acc, f, cnt,
                                                  scale, gamma, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT,
                                                  LOW_SCORES, LOW_STATISTICS, stage != 1, GUARD,
                                                  BLOCK_N)

    o, lse = _finish(m, l, acc.to(tl.float32), f, cnt, gamma, PSEUDO_AVERAGE_SHIFT)
    row_ok = rows < q_len
    tl.store(O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
             + (q_start + rows)[:, None].to(tl.int64) * stride_os + dims_v[None, :] * stride_od,
             o.to(O.dtype.element_ty), mask=row_ok[:, None] & (dims_v[None, :] < head_dim_v))
    if HAS_LSE:
        tl.store(LSE + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh
                 + (q_start + rows).to(tl.int64) * stride_ls, lse, mask=row_ok)


# --------------------------------------------------------------------------- decode


@triton.jit
def _decode_split(
    Q, K, V, MASK, SHIFT, PART_O, PART_LSE,
    q_starts, kv_starts, kv_lens,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_xb, stride_xk,
    n_kv_heads, group, scale, gamma, head_dim, head_dim_v, blocks_per_split, n_splits,
    n_chunks, group_rows,
    PSEUDO_AVERAGE_SHIFT: tl.constexpr, EXACT_SHIFT: tl.constexpr, LOW_SCORES: tl.constexpr,
    LOW_STATISTICS: tl.constexpr, LOW_ACCUMULATOR: tl.constexpr,
    HAS_MASK: tl.constexpr, GUARD: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
):
    """One split of the kv blocks for BLOCK_G query heads of one kv head's group (a group
    larger than BLOCK_G is cut into ``n_chunks``), query length 1. Writes the partial
    results to rows ``chunk * BLOCK_G + g`` of the group's ``group_rows``. PASA's key shift
    is done here on each zero-padded raw K block (fused)."""
    # a 1-D grid, chunks of a group fastest (they read the same K/V blocks): CUDA caps
    # the grid's other axes at 65535
    pid = tl.program_id(0)
    chunk = pid % n_chunks
    split = pid // n_chunks % n_splits
    bh = pid // n_chunks // n_splits
    b = bh // n_kv_heads
    hk = bh % n_kv_heads
    q_start = tl.load(q_starts + b).to(tl.int64)
    kv_start = tl.load(kv_starts + b).to(tl.int64)
    kv_len = tl.load(kv_lens + b)
    g = chunk * BLOCK_G + tl.arange(0, BLOCK_G)  # query heads of the group
    dims = tl.arange(0, HEAD_DIM)
    dims_v = tl.arange(0, HEAD_DIM_V)
    cols = tl.arange(0, BLOCK_N)
    heads = hk * group + g
    q = tl.load(Q + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh
                + q_start * stride_qs + dims[None, :] * stride_qd,
                mask=(g[:, None] < group) & (dims[None, :] < head_dim), other=0.0)
    k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh + kv_start * stride_ks
    v_base = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh + kv_start * stride_vs

    m, l, acc, f, cnt, c = _initial_state(BLOCK_G, HEAD_DIM_V, LOW_ACCUMULATOR, q.dtype)
    n_blocks = (kv_len + BLOCK_N - 1) // BLOCK_N
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, n_blocks)
    for blk in range(first, last):
        n = blk * BLOCK_N + cols
        in_kv = n < kv_len
        k = tl.load(k_base + n[:, None].to(tl.int64) * stride_ks + dims[None, :] * stride_kd,
                    mask=in_kv[:, None] & (dims[None, :] < head_dim), other=0.0)
        v = tl.load(v_base + n[:, None].to(tl.int64) * stride_vs + dims_v[None, :] * stride_vd,
                    mask=in_kv[:, None] & (dims_v[None, :] < head_dim_v), other=0.0)
        if PSEUDO_AVERAGE_SHIFT or EXACT_SHIFT:
            k, mean = _shift_in_kernel(k, SHIFT, scale, EXACT_SHIFT, BLOCK_N)
            if EXACT_SHIFT:
                c = _row_constant(q, mean, scale)
        vis = in_kv[None, :] & (g[:, None] < group)
        if HAS_MASK:
            masked = tl.load(MASK + b.to(tl.int64) * stride_xb + n * stride_xk, mask=in_kv,
                             other=1)
            vis = vis & (masked == 0)[None, :]
        row_any = tl.max(vis.to(tl.int32), 1) > 0
        m, l, acc, f, cnt = _block_update(q, k, v, c, vis, row_any, m, l, acc, f, cnt, scale, gamma,
                                          PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, LOW_SCORES,
                                          LOW_STATISTICS, True, GUARD, BLOCK_N)
    o, lse = _finish(m, l, acc.to(tl.float32), f, cnt, gamma, PSEUDO_AVERAGE_SHIFT)
    rows = (bh * n_splits + split).to(tl.int64) * group_rows + g
    tl.store(PART_O + rows[:, None] * HEAD_DIM_V + dims_v[None, :], o)
    tl.store(PART_LSE + rows, lse)


@triton.jit
def _decode_combine(PART_O, PART_LSE, O, LSE, q_starts, q_lens,
                    stride_ob, stride_oh, stride_os, stride_od, stride_lb, stride_lh, stride_ls,
                    n_heads, group, head_dim_v, n_splits, group_rows,
                    HAS_LSE: tl.constexpr, SPLITS: tl.constexpr,
                    CHUNK: tl.constexpr, HEAD_DIM_V: tl.constexpr):
    """Merge the splits of one (batch, query head) by log-sum-exp, in fp32, CHUNK splits
    per load. (One program per kv head, looping over the splits one load at a time, made
    this latency-bound pass several times slower on an H100.)"""
    pid = tl.program_id(0)
    b = pid // n_heads
    h = pid % n_heads
    if tl.load(q_lens + b) == 0:
        return
    q_start = tl.load(q_starts + b).to(tl.int64)
    dims_v = tl.arange(0, HEAD_DIM_V)
    # the partial results of kv head h // group sit in row h % group of its group's rows
    first_row = (b * (n_heads // group) + h // group).to(tl.int64) * n_splits * group_rows \
        + h % group
    sp = tl.arange(0, SPLITS)
    lse_s = tl.load(PART_LSE + first_row + sp * group_rows, mask=sp < n_splits,
                    other=float("-inf"))
    top = tl.max(lse_s, 0)
    top_safe = tl.where(top > float("-inf"), top, 0.0)
    total = tl.sum(tl.exp(lse_s - top_safe), 0)
    chunk = tl.arange(0, CHUNK)
    o = tl.zeros([HEAD_DIM_V], tl.float32)
    for s0 in range(0, n_splits, CHUNK):
        valid = s0 + chunk < n_splits
        rows = first_row + (s0 + chunk) * group_rows
        w = tl.exp(tl.load(PART_LSE + rows, mask=valid, other=float("-inf")) - top_safe)
        part = tl.load(PART_O + rows[:, None] * HEAD_DIM_V + dims_v[None, :],
                       mask=valid[:, None], other=0.0)
        o += tl.sum(part * w[:, None], 0)
    seen = total > 0
    o = tl.where(seen, o / tl.where(seen, total, 1.0), 0.0)
    lse = tl.where(seen, top_safe + tl.log(tl.where(seen, total, 1.0)), float("-inf"))
    tl.store(O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + q_start * stride_os
             + dims_v * stride_od, o.to(O.dtype.element_ty), mask=dims_v < head_dim_v)
    if HAS_LSE:
        tl.store(LSE + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh
                 + q_start * stride_ls, lse)


# --------------------------------------------------------------------------- host


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # triton.cdiv is a constexpr function, slow to call from the host


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, 1 << (max(n, 1) - 1).bit_length())


def _interpreting() -> bool:
    return INTERPRET.value


def _launch_config(head_dim: int, alg: str, interpret: bool, extra_operand: bool = False,
                   loops: int = 7, masked: bool = False):
    """(BLOCK_M, num_warps, num_stages) for the prefill kernel, as measured fastest on an
    H100. ``extra_operand``: the kernel stages one more matmul operand in shared memory
    (pasa-exact's in-kernel row constant, a fused key shift). ``loops``: the kv-block
    loops compiled in (:func:`_block_loops`). ``masked``: an explicit mask, whose tile
    is staged with K and V."""
    if interpret:
        return 16, 1, 1
    if head_dim > 128:  # 128 x 256 fp16 K and V tiles: one stage fits shared memory
        return 64, 8, 1
    if head_dim == 128 and (extra_operand or masked):
        # the extra operand, or the 128 x 128 mask tile (three stages of K, V and mask
        # need 241 KiB, over the H100's 227), leaves no room for a third stage
        return 128, 8, 2
    if head_dim <= 64 and alg in ("pasa", "pasa-exact"):
        # tools/ablate.py at d=64, S = 4k and 16k: where only the interior loop runs,
        # 128-row tiles in two stages (pasa-exact 354 and 375 TFLOP/s against 330 and 338
        # for 64 rows in three; pasa 313 and 328 against 310 and 306 for 64 rows in two);
        # with the masked loops compiled in (causal), 64-row tiles in three stages
        # (pasa-exact 278 and 332 against 271 and 326; pasa even), except for pasa-exact's
        # row constant in the loop (pasa-bench at S = 16k causal: 282 against 300-320)
        if loops == 2 or extra_operand:
            return 128, 4, 2
        return 64, 4, 3
    if head_dim <= 64 and alg == "pasa-mixed":
        # 64-row tiles (pasa-bench without a mask at S = 4k and 16k: 350 and 370 TFLOP/s,
        # against 254 and 276 with pasa's 128-row tiles)
        return (64, 4, 2) if loops == 2 else (64, 4, 3)
    return 128, 8, 3


def _row_constant_in_kernel(problem: AttentionProblem, block_n: int) -> bool:
    """pasa-exact: compute c per block in the kv loop, without the workspace (TUNING)."""
    if not problem.allocation.exact_shift:
        return False
    choice = TUNING["row_constant"]
    if choice != "auto":
        return choice == "in-kernel"
    q, k, v = problem.query, problem.key, problem.value
    workspace = 4 * q.shape[0] * q.shape[1] * _cdiv(problem.max_kv_len, block_n) * q.shape[2]
    return workspace > 2 * (q.numel() + k.numel() + v.numel())


_HOST_INTS: dict = {}
_DEVICE_METADATA: dict = {}
_CAPTURED_METADATA: dict = {}  # read by captured CUDA graphs: never freed


def _host_ints(values: torch.Tensor) -> tuple[int, ...]:
    """Small per-batch metadata (lengths, band limits) as Python ints, cached by identity:
    the API layer reuses its length tensors across calls with the same arguments and never
    writes them."""
    hit = _HOST_INTS.get(id(values))
    if hit is not None and hit[0] is values:
        return hit[1]
    if len(_HOST_INTS) > 512:
        _HOST_INTS.clear()
    ints = tuple(values.tolist())
    _HOST_INTS[id(values)] = (values, ints)
    return ints


def _device_metadata(problem: AttentionProblem, device: torch.device) -> tuple:
    """(q_starts, q_lens, kv_starts, kv_lens, band_pre, band_next) as int32 rows of one
    tensor on ``device`` (the band rows repeat q_lens when there is no band; band limits
    are clamped to +-INT_BIG).

    Cached by value: a repeated call copies nothing. New values (a decode step whose
    lengths grew) are copied from pinned memory without blocking, so the host never waits
    for the work queued on the stream, as a pageable copy would make it. Another stream
    that reuses the copy waits for it on the GPU. While a CUDA graph is being captured the
    copy is captured; an entry a graph reads, and the pinned source of a captured copy, are
    kept for good."""
    rows = [_host_ints(t) for t in (problem.q_starts, problem.q_lens, problem.kv_starts,
                                    problem.kv_lens)]
    if problem.band is not None:
        rows += [tuple(max(-INT_BIG, min(INT_BIG, x)) for x in _host_ints(t))
                 for t in problem.band]
    else:
        rows += [rows[1], rows[1]]
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device, tuple(rows))
    capturing = cuda and torch.cuda.is_current_stream_capturing()
    # the raw handle Triton launches on: a cheap query, unlike torch.cuda.current_stream
    stream = torch._C._cuda_getCurrentRawStream(device.index) if cuda else None
    entry = _DEVICE_METADATA.get(key) or _CAPTURED_METADATA.get(key)
    if entry is None:
        if max((max(row, default=0) for row in rows[:4]), default=0) > INT_BIG:  # all >= 0
            raise NotImplementedError(f"the Triton backend indexes in int32; got lengths "
                                      f"{[list(r) for r in rows[:4]]}")
        if len(_DEVICE_METADATA) > 512:
            _DEVICE_METADATA.clear()
        host = torch.tensor(rows, dtype=torch.int32, pin_memory=cuda)
        copy = host.to(device, non_blocking=True)
        copied = None
        if cuda and not capturing:
            copied = torch.cuda.Event()
            copied.record()
        entry = _DEVICE_METADATA[key] = _Metadata(copy.unbind(0), copy, stream, copied,
                                                  host if capturing else None)
    elif cuda and stream != entry.stream and not capturing:
        # (a capture starts after a device synchronisation: the copy is complete then)
        current = torch.cuda.current_stream(device)
        if entry.copied is not None:
            current.wait_event(entry.copied)
        entry.tensor.record_stream(current)  # not reused while this stream may read it
    if capturing:
        _CAPTURED_METADATA[key] = entry
    return entry.rows


class _Metadata(NamedTuple):
    rows: tuple            # the six int32 rows: views of ``tensor``
    tensor: torch.Tensor   # on the device
    stream: object         # the raw handle of the stream the copy was issued on
    copied: object         # an event after the copy (None where there is no CUDA stream)
    pinned_source: object  # the host tensor a captured copy reads on every replay


def _block_loops(problem: AttentionProblem, block_n: int) -> int:
    """Which of the prefill kernel's three kv-block loops can run for ``problem``, as bits:
    1 the leading masked blocks, 2 the interior blocks, 4 the trailing masked blocks. The
    others are compiled out: without the empty loops fa-fp32 and pasa-exact ran 1-14%
    faster at d=128 on an H100 (tools/ablate.py, all eight cases; -5 to +5% at d=64).
    Conservative: a set bit only allows the loop to run."""
    if problem.mask is not None:
        return 1  # an explicit mask sends every block through the leading masked loop
    loops = 2
    if any(n % block_n for n in _host_ints(problem.kv_lens)):
        loops |= 4  # a ragged last block
    if problem.band is not None:
        pre, nxt = (_host_ints(t) for t in problem.band)
        if min(pre, default=0) < problem.max_q_len:
            loops |= 1  # the band's left edge cuts into some tile's keys
        if min(nxt, default=0) + 1 < problem.max_kv_len:
            loops |= 4  # its right edge (causal: the diagonal)
    return loops


@functools.lru_cache(maxsize=16)
def _placeholder(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A never-read stand-in for an absent tensor argument (no mask, no LSE, ...)."""
    return torch.zeros(1, 1, 1, dtype=dtype, device=device)


@functools.lru_cache(maxsize=64)
def _cached_shift_matrix(beta: float, n: int, scale: float, device: torch.device):
    return shift_matrix(beta, n, torch.float16, scale, device).contiguous()


def _prepare_keys(problem, k, kv_starts, kv_lens, block_n, head_dim_p):
    """The separate preprocessing pass: K' padded to whole blocks and the block means."""
    dev = k.device
    batch, n_kv = problem.batch, k.shape[1]
    n_blocks = max(1, _cdiv(problem.max_kv_len, block_n))
    k_shift = torch.empty(batch, n_kv, n_blocks * block_n, head_dim_p, dtype=torch.float16,
                          device=dev)
    means = torch.empty(batch, n_kv, n_blocks, head_dim_p, dtype=torch.float16, device=dev)
    exact = problem.allocation.exact_shift
    shift = means if exact else _cached_shift_matrix(problem.beta, block_n, problem.scale, dev)
    launch(
        _shift_keys, (n_blocks * batch * n_kv,),
        k, k_shift, means, shift, kv_starts, kv_lens,
        0 if problem.packed else k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        k_shift.stride(0), k_shift.stride(1), k_shift.stride(2),
        means.stride(0), means.stride(1), means.stride(2),
        n_kv, n_blocks, problem.scale, k.shape[3],
        EXACT_SHIFT=exact, BLOCK_N=block_n, HEAD_DIM=head_dim_p,
        num_warps=1 if _interpreting() else 4)
    return k_shift, means


def run(problem: AttentionProblem) -> None:
    """Compute ``problem`` with the Triton kernels, writing its output and LSE views."""
    q, k, v = problem.query, problem.key, problem.value
    alg = problem.allocation.name
    block_n = problem.tiling.kv_block
    if block_n < 16 or block_n & (block_n - 1):
        raise NotImplementedError(f"the Triton backend needs kv_block a power of two >= 16, got "
                                  f"{block_n}")
    head_dim, head_dim_v = q.shape[3], v.shape[3]
    head_dim_p, head_dim_vp = _pow2(head_dim), _pow2(head_dim_v)
    if head_dim_p > 256 or head_dim_vp > 256:
        raise NotImplementedError(f"the Triton backend supports head dims up to 256, got "
                                  f"{head_dim}/{head_dim_v}")
    dev = q.device
    interpret = _interpreting()
    *lengths, band_pre, band_next = _device_metadata(problem, dev)
    alloc = problem.allocation
    gamma = ideal_invariance(problem.beta) if alloc.pseudo_average_shift else 0.0
    if alloc.low_statistics:
        gamma = torch.tensor(gamma).half().item()  # the kernel's fp16 scalar
    mask, mask_strides = _mask_arg(problem.mask, dev)
    out, lse = problem.out, problem.lse
    lse_arg = lse if lse is not None else _placeholder(dev, torch.float32)
    packed_stride = (lambda t: 0) if problem.packed else (lambda t: t.stride(0))  # noqa: E731
    shift = (_cached_shift_matrix(problem.beta, block_n, problem.scale, dev)
             if alloc.pseudo_average_shift else None)
    common = dict(**allocation_flags(problem.allocation), HAS_MASK=problem.mask is not None,
                  GUARD=problem.rounding_guard,
                  BLOCK_N=block_n, HEAD_DIM=head_dim_p, HEAD_DIM_V=head_dim_vp)

    decode = (problem.max_q_len == 1 and problem.band is None
              and (problem.mask is None or problem.mask.shape[1] == 1))
    if decode:
        _run_decode(problem, lengths, mask, mask_strides, shift, lse_arg, gamma, common,
                    interpret)
        return

    if _gluon_prefill(problem):
        k_used, means = k, None
        if problem.allocation.shifts_keys:
            k_used, means = _prepare_keys(problem, k, lengths[2], lengths[3], block_n,
                                          head_dim_p)
        gluon_prefill.run(problem, gamma, k_used,
                          means if alloc.exact_shift else None,
                          band_pre, band_next, lse_arg)
        return

    fused = TUNING["shift"] == "fused" and problem.allocation.shifts_keys
    c_per_block = _row_constant_in_kernel(problem, block_n)
    loops = _block_loops(problem, block_n)
    block_m, warps, stages = _launch_config(head_dim_p, alg, interpret, fused or c_per_block,
                                            loops, problem.mask is not None)
    constants = _placeholder(dev, torch.float32)
    means = _placeholder(dev, torch.float16)
    if problem.allocation.shifts_keys and not fused:
        k_used, means = _prepare_keys(problem, k, lengths[2], lengths[3], block_n, head_dim_p)
        k_strides = tuple(k_used.stride())
        if alloc.exact_shift and not c_per_block:  # the kernel fills it
            constants = torch.empty(problem.batch, q.shape[1], means.shape[2],
                                    max(1, problem.max_q_len), dtype=torch.float32, device=dev)
    else:
        k_used = k
        k_strides = (packed_stride(k), k.stride(1), k.stride(2), k.stride(3))
    k_desc = v_desc = None
    if TUNING["loads"] == "tma" and _tma_capable(dev):
        k_desc = _descriptor(k_used, k_strides[0], block_n, head_dim_p)
        v_desc = _descriptor(v, packed_stride(v), block_n, head_dim_vp)
    use_tma = k_desc is not None and v_desc is not None
    n_tiles = _cdiv(problem.max_q_len, block_m)
    pairs = problem.batch * q.shape[1]
    grid_1d = pairs > GRID_AXIS_MAX
    grid = (n_tiles * pairs,) if grid_1d else (n_tiles, pairs)
    launch(
        _attention_fwd, grid,
        q, k_used, v, out, lse_arg, constants, means, mask,
        shift if shift is not None else constants,
        k_desc if use_tma else k_used, v_desc if use_tma else v,
        *lengths, band_pre, band_next,
        packed_stride(q), q.stride(1), q.stride(2), q.stride(3),
        *k_strides,
        packed_stride(v), v.stride(1), v.stride(2), v.stride(3),
        packed_stride(out), out.stride(1), out.stride(2), out.stride(3),
        (packed_stride(lse_arg) if lse is not None else 0), lse_arg.stride(1), lse_arg.stride(2),
        constants.stride(0), constants.stride(1), constants.stride(2),
        means.stride(0), means.stride(1), means.stride(2),
        *mask_strides,
        q.shape[1], n_tiles, q.shape[1] // k.shape[1], problem.scale, gamma, head_dim,
        head_dim_v, HAS_BAND=problem.band is not None, HAS_LSE=lse is not None,
        K_PADDED=problem.allocation.shifts_keys and not fused, FUSED_SHIFT=fused, USE_TMA=use_tma,
        C_PER_BLOCK=c_per_block, LOOPS=loops, GRID_1D=grid_1d,
        BLOCK_M=block_m, num_warps=warps, num_stages=stages, **common, **_fp_options(alloc))


#: the defaults of the switches only the Triton prefill kernel has
TRITON_KERNEL_DEFAULTS = {"shift": "separate", "loads": "tma", "row_constant": "auto"}


def _gluon_prefill(problem: AttentionProblem) -> bool:
    """Whether prefill runs on the warp-specialised Gluon kernel (TUNING["prefill"])."""
    choice = TUNING["prefill"]
    if choice == "auto" and any(TUNING[k] != v for k, v in TRITON_KERNEL_DEFAULTS.items()):
        return False  # a Triton-kernel switch was asked for: measure that kernel
    return choice != "triton" and gluon_prefill.supported(
        problem, [_host_ints(t) for t in (problem.q_starts, problem.q_lens, problem.kv_starts,
                                          problem.kv_lens)])


def _tma_capable(dev: torch.device) -> bool:
    """Tensor-memory-accelerator loads: Hopper and newer, or the interpreter."""
    if dev.type != "cuda":
        return _interpreting()
    return device_capability(dev.index if dev.index is not None
                             else torch.cuda.current_device())[0] >= 9


def _descriptor(t: torch.Tensor, batch_stride: int, rows: int, cols: int):
    """A TMA descriptor over the (B, N, S, D) view ``t`` loading (rows, cols) tiles, or None
    where TMA cannot address it (a strided last dim, strides or base not 16-byte aligned).
    Columns past D read as zero, as the masked loads do."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    strides = tma_strides(t, batch_stride)
    if strides is None:
        return None
    return TensorDescriptor(t, list(t.shape), strides, [1, 1, rows, cols])


def _decode_stages(allocation, head_dim: int) -> int:
    """Pipeline depth of the decode kernel that fits shared memory (PASA also stages K')."""
    stages = 2 if allocation.shifts_keys else 3
    return stages - 1 if head_dim > 128 else stages


def _fp_options(allocation) -> dict:
    """Low-precision statistics round after every operation: no FMA contraction."""
    return {"enable_fp_fusion": False} if allocation.low_statistics else {}


def _mask_arg(mask, dev):
    """The explicit mask as uint8 (a view of a bool mask, no copy) and its strides."""
    if mask is None:
        return _placeholder(dev, torch.uint8), (0, 0, 0)
    mask = mask.to(dev)
    mask = mask.view(torch.uint8) if mask.dtype == torch.bool else mask.to(torch.uint8)
    return mask, (mask.stride(0) if mask.shape[0] > 1 else 0, mask.stride(1), mask.stride(2))


def _decode_block_g(group: int, head_dim: int) -> int:
    """Query heads per decode program (the rows of its tiles): the whole group up to a cap
    that keeps the kernel within an H100's shared memory and registers (a group of 64
    rows at d = 256 overflowed shared memory for ``fa-*``; 64 rows at d = 128 spilled).
    Larger groups are cut into several programs that read the same K/V blocks."""
    cap = 64 if head_dim <= 64 else 32 if head_dim <= 128 else 16
    return min(_pow2(group), cap)


def _decode_resident(allocation, head_dim: int, block_g: int) -> int:
    """Programs of the decode kernel one H100 SM holds at once (4 warps), as its shared
    memory and registers allow: ``tools/triton_aot.py`` reports this for every variant
    the launch can pick (:func:`_decode_block_g`) and fails where it differs from this
    table."""
    if head_dim > 128:
        return 1
    if head_dim > 64:  # fa-*: three stages of K and V tiles; PASA: two, and K' besides
        return 2 if allocation.shifts_keys else 1
    # pasa-mixed: more registers
    return 3 if block_g <= 16 and allocation.name != "pasa-mixed" else 2


def _decode_splits(n_blocks: int, groups: int, sms: int, resident: int) -> int:
    """How many kv splits each of the ``groups`` (batch, kv head, chunk of the query group)
    is cut into: one wave of programs, ``resident`` per SM (:func:`_decode_resident`), and
    no more splits than kv blocks. Measured on an H100 at d = 128 (batch 1-16, GQA 4:1 and
    8:1, 2k-128k keys, one to 64 splits per case), this count was the fastest or close to
    it for pasa-exact, pasa and fa-fp32: more programs than a wave leave a partial last
    wave, and more splits give each program fewer kv blocks to pipeline."""
    return max(1, min(n_blocks, resident * sms // groups))


def _run_decode(problem, lengths, mask, mask_strides, shift, lse_arg, gamma, common, interpret):
    q, k, v, out = problem.query, problem.key, problem.value, problem.out
    q_starts, q_lens, kv_starts, kv_lens = lengths
    batch, n_heads, n_kv = problem.batch, q.shape[1], k.shape[1]
    group = n_heads // n_kv
    block_g = _decode_block_g(group, common["HEAD_DIM"])
    n_chunks = _cdiv(group, block_g)
    group_rows = n_chunks * block_g
    n_blocks = max(1, _cdiv(problem.max_kv_len, common["BLOCK_N"]))
    sms = 132 if interpret else sm_count(q.device.index or 0)
    resident = _decode_resident(problem.allocation, common["HEAD_DIM"], block_g)
    n_splits = _decode_splits(n_blocks, batch * n_kv * n_chunks, sms, resident)
    blocks_per_split = _cdiv(n_blocks, n_splits)
    n_splits = _cdiv(n_blocks, blocks_per_split)
    part_o = q.new_empty(batch * n_kv * n_splits * group_rows * common["HEAD_DIM_V"],
                         dtype=torch.float32)
    part_lse = q.new_empty(batch * n_kv * n_splits * group_rows, dtype=torch.float32)
    pb = (lambda t: 0) if problem.packed else (lambda t: t.stride(0))  # noqa: E731
    has_lse = problem.lse is not None
    launch(
        _decode_split, (n_chunks * n_splits * batch * n_kv,),
        q, k, v, mask, shift if shift is not None else part_lse, part_o, part_lse,
        q_starts, kv_starts, kv_lens,
        pb(q), q.stride(1), q.stride(2), q.stride(3),
        pb(k), k.stride(1), k.stride(2), k.stride(3),
        pb(v), v.stride(1), v.stride(2), v.stride(3),
        mask_strides[0], mask_strides[2],
        n_kv, group, problem.scale, gamma, q.shape[3], v.shape[3], blocks_per_split, n_splits,
        n_chunks, group_rows, BLOCK_G=block_g, num_warps=1 if interpret else 4,
        num_stages=1 if interpret else _decode_stages(problem.allocation, common["HEAD_DIM"]),
        **common, **_fp_options(problem.allocation))
    launch(
        _decode_combine, (batch * n_heads,),
        part_o, part_lse, out, lse_arg, q_starts, q_lens,
        pb(out), out.stride(1), out.stride(2), out.stride(3),
        (pb(lse_arg) if has_lse else 0), lse_arg.stride(1), lse_arg.stride(2),
        n_heads, group, v.shape[3], n_splits, group_rows,
        HAS_LSE=has_lse, SPLITS=_pow2(n_splits, 1),
        CHUNK=min(_pow2(n_splits, 1), COMBINE_CHUNK),
        HEAD_DIM_V=common["HEAD_DIM_V"], num_warps=1 if interpret else 4)
