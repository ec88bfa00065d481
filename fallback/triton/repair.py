"""The Triton backend's overflow repair (docs/design.md, "Overflow detection and repair").

The PASA kernels flag each query row whose output or LSE is not finite in the call's row
flags (:class:`pasa_npu.problem.OverflowCheck`). Prefill: a flagged row sets the call's
overflow word (an int32 on the device, followed by the repair's arrival count, both zero
before the attention kernel), and the repair launch (:func:`run`, the ``repair_kernel``
kernel) recomputes flagged rows by fa-fp32 (the raw K, fp32 scores and statistics; a paged
cache read through the block table, as the attention kernels read it) and marks them
repaired. It reads the word first and returns at once where it is zero, so a call that
does not overflow costs one small launch and no host synchronisation, and a CUDA graph
replays it as it is; where it is not, the last of its programs to finish zeroes the word
and the count again, so that a plan's next call reuses them without a fill. Decode: the
program that merges a group's splits recomputes each merged row that is not finite in
place by the same fa-fp32 tile (:func:`fp32_tile`), so a checked decode step adds no
launch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pasa_npu.fallback.kernel_common import (Binding, kv_row_offsets, tile_kv_blocks, cdiv,
                                             resident_programs)
from pasa_npu.fallback.triton.softmax import (block_update, finish_rows, fp32_product,
                                              initial_state, nonfinite_row_mask)
from pasa_npu.problem import ROW_FLAGGED, ROW_NONFINITE, ROW_REPAIRED, AttentionProblem

ROW_REPAIRED_C = tl.constexpr(ROW_REPAIRED)
ROW_NONFINITE_C = tl.constexpr(ROW_NONFINITE)
ROW_FLAGGED_C = tl.constexpr(ROW_FLAGGED)


@triton.jit
def repair_kernel(Q, K, V, O, LSE, FLAGS, OVERFLOW_WORD, MASK, PAGES, SINK, q_starts, q_lens, kv_starts,
            kv_lens, band_pre, band_next, stride_qb, stride_qh, stride_qs, stride_qd,
            stride_kb, stride_kh, stride_ks, stride_kd,
            stride_vb, stride_vh, stride_vs, stride_vd,
            stride_ob, stride_oh, stride_os, stride_od,
            stride_lb, stride_lh, stride_ls, stride_fb, stride_fh,
            stride_xb, stride_xs, stride_xk, stride_pb, page_size,
            n_heads, n_tiles, total, group, scale, head_dim, head_dim_v,
            HAS_MASK: tl.constexpr, HAS_BAND: tl.constexpr, HAS_LSE: tl.constexpr,
            HAS_SINK: tl.constexpr, GUARD: tl.constexpr, PAGED: tl.constexpr, WHOLE_PAGE: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr):
    """The repair: nothing where the overflow word is zero; else the programs take the
    ``total`` (query tile, batch, query head) tiles in turn and recompute by fa-fp32
    (:func:`fp32_tile`) each tile that holds a flagged row, writing the output, LSE and
    flag (repaired, or still non-finite) of its flagged rows and leaving the others. The
    last program to finish zeroes the word and its arrival count (``OVERFLOW_WORD + 1``):
    every program read the word before it arrived."""
    if tl.load(OVERFLOW_WORD) == 0:
        return
    for t in range(tl.program_id(0), total, tl.num_programs(0)):
        bh = t // n_tiles
        b = bh // n_heads
        h = bh % n_heads
        m0 = (t % n_tiles) * BLOCK_M
        q_len = tl.load(q_lens + b)
        q_start = tl.load(q_starts + b)
        rows = m0 + tl.arange(0, BLOCK_M)
        flags = tl.load(FLAGS + b.to(tl.int64) * stride_fb + h.to(tl.int64) * stride_fh
                        + (q_start + rows).to(tl.int64), mask=rows < q_len, other=0)
        redo = flags == ROW_FLAGGED_C
        if tl.max(redo.to(tl.int32), 0) > 0:  # fa-fp32 for the tile; its flagged rows written
            sink = 0.0
            if HAS_SINK:
                sink = tl.load(SINK + h)
            o, lse = fp32_tile(Q, K, V, MASK, PAGES, b, h, h // group, m0, q_start, q_len,
                                tl.load(kv_starts + b), tl.load(kv_lens + b), band_pre,
                                band_next, stride_qb, stride_qh, stride_qs, stride_qd,
                                stride_kb, stride_kh, stride_ks, stride_kd, stride_vb,
                                stride_vh, stride_vs, stride_vd, stride_xb, stride_xs,
                                stride_xk, stride_pb, page_size, scale, head_dim, head_dim_v,
                                HAS_MASK, HAS_BAND, GUARD, PAGED, WHOLE_PAGE, BLOCK_M,
                                BLOCK_N, HEAD_DIM, HEAD_DIM_V, None, sink, HAS_SINK)
            still = nonfinite_row_mask(o, lse)
            pos = (q_start + rows).to(tl.int64)
            dims_v = tl.arange(0, HEAD_DIM_V)
            tl.store(O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
                     + pos[:, None] * stride_os + dims_v[None, :] * stride_od,
                     o.to(O.dtype.element_ty),
                     mask=redo[:, None] & (dims_v[None, :] < head_dim_v))
            if HAS_LSE:
                tl.store(LSE + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh
                         + pos * stride_ls, lse, mask=redo)
            tl.store(FLAGS + b.to(tl.int64) * stride_fb + h.to(tl.int64) * stride_fh + pos,
                     tl.where(still, ROW_NONFINITE_C, ROW_REPAIRED_C).to(tl.uint8), mask=redo)
    if tl.atomic_add(OVERFLOW_WORD + 1, 1) == tl.num_programs(0) - 1:
        tl.store(OVERFLOW_WORD, 0)
        tl.store(OVERFLOW_WORD + 1, 0)


@triton.jit
def fp32_tile(Q, K, V, MASK, PAGES, b, h, hk, m0, q_start, q_len, kv_start, kv_len,
               band_pre, band_next, stride_qb, stride_qh, stride_qs, stride_qd,
               stride_kb, stride_kh, stride_ks, stride_kd,
               stride_vb, stride_vh, stride_vs, stride_vd,
               stride_xb, stride_xs, stride_xk, stride_pb, page_size,
               scale, head_dim, head_dim_v,
               HAS_MASK: tl.constexpr, HAS_BAND: tl.constexpr, GUARD: tl.constexpr,
               PAGED: tl.constexpr, WHOLE_PAGE: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
               STAGES: tl.constexpr, sink, HAS_SINK: tl.constexpr):
    """Query rows m0 .. m0+BLOCK_M-1 of (batch b, head h; kv head hk) by fa-fp32: the raw
    K, fp32 scores and statistics, every kv block through the masked update (this being
    the rare path), ``STAGES`` deep (None: the launch's). PAGED: K and V are the caches
    (num_blocks, N_kv, page_size, D), read through the block table ``PAGES``
    (:func:`kernel_common.kv_row_offsets`). HAS_SINK: the head's learnable sink ``sink`` joins
    each row. Returns the tile's output (fp32) and LSE."""
    dims = tl.arange(0, HEAD_DIM)
    dims_v = tl.arange(0, HEAD_DIM_V)
    cols = tl.arange(0, BLOCK_N)
    rows = m0 + tl.arange(0, BLOCK_M)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
                + (q_start + rows)[:, None].to(tl.int64) * stride_qs
                + dims[None, :] * stride_qd,
                mask=(rows[:, None] < q_len) & (dims[None, :] < head_dim), other=0.0)
    lo, hi, _, _, pre, nxt = tile_kv_blocks(m0, q_len, kv_len, band_pre, band_next, b,
                                             HAS_BAND, BLOCK_M, BLOCK_N)
    k_base = K + hk.to(tl.int64) * stride_kh
    v_base = V + hk.to(tl.int64) * stride_vh
    if not PAGED:
        k_base += b.to(tl.int64) * stride_kb + kv_start.to(tl.int64) * stride_ks
        v_base += b.to(tl.int64) * stride_vb + kv_start.to(tl.int64) * stride_vs
    m, l, acc, f, cnt, c = initial_state(BLOCK_M, HEAD_DIM_V, False, q.dtype)
    for blk in tl.range(lo, hi, num_stages=STAGES):
        n = blk * BLOCK_N + cols
        in_kv = n < kv_len
        k_rows, v_rows = kv_row_offsets(PAGES + b.to(tl.int64) * stride_pb, blk * BLOCK_N, cols,
                                  kv_len, page_size, stride_kb, stride_ks, stride_vb,
                                  stride_vs, PAGED, WHOLE_PAGE)
        k = tl.load(k_base + k_rows[:, None] + dims[None, :] * stride_kd,
                    mask=in_kv[:, None] & (dims[None, :] < head_dim), other=0.0)
        v = tl.load(v_base + v_rows[:, None] + dims_v[None, :] * stride_vd,
                    mask=in_kv[:, None] & (dims_v[None, :] < head_dim_v), other=0.0)
        vis = in_kv[None, :] & (rows[:, None] < q_len)
        if HAS_BAND:
            vis = vis & (n[None, :] >= rows[:, None] - pre) & (n[None, :] <= rows[:, None] + nxt)
        if HAS_MASK:
            masked = tl.load(MASK + b.to(tl.int64) * stride_xb
                             + rows[:, None].to(tl.int64) * stride_xs + n[None, :] * stride_xk,
                             mask=(rows[:, None] < q_len) & in_kv[None, :], other=1)
            vis = vis & (masked == 0)
        row_any = tl.max(vis.to(tl.int32), 1) > 0
        m, l, acc, f, cnt = block_update(fp32_product(q, tl.trans(k)), v, c, vis, row_any,
                                          m, l, acc, f, cnt, scale, 0.0, scale, False, False,
                                          False, False, True, GUARD, BLOCK_N, False)
    return finish_rows(m, l, acc, f, cnt, 0.0, sink, False, HAS_SINK)


def run(problem: AttentionProblem, shared, overflow_word: torch.Tensor,
        binding: Binding) -> None:
    """Launch the repair after the prefill kernels (``overflow_word``: the call's overflow
    word on the device, nonzero once a row is flagged, and the repair's arrival count after
    it, both zero before the prefill kernels; :class:`attention.Shared` holds the rest),
    through ``binding``."""
    q, k, v, out = problem.query, problem.key, problem.value, problem.out
    flags = problem.overflow.row_flags
    block_m = 16 if shared.interpret else 64
    n_tiles = cdiv(problem.max_q_len, block_m)
    total = n_tiles * problem.batch * q.shape[1]
    strides = shared.strides
    lse_strides = ((shared.batch_stride(shared.lse_arg) if problem.lse is not None else 0),
                   *shared.lse_arg.stride()[1:])
    pages = problem.block_table if problem.paged else shared.lengths[0]  # unread unpaged
    args = (q, k, v, out, shared.lse_arg, flags, overflow_word, shared.mask, pages,
            shared.sink, *shared.lengths, shared.band_pre, shared.band_next, *strides(q),
            *shared.kv_strides(k), *shared.kv_strides(v), *strides(out), *lse_strides,
            shared.batch_stride(flags), flags.stride(1), *shared.mask_strides, pages.stride(0),
            problem.block_size, q.shape[1], n_tiles, total, q.shape[1] // k.shape[1],
            problem.scale, q.shape[3], v.shape[3])
    constexprs = dict(
        HAS_MASK=problem.mask is not None, HAS_BAND=problem.band is not None,
        HAS_LSE=problem.lse is not None, HAS_SINK=problem.sink is not None,
        GUARD=problem.rounding_guard, PAGED=problem.paged,
        WHOLE_PAGE=problem.block_size % shared.constexprs["BLOCK_N"] == 0,
        BLOCK_M=block_m, BLOCK_N=shared.constexprs["BLOCK_N"],
        HEAD_DIM=shared.constexprs["HEAD_DIM"], HEAD_DIM_V=shared.constexprs["HEAD_DIM_V"],
        num_warps=1 if shared.interpret else 4, num_stages=repair_stages(q.shape[3]))
    # one wave: every program reads the overflow word at once, and a call without overflow
    # pays for one wave of programs that return, not for several in turn
    programs = (2 if shared.interpret
                else resident_programs(repair_kernel, q.device.index or 0, args, constexprs))
    binding.launch(repair_kernel, (min(total, programs),), *args, **constexprs)


def repair_stages(head_dim: int) -> int:
    """Pipeline depth of the repair's kv loop that fits an H100's shared memory: its K and
    V tiles are 128 x D (``tools/dev/triton_aot.py`` compiles each)."""
    return 1 if head_dim > 128 else 2
