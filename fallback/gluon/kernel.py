"""The warp-specialised Gluon prefill kernel, ``prefill_ws_kernel`` (:mod:`prefill` says
what it computes and launches it): a loader warp and two or three consumer warp groups, the
state they share grouped in the aggregates of :mod:`parts`. Needs Gluon.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                               tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from pasa_npu.fallback.gluon import config
from pasa_npu.fallback.gluon.parts import (MEAN_ROWS_C, ROWS, THIN_LAYOUT, Blocks, KeyShift,
                                           Operands, Output, Pages, Queries, Ring, Schedule,
                                           Sizes, Variant, await_shifted_keys, thin_column,
                                           paged_kv_rows, shift_keys_part,
                                           key_visible, release_blocks, row_sees_block,
                                           row_sum_read, row_sum_start, scores_pasa,
                                           softmax_exact, softmax_fa, statistics_pasa,
                                           query_tile, publish_tile, read_tile)
from pasa_npu.fallback.kernel_common import to_fp16_paired, round_low, tile_kv_blocks
from pasa_npu.fallback.triton.softmax import lost_resolution, pseudo_average_lost_resolution

_CONSUMER_REGS_2 = gl.constexpr(config.CONSUMER_REGS[2])
_CONSUMER_REGS_3 = gl.constexpr(config.CONSUMER_REGS[3])
_LOADER_REGS = gl.constexpr(config.LOADER_REGS)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, m_desc, queries, ring, schedule, sizes, pages, key_shift,
            next_tile, n_blocks, EXACT_SHIFT: gl.constexpr, HAS_BAND: gl.constexpr,
            PAGED: gl.constexpr, SHIFT_KEYS: gl.constexpr, BLOCK_M: gl.constexpr,
            BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Loader warp: takes this program's tiles (its own index first, then the next
    untaken one from the ``next_tile`` counter, so that a program that finishes early
    takes more) and publishes each to the consumers; for each, the groups' parts of Q
    once they are done with the previous tile's, then K and V block by block
    into the ring, which runs on across tiles. Publishes an index past the last tile
    at the end. PAGED: K and V blocks come from the physical blocks the tables of
    ``pages`` name (the descriptors cover the whole caches). SHIFT_KEYS: K' is written in
    this launch, by every program's consumer groups: the loader waits for all of them
    (:func:`parts.await_shifted_keys`) before its first load."""
    q_smem, q_bar, q_empty = queries.smem, queries.ready, queries.free
    k_smem, v_smem, mean_smem = ring.k, ring.v, ring.means
    kv_ready, kv_empty = ring.ready, ring.empty
    tile_ids, tile_ready, n_tiles, n_pairs = (schedule.ids, schedule.ready, schedule.n_tiles,
                                              schedule.n_pairs)
    tile_group, n_heads, group = schedule.tile_group, schedule.n_heads, schedule.group
    q_len, kv_len, band_pre, band_next = (sizes.q_len, sizes.kv_len, sizes.band_pre,
                                          sizes.band_next)
    total = n_tiles * n_pairs
    GROUPS: gl.constexpr = BLOCK_M // ROWS  # consumer groups, each with its part of Q
    stage_bytes: gl.constexpr = (k_desc.block_type.nbytes + v_desc.block_type.nbytes
                                 + (m_desc.block_type.nbytes if EXACT_SHIFT else 0))
    if SHIFT_KEYS:
        await_shifted_keys(key_shift, gl.num_programs(0) * GROUPS)
    it = 0  # kv blocks loaded by this program so far, over all its tiles
    n = 0  # tiles so far
    t = gl.program_id(0)
    while t < total:
        b, h, hk, m0 = query_tile(t, n_tiles, n_pairs, tile_group, n_heads, group, q_len, BLOCK_M)
        lo, hi, full_lo, full_hi, pre, nxt = tile_kv_blocks(
            m0, q_len, kv_len, band_pre, band_next, b, HAS_BAND, BLOCK_M, BLOCK_N)
        for w in gl.static_range(GROUPS):
            mbarrier.wait(q_empty.index(w), (n & 1) ^ 1, pred=n > 0)
            mbarrier.expect(q_bar.index(w), q_desc.block_type.nbytes)
            # a group of rows before row 0 loads row 0's and never reads them
            tma.async_copy_global_to_shared(q_desc, [b, h, gl.maximum(m0 + w * ROWS, 0), 0],
                                            q_bar.index(w), q_smem.index(w))
        # every group is past tile n-1's Q, so each has read ids n-1 and n-2
        publish_tile(tile_ids, tile_ready, t, n)
        mean_row0 = (b * (n_heads // group) + hk) * n_blocks
        for blk in range(lo, hi):
            stage = it % STAGES
            k_block, v_block, row = b, b, blk * BLOCK_N
            if PAGED:  # read before the wait below, which hides the table's latency
                k_block, v_block, row = paged_kv_rows(pages, b, blk * BLOCK_N)
            # the first pass over the ring finds every stage free
            mbarrier.wait(kv_empty.index(stage), ((it // STAGES) & 1) ^ 1,
                          pred=it >= STAGES)
            ready = kv_ready.index(stage)
            mbarrier.expect(ready, stage_bytes)
            if EXACT_SHIFT:  # with every block, read or not: one expect per stage
                tma.async_copy_global_to_shared(
                    m_desc, [mean_row0 + blk - blk % MEAN_ROWS_C, 0], ready,
                    mean_smem.index(stage))
            tma.async_copy_global_to_shared(k_desc, [k_block, hk, row, 0], ready,
                                            k_smem.index(stage))
            tma.async_copy_global_to_shared(v_desc, [v_block, hk, row, 0], ready,
                                            v_smem.index(stage))
            it += 1
        n += 1
        t = gl.num_programs(0) + gl.atomic_add(next_tile, 1)
    # every program fetches until it draws an index past the tiles, so the fetches number
    # ``total`` (one per tile not taken first, one past the end per program): the one
    # that drew the last leaves the counter zeroed for the next launch
    if t == gl.num_programs(0) + total - 1:
        gl.atomic_xchg(next_tile, 0)
        if SHIFT_KEYS:  # every loader is past its wait: it drew a tile after it
            gl.atomic_xchg(key_shift.arrivals, 0)
    for w in gl.static_range(GROUPS):
        mbarrier.wait(q_empty.index(w), (n & 1) ^ 1, pred=n > 0)
    publish_tile(tile_ids, tile_ready, t, n)


@gluon.jit
def _consumer(queries, ring, schedule, sizes, output, ones, key_shift, W: gl.constexpr, variant):
    """Consumer warp group W: for each tile the loader publishes, rows m0 + W*64 .. +63 of
    it, every kv block its rows see in turn (it releases the tile's other blocks
    unread). The allocation: pasa (PSEUDO_AVERAGE_SHIFT), pasa-exact (EXACT_SHIFT) or
    fa-fp32 (neither). SHIFT_KEYS: first, the group's share of the launch's key shift
    (:func:`parts.shift_keys_part`)."""
    PSEUDO_AVERAGE_SHIFT: gl.constexpr = variant.PSEUDO_AVERAGE_SHIFT
    EXACT_SHIFT: gl.constexpr = variant.EXACT_SHIFT
    HAS_BAND: gl.constexpr = variant.HAS_BAND
    HAS_LSE: gl.constexpr = variant.HAS_LSE
    CHECK: gl.constexpr = variant.CHECK
    PART_FILLED: gl.constexpr = variant.PART_FILLED
    BLOCK_M: gl.constexpr = variant.BLOCK_M
    BLOCK_N: gl.constexpr = variant.BLOCK_N
    HEAD_DIM: gl.constexpr = variant.HEAD_DIM
    STAGES: gl.constexpr = variant.STAGES
    GROUPS: gl.constexpr = BLOCK_M // ROWS
    if variant.SHIFT_KEYS:
        shift_keys_part(key_shift, sizes, gl.program_id(0) * GROUPS + W,
                        gl.num_programs(0) * GROUPS, EXACT_SHIFT, BLOCK_N, HEAD_DIM)
    q_smem = queries.smem
    tile_ids, tile_ready, n_tiles, n_pairs = (schedule.ids, schedule.ready, schedule.n_tiles,
                                              schedule.n_pairs)
    tile_group, n_heads, group = schedule.tile_group, schedule.n_heads, schedule.group
    q_len, kv_len, band_pre, band_next = (sizes.q_len, sizes.kv_len, sizes.band_pre,
                                          sizes.band_next)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])

    q = q_smem.index(W).reshape([ROWS, HEAD_DIM])
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    c_zero = gl.zeros([ROWS, MEAN_ROWS_C], gl.float32, THIN_LAYOUT)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    o_zero = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    it = 0  # kv blocks consumed by this program so far, over all its tiles
    n = 0  # tiles so far
    t = read_tile(tile_ids, tile_ready, n)
    while t < n_tiles * n_pairs:
        b, h, hk, m0 = query_tile(t, n_tiles, n_pairs, tile_group, n_heads, group, q_len, BLOCK_M)
        lo, hi, _, _, _, _ = tile_kv_blocks(m0, q_len, kv_len, band_pre, band_next, b,
                                             HAS_BAND, BLOCK_M, BLOCK_N)
        # the blocks this group's rows see, a part of the tile's (with three groups,
        # a causal tile's first rows see fewer)
        g_lo, g_hi, full_lo, full_hi, pre, nxt = tile_kv_blocks(
            m0 + W * ROWS, q_len, kv_len, band_pre, band_next, b, HAS_BAND, ROWS, BLOCK_N)
        if (m0 + W * ROWS < 0) | (m0 + W * ROWS >= q_len):  # a group without rows
            g_hi = g_lo
            full_lo = g_lo
            full_hi = g_lo
        ops = Operands(ones, cols, c_zero, s_zero, o_zero)
        blocks = Blocks(lo, hi, g_lo, g_hi, full_lo, full_hi, pre, nxt)
        it = _consumer_tile(q, queries.ready.index(W), queries.free.index(W), ring, output,
                            sizes, ops, blocks, b, h, m0, it, n, n_heads, W,
                            PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, HAS_LSE, CHECK,
                            PART_FILLED, BLOCK_N, HEAD_DIM, STAGES)
        n += 1
        t = read_tile(tile_ids, tile_ready, n)


# Over 80 lines: one body for the three allocations, which share the stage's wait, QKᵀ and
# the releases; split, each would take the state and the ring through another call.
@gluon.jit
def _kv_step(q, ring, q_free, ops, blocks, sizes, blk, it, acc, m_i, l_i, f_i, cnt_i, c8, rows,
             PSEUDO_AVERAGE_SHIFT: gl.constexpr, EXACT_SHIFT: gl.constexpr,
             HAS_BAND: gl.constexpr, PART_FILLED: gl.constexpr, MASK: gl.constexpr,
             CHECK: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
             STAGES: gl.constexpr):
    """Consumer group: kv block ``blk`` (the program's ``it``-th), QKᵀ, the softmax, P'V
    and the fold into the state (acc, m, l, f, count; pasa-exact's row constants c8 of
    :data:`MEAN_ROWS` blocks). MASK: 0 for a block every row sees whole; 1 for a
    leading masked block (a band's lower edge), 2 for a trailing one (the diagonal, the
    last block past kv_len), whose keys are tested one by one (:func:`key_visible`).
    PART_FILLED (pasa): the last kv block holds fewer than BLOCK_N keys, and a masked
    block's row mean takes its own key count. CHECK: a row whose block maximum of S' (or,
    pasa, its block offset gamma * mean S') lost resolution (triton.softmax's
    lost_resolution, pseudo_average_lost_resolution) gets NaN statistics (pasa: from its
    block mean, whose select keeps the fp16 roundings paired; pasa-exact: l), which the
    tile's row test flags. Returns the new count and state."""
    # one body for the three allocations: they share the wait for the stage, QKᵀ, the
    # release of Q and of the stage, and the masked rows' state; split, each would take
    # the seven values of the state and the ring through another call
    k_smem, v_smem, mean_smem, kv_ready, kv_empty = (ring.k, ring.v, ring.means, ring.ready,
                                                     ring.empty)
    ones, cols, c_zero, s_zero, o_zero = ops.ones, ops.cols, ops.c_zero, ops.s_zero, ops.o_zero
    g_lo, g_hi, pre, nxt = blocks.g_lo, blocks.g_hi, blocks.pre, blocks.nxt
    q_len, kv_len, scale, gamma = sizes.q_len, sizes.kv_len, sizes.scale, sizes.gamma
    s_layout: gl.constexpr = s_zero.type.layout
    o_layout: gl.constexpr = o_zero.type.layout
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    MASKED: gl.constexpr = MASK != 0
    stage = it % STAGES
    mbarrier.wait(kv_ready.index(stage), (it // STAGES) & 1)
    k = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM])
    v = v_smem.index(stage).reshape([BLOCK_N, HEAD_DIM])
    qk = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    if EXACT_SHIFT:  # c = scale * Q . mean16 of MEAN_ROWS blocks in one thin matmul
        if (blk == g_lo) | (blk % MEAN_ROWS_C == 0):
            c8 = warpgroup_mma(q, mean_smem.index(stage).permute((1, 0)), c_zero,
                               use_acc=False, is_async=True)
            c8 = warpgroup_mma_wait(0, deps=(c8,)) * scale
        c = gl.convert_layout(thin_column(c8, blk % MEAN_ROWS_C), row_s)
    qk = warpgroup_mma_wait(0, deps=(qk,))
    if blk == g_hi - 1:  # the group's last use of Q: the loader may fetch the next
        mbarrier.arrive(q_free)

    if PSEUDO_AVERAGE_SHIFT:  # P'V rounded to fp16; the statistics and the fold in fp16 steps
        if MASKED:
            vis = key_visible(rows, cols, blk, q_len, kv_len, pre, nxt, HAS_BAND, MASK,
                               BLOCK_N)
            score_sums, m_loc, p16 = scores_pasa(qk, vis, ones, True)
        else:
            score_sums, m_loc, p16 = scores_pasa(qk, None, ones, False)
        # the block sum and P'V start now; the statistics run while they do
        p_sums = row_sum_start(p16, ones)
        pv = warpgroup_mma(gl.convert_layout(p16, p_layout), v, o_zero, use_acc=False,
                           is_async=True)
        if MASKED and PART_FILLED:  # the part-filled last block: its keys' mean
            factor = gl.where(blk == sizes.tail_block, sizes.tail_factor, 1.0 / BLOCK_N)
            s_mean = round_low(row_sum_read(score_sums, m_i) * factor, gl.float16)
        else:
            s_mean = round_low(row_sum_read(score_sums, m_i) / BLOCK_N, gl.float16)
        if CHECK:  # the statistics, l and O of a row that lost resolution become NaN
            lost = pseudo_average_lost_resolution(m_loc, gamma, s_mean)
            s_mean = gl.where(lost, float("nan"), s_mean)
        m_new, f_new, cnt_new, alpha, beta_w = statistics_pasa(m_i, f_i, cnt_i, m_loc,
                                                                s_mean, gamma)
        p_sums = warpgroup_mma_wait(1, deps=(p_sums,))
        l_loc = round_low(row_sum_read(p_sums, m_i), gl.float16)
        l_new = round_low(round_low(alpha * l_i, gl.float16) + round_low(beta_w * l_loc, gl.float16),
                    gl.float16)
        pv = warpgroup_mma_wait(0, deps=(pv,))
        mbarrier.arrive(kv_empty.index(stage))
        alpha16 = gl.convert_layout(alpha.to(gl.float16), row_o)
        beta16 = gl.convert_layout(beta_w.to(gl.float16), row_o)
        acc_new = acc * alpha16[:, None] + to_fp16_paired(pv) * beta16[:, None]
        if MASKED:  # rows that see no key of the block keep their state
            row_any = row_sees_block(rows, blk, q_len, kv_len, pre, nxt, HAS_BAND, MASK,
                                      BLOCK_N)
            acc_new = gl.where(gl.convert_layout(row_any, row_o)[:, None], acc_new, acc)
            m_new = gl.where(row_any, m_new, m_i)
            l_new = gl.where(row_any, l_new, l_i)
            f_new = gl.where(row_any, f_new, f_i)
            cnt_new = gl.where(row_any, cnt_new, cnt_i)
        acc, m_i, l_i, f_i, cnt_i = acc_new, m_new, l_new, f_new, cnt_new
    else:
        if EXACT_SHIFT:
            if MASKED:
                vis = key_visible(rows, cols, blk, q_len, kv_len, pre, nxt, HAS_BAND,
                                   MASK, BLOCK_N)
                m_new, alpha, p16, m_blk = softmax_exact(qk, vis, m_i, c, True)
            else:
                m_new, alpha, p16, m_blk = softmax_exact(qk, None, m_i, c, False)
            # P'V in its own fp32 tile, rounded to fp16, then added; alongside, the
            # block's P' summed on the tensor cores (for l)
            p_sums = row_sum_start(p16, ones)
            pv = warpgroup_mma(gl.convert_layout(p16, p_layout), v, o_zero,
                               use_acc=False, is_async=True)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            p_sums = warpgroup_mma_wait(1, deps=(p_sums,))
            l_new = alpha * l_i + row_sum_read(p_sums, m_i)
            if CHECK:
                lost = lost_resolution(m_blk)
                if MASKED:  # a row without a key of the block (maximum -inf) keeps its l
                    lost = lost & (m_blk > float("-inf"))
                l_new = gl.where(lost, float("nan"), l_new)
            pv = warpgroup_mma_wait(0, deps=(pv,))
            mbarrier.arrive(kv_empty.index(stage))
            acc = acc + to_fp16_paired(pv).to(gl.float32)
        else:  # fa-fp32: accumulated in place
            if MASKED:
                vis = key_visible(rows, cols, blk, q_len, kv_len, pre, nxt, HAS_BAND,
                                   MASK, BLOCK_N)
                m_new, l_new, alpha, p16 = softmax_fa(qk, vis, m_i, l_i, scale, True)
            else:
                m_new, l_new, alpha, p16 = softmax_fa(qk, None, m_i, l_i, scale, False)
            p16 = gl.convert_layout(p16, p_layout)
            alpha = gl.convert_layout(alpha, row_o)
            acc = acc * alpha[:, None]
            acc = warpgroup_mma(p16, v, acc, use_acc=True, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(kv_empty.index(stage))
        m_i, l_i = m_new, l_new
    return it + 1, acc, m_i, l_i, f_i, cnt_i, c8


# Over 80 lines: a tile's state set-up, its three kv loops (kept apart to save registers)
# and the epilogue (O, LSE, the overflow flags) share the tile's row state.
@gluon.jit
def _consumer_tile(q, q_ready, q_free, ring, output, sizes, ops, blocks, b, h, m0, it, n,
                   n_heads, W: gl.constexpr, PSEUDO_AVERAGE_SHIFT: gl.constexpr,
                   EXACT_SHIFT: gl.constexpr, HAS_BAND: gl.constexpr, HAS_LSE: gl.constexpr,
                   CHECK: gl.constexpr, PART_FILLED: gl.constexpr, BLOCK_N: gl.constexpr,
                   HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
    """One tile's 64 rows of consumer group W (the ``n``-th tile of this program; ``it``
    kv blocks before it): the kv loop over the group's blocks [g_lo, g_hi), releasing
    the rest of the tile's [lo, hi) unread, then O and LSE, and with CHECK the rows'
    overflow flags (a row whose output or LSE is not finite, a lost resolution included),
    a flagged row also setting
    the call's overflow word (no reduction across the group).
    Q is released (``q_free``) once its last QKᵀ is done. Returns the new count of kv
    blocks."""
    kv_ready, kv_empty = ring.ready, ring.empty
    lo, hi, g_lo, g_hi = blocks.lo, blocks.hi, blocks.g_lo, blocks.g_hi
    full_lo, full_hi = blocks.full_lo, blocks.full_hi
    q_len, gamma = sizes.q_len, sizes.gamma
    O, LSE = output.o, output.lse
    c_zero, s_zero, o_zero = ops.c_zero, ops.s_zero, ops.o_zero
    s_layout: gl.constexpr = s_zero.type.layout
    o_layout: gl.constexpr = o_zero.type.layout
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    rows = m0 + W * ROWS + gl.arange(0, ROWS, layout=row_s)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([ROWS], gl.float32, row_s)
    f_i = gl.zeros([ROWS], gl.float32, row_s)  # pasa's pseudo-average and its count
    cnt_i = gl.zeros([ROWS], gl.float32, row_s)
    c8 = c_zero  # pasa-exact's row constants, set at the group's first block
    if PSEUDO_AVERAGE_SHIFT:  # the all-fp16 allocation accumulates in fp16
        acc = gl.zeros([ROWS, HEAD_DIM], gl.float16, o_layout)
    else:
        acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    mbarrier.wait(q_ready, n & 1)

    it = release_blocks(kv_ready, kv_empty, lo, g_lo, it, STAGES)
    # three loops, so that what the masked blocks need is not held across the interior
    # ones (one loop with both kinds of block spills at three groups under a causal
    # mask): leading masked blocks (a band's lower edge), interior, trailing masked
    # blocks (the diagonal; a last block past kv_len)
    if HAS_BAND:
        for blk in range(g_lo, full_lo):
            it, acc, m_i, l_i, f_i, cnt_i, c8 = _kv_step(
                q, ring, q_free, ops, blocks, sizes, blk, it, acc, m_i, l_i, f_i, cnt_i, c8,
                rows, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, PART_FILLED, 1, CHECK,
                BLOCK_N, HEAD_DIM, STAGES)
    for blk in range(full_lo, full_hi):
        it, acc, m_i, l_i, f_i, cnt_i, c8 = _kv_step(
            q, ring, q_free, ops, blocks, sizes, blk, it, acc, m_i, l_i, f_i, cnt_i, c8,
            rows, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, PART_FILLED, 0, CHECK,
            BLOCK_N, HEAD_DIM, STAGES)
    for blk in range(full_hi, g_hi):
        it, acc, m_i, l_i, f_i, cnt_i, c8 = _kv_step(
            q, ring, q_free, ops, blocks, sizes, blk, it, acc, m_i, l_i, f_i, cnt_i, c8,
            rows, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, PART_FILLED, 2, CHECK,
            BLOCK_N, HEAD_DIM, STAGES)
    if g_hi <= g_lo:  # a group that sees no kv block never used Q
        mbarrier.arrive(q_free)
    it = release_blocks(kv_ready, kv_empty, gl.maximum(g_hi, g_lo), hi, it, STAGES)

    # rows that saw no key: output 0, LSE -inf (as the Triton kernel's finish_rows). A row that
    # saw one has l >= 1 (its maximum's exp(0)), or NaN from a NaN input, which must stay
    # NaN: the GPU's maximum drops NaN, so m alone would call such a row unseen
    seen = l_i != 0.0
    l_safe = gl.where(seen, l_i, 1.0)
    true_max = m_i
    if PSEUDO_AVERAGE_SHIFT:
        true_max = m_i + gamma * f_i
    lse = gl.where(seen, true_max + gl.log(l_safe), float("-inf"))
    l_o = gl.convert_layout(l_safe, row_o)
    seen_o = gl.convert_layout(seen, row_o)
    o = gl.where(seen_o[:, None], acc.to(gl.float32) / l_o[:, None], 0.0)
    rows_o = m0 + W * ROWS + gl.arange(0, ROWS, layout=row_o)
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    o_ptrs = (O + b.to(gl.int64) * output.stride_ob + h.to(gl.int64) * output.stride_oh
              + rows_o.to(gl.int64)[:, None] * output.stride_os + dims[None, :])
    # rows 0 .. q_len-1 (one unsigned compare: the first tile may start before row 0)
    o16 = o.to(gl.float16)
    gl.store(o_ptrs, o16, mask=(rows_o.to(gl.uint32, bitcast=True) < q_len)[:, None])
    if HAS_LSE:
        gl.store(LSE + b.to(gl.int64) * output.stride_lb + h.to(gl.int64) * output.stride_lh
                 + rows.to(gl.int64) * output.stride_ls, lse,
                 mask=rows.to(gl.uint32, bitcast=True) < q_len)
    if CHECK:
        # a row's output values through their sum (triton.softmax.nonfinite_row_mask), and
        # its statistics, finite where its LSE is, whose log a call without LSE skips. The
        # sum: at d = 64 of the fp16 output on the tensor cores (a thin matmul by ones),
        # at d = 128 of the fp32 output on the CUDA cores, each the one that costs its
        # kernel less (docs/design.md, "Overflow detection and repair")
        if HEAD_DIM < BLOCK_N:
            sums = row_sum_start(o16, ops.ones.slice(0, HEAD_DIM, 1))
            o_sum = row_sum_read(warpgroup_mma_wait(0, deps=(sums,)), l_i)
        else:
            o_sum = gl.convert_layout(gl.sum(o, 1), row_s)
        in_rows = rows.to(gl.uint32, bitcast=True) < q_len
        bad = ~(gl.abs(o_sum + gl.where(seen, true_max + l_i, 0.0)) < float("inf")) & in_rows
        # the flags are contiguous (B, N, q_len), fewer than 2**31 (prefill.supported);
        # a 64-bit offset, hoisted above the kv loops, would spill registers at d = 128
        gl.store(output.flags + ((b * n_heads + h) * q_len + rows), bad.to(gl.uint8),
                 mask=in_rows)
        gl.store(output.overflow_word + rows * 0, bad.to(gl.int32), mask=bad)
    return it


@gluon.jit
def prefill_ws_kernel(q_desc, k_desc, v_desc, m_desc, O, LSE, FLAGS, OVERFLOW_WORD, next_tile,
                band_pre, band_next, K_PAGES, V_PAGES, K, KS, MEAN, SHIFT,
                stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_ls,
                stride_kpb, stride_vpb, page_size, stride_kb, stride_kh, stride_ks,
                n_heads, group, q_len, kv_len, n_blocks, scale, gamma,
                tail_block, tail_factor, n_tiles, n_pairs,
                tile_group, PSEUDO_AVERAGE_SHIFT: gl.constexpr, EXACT_SHIFT: gl.constexpr,
                HAS_BAND: gl.constexpr, HAS_LSE: gl.constexpr, PAGED: gl.constexpr,
                CHECK: gl.constexpr, PART_FILLED: gl.constexpr, SHIFT_KEYS: gl.constexpr,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                STAGES: gl.constexpr):
    """Persistent, one program per SM: each takes tiles of :func:`query_tile`'s order until
    none is left (``next_tile``: a zeroed counter, which it leaves zeroed; :func:`_loader`),
    so that its loader
    fetches a tile's Q, K and V while its consumers finish the one before. (A fixed
    stride over the tiles, heaviest first within groups of pairs, left the programs'
    work unbalanced under a causal mask.) SHIFT_KEYS: the consumer groups of all programs
    first shift the raw keys ``K`` into the workspaces ``KS`` (K', as ``k_desc`` reads it)
    and ``MEAN`` (pasa-exact), with ``SHIFT`` pasa's table (:class:`parts.KeyShift`); the
    launch is cooperative, so that every program is resident while loaders wait for them."""
    GROUPS: gl.constexpr = BLOCK_M // ROWS
    q_smem = gl.allocate_shared_memory(gl.float16, [GROUPS, 1, 1, ROWS, HEAD_DIM],
                                       q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 1, BLOCK_N, HEAD_DIM],
                                       k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 1, BLOCK_N, HEAD_DIM],
                                       v_desc.layout)
    # pasa-exact: the block means the loader fetches with each stage's K and V
    mean_smem = gl.allocate_shared_memory(gl.float16, [STAGES, MEAN_ROWS_C, HEAD_DIM],
                                          m_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [GROUPS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [GROUPS, 1], mbarrier.MBarrierLayout())
    tile_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    tile_ids = gl.allocate_shared_memory(gl.int32, [2, 1],
                                         gl.SwizzledSharedLayout(1, 1, 1, [0]))
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for w in gl.static_range(GROUPS):
        mbarrier.init(q_bar.index(w), count=1)
        mbarrier.init(q_empty.index(w), count=1)
    for w in gl.static_range(2):
        mbarrier.init(tile_ready.index(w), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=GROUPS)  # every group releases a stage

    ones_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([8, BLOCK_N], gl.float16)
    ones = gl.allocate_shared_memory(gl.float16, [8, BLOCK_N], ones_layout)
    ones.store(gl.full([8, BLOCK_N], 1.0, gl.float16,
                       gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])))
    fence_async_shared()
    # what every partition takes: the consumer groups differ only in W
    queries = Queries(q_smem, q_bar, q_empty)
    ring = Ring(k_smem, v_smem, mean_smem, kv_ready, kv_empty)
    schedule = Schedule(tile_ids, tile_ready, n_tiles, n_pairs, tile_group, n_heads, group)
    sizes = Sizes(q_len, kv_len, band_pre, band_next, scale, gamma, tail_block, tail_factor)
    output = Output(O, LSE, stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_ls,
                    FLAGS, OVERFLOW_WORD)
    pages = Pages(K_PAGES, V_PAGES, stride_kpb, stride_vpb, page_size)
    key_shift = KeyShift(K, KS, MEAN, SHIFT, stride_kb, stride_kh, stride_ks,
                         n_heads // group, n_pairs // group, n_blocks, next_tile + 3)
    variant = Variant(PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, HAS_LSE, CHECK,
                      PART_FILLED, SHIFT_KEYS, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES)
    if GROUPS == 3:
        gl.warp_specialize([
            (_consumer, (queries, ring, schedule, sizes, output, ones, key_shift, 0, variant)),
            (_consumer, (queries, ring, schedule, sizes, output, ones, key_shift, 1, variant)),
            (_consumer, (queries, ring, schedule, sizes, output, ones, key_shift, 2, variant)),
            (_loader, (q_desc, k_desc, v_desc, m_desc, queries, ring, schedule, sizes, pages,
                       key_shift, next_tile, n_blocks, EXACT_SHIFT, HAS_BAND, PAGED,
                       SHIFT_KEYS, BLOCK_M, BLOCK_N, STAGES)),
        ], [4, 4, 1], [_CONSUMER_REGS_3, _CONSUMER_REGS_3, _LOADER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (queries, ring, schedule, sizes, output, ones, key_shift, 0, variant)),
            (_consumer, (queries, ring, schedule, sizes, output, ones, key_shift, 1, variant)),
            (_loader, (q_desc, k_desc, v_desc, m_desc, queries, ring, schedule, sizes, pages,
                       key_shift, next_tile, n_blocks, EXACT_SHIFT, HAS_BAND, PAGED,
                       SHIFT_KEYS, BLOCK_M, BLOCK_N, STAGES)),
        ], [4, 1], [_CONSUMER_REGS_2, _LOADER_REGS])

