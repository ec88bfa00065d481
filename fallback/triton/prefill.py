"""The Triton prefill kernel, ``prefill_kernel``: one program per (query tile, batch, query
head). The kv blocks a tile can see are walked in ascending order in three loops: masked
edge blocks, then branch-free interior blocks (read through TMA tensor descriptors where
the layout allows), then masked edge blocks; the loops a problem can never enter are
compiled out (:func:`pasa_npu.fallback.triton.launch.block_loops`). Causal and band limits
are computed from the per-batch band; no S1 x S2 mask is ever built for sparse modes 2-4.
pasa-exact's row constants come from the block means (:mod:`shift`), precomputed
per tile or per block in the loop (``Tuning.row_constant``). With CHECK (the PASA
allocations, checked) each program flags its rows whose output or LSE is not finite, and
a flagged row sets the call's overflow word; :mod:`repair` recomputes them.
PART_FILLED (pasa, pasa-mixed: some kv length is not a whole number of blocks): the last
block's row mean takes its keys' count, read once per program; without it every block
divides by BLOCK_N."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pasa_npu.fallback.triton import launch as heuristics
from pasa_npu.fallback.triton import repair
from pasa_npu.fallback.kernel_common import (Binding, tile_kv_blocks, cdiv,
                                             kv_tile_descriptors, placeholder)
from pasa_npu.fallback.triton.shift import shift_keys_in_kernel, prepare_keys
from pasa_npu.fallback.triton.softmax import (block_update, finish_rows, initial_state,
                                              nonfinite_row_mask, block_row_constant)
from pasa_npu.fallback.triton.tuning import Tuning
from pasa_npu.problem import AttentionProblem


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


# Over 80 lines: one kernel body, whose three kv-block loops share its set-up and state;
# helpers would pass that state through every call (see the comment in its body).
@triton.jit
def prefill_kernel(
    Q, K, V, O, LSE, C, MEANS, MASK, SHIFT, FLAGS, OVERFLOW_WORD, K_DESC, V_DESC, K_PAGES,
    V_PAGES, SINK,
    q_starts, q_lens, kv_starts, kv_lens, band_pre, band_next,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_ob, stride_oh, stride_os, stride_od,
    stride_lb, stride_lh, stride_ls,
    stride_cb, stride_ch, stride_cblk,
    stride_mb, stride_mh, stride_mblk,
    stride_xb, stride_xs, stride_xk, stride_fb, stride_fh,
    stride_kpb, stride_vpb, page_size,
    n_heads, n_tiles, group, scale, gamma, head_dim, head_dim_v,
    PSEUDO_AVERAGE_SHIFT: tl.constexpr, EXACT_SHIFT: tl.constexpr, LOW_SCORES: tl.constexpr,
    LOW_STATISTICS: tl.constexpr, LOW_ACCUMULATOR: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BAND: tl.constexpr, HAS_LSE: tl.constexpr,
    GRID_1D: tl.constexpr,
    GUARD: tl.constexpr, K_PADDED: tl.constexpr, FUSED_SHIFT: tl.constexpr,
    USE_TMA: tl.constexpr, C_PER_BLOCK: tl.constexpr, LOOPS: tl.constexpr, PAGED: tl.constexpr,
    CHECK: tl.constexpr, PART_FILLED: tl.constexpr, HAS_SINK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
):
    # one kernel body: the three kv-block loops share its set-up and its state, and
    # splitting it into helpers would pass that state through every call
    # heaviest tiles first: under causal and band masks the last query tiles see the most keys
    if GRID_1D:  # more (batch, head) pairs than CUDA's 65535 on a grid's second axis
        pid_m = n_tiles - 1 - tl.program_id(0) % n_tiles
        bh = tl.program_id(0) // n_tiles
    else:  # the same order from a 2-D grid, which is faster for pasa-exact than the 1-D
        # form (and than n_tiles in place of num_programs here)
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
    lo, hi, full_lo, full_hi, pre, nxt = tile_kv_blocks(m0, q_len, kv_len, band_pre, band_next,
                                                         b, HAS_BAND, BLOCK_M, BLOCK_N)
    if HAS_MASK:  # an explicit mask: every block goes through the masked loop
        full_lo = hi
        full_hi = hi

    if PAGED:  # K (or K') and V through their block tables, a row per batch; BLOCK_N
        # divides page_size, so a kv block lies in one physical block
        k_base = K + hk.to(tl.int64) * stride_kh
        v_base = V + hk.to(tl.int64) * stride_vh
        k_pages = K_PAGES + b.to(tl.int64) * stride_kpb
        v_pages = V_PAGES + b.to(tl.int64) * stride_vpb
    else:
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

    if PSEUDO_AVERAGE_SHIFT and PART_FILLED:  # the last kv block's keys' mean, if part-filled
        tail_blk = (kv_len - 1) // BLOCK_N
        tail_factor = tl.load(SHIFT + (kv_len - tail_blk * BLOCK_N) * 4 + 2)

    m, l, acc, f, cnt, c = initial_state(BLOCK_M, HEAD_DIM_V, LOW_ACCUMULATOR, q.dtype)

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
                if PAGED:
                    k_page = tl.load(k_pages + n0 // page_size)
                    v_page = tl.load(v_pages + n0 // page_size)
                    row0 = n0 % page_size
                    k_ptrs = (k_base + k_page.to(tl.int64) * stride_kb + row0 * stride_ks
                              + k_offs)
                    v_ptrs = (v_base + v_page.to(tl.int64) * stride_vb + row0 * stride_vs
                              + v_offs)
                else:
                    k_ptrs = k_base + tl.cast(n0, tl.int64) * stride_ks + k_offs
                    v_ptrs = v_base + tl.cast(n0, tl.int64) * stride_vs + v_offs
                if EXACT_SHIFT and not FUSED_SHIFT:
                    if C_PER_BLOCK:
                        mean = tl.load(mean_base + tl.cast(blk, tl.int64) * stride_mblk + dims)
                        c = block_row_constant(q, mean.to(tl.float32), scale)
                    else:
                        c = tl.load(c_base + tl.cast(blk, tl.int64) * stride_cblk + rows,
                                    mask=rows < q_len, other=0.0)
                if stage == 1:
                    if USE_TMA and PAGED:
                        k = K_DESC.load([k_page, hk, row0, 0]).reshape(BLOCK_N, HEAD_DIM)
                        v = V_DESC.load([v_page, hk, row0, 0]).reshape(BLOCK_N, HEAD_DIM_V)
                    elif USE_TMA:  # interior blocks lie inside the tensors: no masks needed
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
                    k, mean = shift_keys_in_kernel(k, SHIFT, scale, kv_len - n0, EXACT_SHIFT,
                                                   True, BLOCK_N, tl.arange(0, BLOCK_N))
                    if EXACT_SHIFT:
                        c = block_row_constant(q, mean, scale)
                if PSEUDO_AVERAGE_SHIFT and PART_FILLED and stage != 1:
                    mean_factor = tl.where(blk == tail_blk, tail_factor, 1.0 / BLOCK_N)
                else:
                    mean_factor = 1.0 / BLOCK_N
                m, l, acc, f, cnt = block_update(tl.dot(q, tl.trans(k)), v, c, vis, row_any, m, l, acc, f, cnt,
                                                  scale, gamma, mean_factor, PSEUDO_AVERAGE_SHIFT,
                                                  EXACT_SHIFT, LOW_SCORES, LOW_STATISTICS,
                                                  stage != 1, GUARD, BLOCK_N, CHECK)

    sink = 0.0
    if HAS_SINK:
        sink = tl.load(SINK + h)
    o, lse = finish_rows(m, l, acc.to(tl.float32), f, cnt, gamma, sink, PSEUDO_AVERAGE_SHIFT,
                     HAS_SINK)
    row_ok = rows < q_len
    tl.store(O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
             + (q_start + rows)[:, None].to(tl.int64) * stride_os + dims_v[None, :] * stride_od,
             o.to(O.dtype.element_ty), mask=row_ok[:, None] & (dims_v[None, :] < head_dim_v))
    if HAS_LSE:
        tl.store(LSE + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh
                 + (q_start + rows).to(tl.int64) * stride_ls, lse, mask=row_ok)
    if CHECK:  # no reduction across the program: each flagged row marks the call itself
        bad = nonfinite_row_mask(o, lse) & row_ok
        tl.store(FLAGS + b.to(tl.int64) * stride_fb + h.to(tl.int64) * stride_fh
                 + (q_start + rows).to(tl.int64), bad.to(tl.uint8), mask=row_ok)
        tl.store(OVERFLOW_WORD + rows * 0, 1, mask=bad)


def run(problem: AttentionProblem, tuning: Tuning, shared, binding: Binding) -> None:
    """Launch ``prefill_kernel`` for ``problem`` (:class:`attention.Shared` holds
    the arguments the launches share), with the key shift as ``tuning`` says, through
    ``binding``."""
    q, k, v, out, lse = problem.query, problem.key, problem.value, problem.out, problem.lse
    alloc, dev = problem.allocation, q.device
    block_n, head_dim_p = shared.constexprs["BLOCK_N"], shared.constexprs["HEAD_DIM"]
    fused = tuning.shift == "fused" and alloc.shifts_keys
    c_per_block = heuristics.row_constant_in_kernel(problem, block_n, tuning)
    loops = tuning.loops or heuristics.block_loops(problem, block_n)
    block_m, warps, stages = tuning.launch or heuristics.launch_config(
        head_dim_p, alloc.name, shared.interpret, fused or c_per_block, loops,
        problem.mask is not None)
    if problem.paged and not tuning.launch:
        stages = heuristics.paged_stages(stages)
    constants = placeholder(dev, torch.float32)
    means = placeholder(dev, torch.float16)
    k_pages = v_pages = problem.block_table if problem.paged else shared.lengths[0]
    detect = problem.overflow is not None
    flags = problem.overflow.row_flags if detect else placeholder(dev, torch.uint8)
    overflow_word = None
    if detect:  # the overflow word (nonzero once a row is flagged) and the repair's arrivals
        overflow_word = binding.zeroed((2,), torch.int32, dev)
    if alloc.shifts_keys and not fused:
        k_used, exact_means, shifted_pages = prepare_keys(problem, k, shared.lengths[2],
                                                          shared.lengths[3], block_n,
                                                          head_dim_p, binding)
        k_pages = shifted_pages if problem.paged else k_pages
        k_strides = tuple(k_used.stride())
        means = means if exact_means is None else exact_means
        if alloc.exact_shift and not c_per_block:  # the kernel fills it
            constants = binding.empty("constants", (problem.batch, q.shape[1], means.shape[2],
                                                    max(1, problem.max_q_len)),
                                      torch.float32, dev)
    else:
        k_used = k
        k_strides = shared.kv_strides(k)
    descriptors = (kv_tile_descriptors(binding, k_used, k_strides[0], v,
                                       shared.kv_strides(v)[0], block_n, head_dim_p,
                                       shared.constexprs["HEAD_DIM_V"])
                   if tuning.loads == "tma" else None)
    use_tma = descriptors is not None
    n_tiles = cdiv(problem.max_q_len, block_m)
    pairs = problem.batch * q.shape[1]
    grid_1d = pairs > heuristics.GRID_AXIS_MAX
    grid = (n_tiles * pairs,) if grid_1d else (n_tiles, pairs)
    strides = shared.strides
    binding.launch(
        prefill_kernel, grid,
        q, k_used, v, out, shared.lse_arg, constants, means, shared.mask,
        shared.shift if shared.shift is not None else constants, flags,
        overflow_word if detect else shared.lengths[1], *(descriptors or (k_used, v)),
        k_pages, v_pages, shared.sink,
        *shared.lengths, shared.band_pre, shared.band_next,
        *strides(q), *k_strides, *shared.kv_strides(v), *strides(out),
        (shared.batch_stride(shared.lse_arg) if lse is not None else 0),
        *shared.lse_arg.stride()[1:],
        *constants.stride()[:3], *means.stride()[:3], *shared.mask_strides,
        shared.batch_stride(flags) if detect else 0, flags.stride(1),
        k_pages.stride(0), v_pages.stride(0), problem.block_size, q.shape[1], n_tiles, q.shape[1] // k.shape[1], problem.scale, shared.gamma,
        q.shape[3], v.shape[3], HAS_BAND=problem.band is not None, HAS_LSE=lse is not None,
        K_PADDED=alloc.shifts_keys and not fused, FUSED_SHIFT=fused, USE_TMA=use_tma,
        C_PER_BLOCK=c_per_block, LOOPS=loops, GRID_1D=grid_1d, PAGED=problem.paged,
        CHECK=detect, PART_FILLED=heuristics.part_filled(problem, block_n),
        HAS_SINK=problem.sink is not None,
        BLOCK_M=block_m, num_warps=warps, num_stages=stages, **shared.constexprs,
        **heuristics.fp_options(alloc))
    if detect:
        repair.run(problem, shared, overflow_word, binding)
