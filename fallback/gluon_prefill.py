"""Warp-specialised prefill for Hopper (sm_90), written in Gluon: pasa-exact, pasa, fa-fp32.

The same computation as :func:`pasa_npu.fallback.triton_attention._attention_fwd` for
these allocations, organised so that the tensor cores and the softmax overlap:

* persistent: one program per SM takes (query tile, batch, query head) tiles until none
  is left: a one-warp loader takes the tiles, and streams each one's Q, then its K (K'
  for PASA) and V blocks with TMA into a ring of stages (``kv_ready`` / ``kv_empty``
  barriers) that runs on from tile to tile, and two or three consumer warp groups of 64
  rows each (128- or 192-row tiles, :func:`consumer_groups`) run QKᵀ, the softmax, PV
  and the fold block after block over the blocks their own rows see (in three loops:
  leading masked blocks, interior blocks, trailing masked blocks), then write their
  rows of O while the next tile's loads are under way;
* little overlaps inside a consumer (no block's PV runs under the next block's
  softmax: that needs registers for S, P, the rounded PV tile and the accumulator at
  once, and spilled; only pasa's statistics run while its P'V matmul does). The overlap
  comes from the groups, which no CTA-wide barrier holds in step: one group's softmax
  runs while another's matmuls do. (The Triton kernel synchronises its 8
  warps several times per kv block.)

Numerics: the operations of the Triton kernel, element by element and in the same
order (fp32 accumulation in the tensor cores; pasa-exact rounds S', P' and the P'V tile
to fp16 and carries c = scale * Q . mean16 in fp32, the constants of 8 blocks per thin
matmul; pasa runs every statistic as an fp16 step, compiled without FMA contraction).
On the H100, fa-fp32 gives the Triton kernel's outputs and LSE bit for bit. pasa-exact
sums its block's fp16 P' (for l), and pasa its fp16 scores (for the block mean) and its
fp16 P', on the tensor cores, a thin matmul with a tile of ones, instead of converting
and adding 64 elements per thread: the same fp16 values summed in fp32, in the tensor
cores' order, so a few outputs in 10^4 differ from the Triton kernel's by rounding
(tests/test_gluon_prefill.py).

Scope (:func:`supported`): fp16 inputs; head dim 64 or 128 (Q, K and V alike); kv_block
128; every batch at the full lengths (no ragged or packed varlen input); no explicit mask
(causal and band modes are computed in the kernel); no rounding guard; layouts TMA can
address. Everything else runs on the Triton kernel.
"""
from __future__ import annotations

import functools

import torch

try:  # Gluon ships with Triton >= 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                                   tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    AVAILABLE = True
except ImportError:  # pragma: no cover - older Triton
    AVAILABLE = False

from pasa_npu.fallback.kernel_common import (INTERPRET, _fp16, _rl, _tile_kv_blocks,
                                             device_capability, launch, sm_count,
                                             tma_strides)
from pasa_npu.problem import AttentionProblem

GROUP_ROWS = 64  # query rows per consumer warp group (a query tile: 2 or 3 groups)
BLOCK_N = 128  # kv_block: pasa-exact's block means are over exactly these keys
LOADER_REGS = 24
#: pasa-exact: with each K/V block the loader fetches the means of the MEAN_ROWS blocks
#: from the aligned one at or before it (the narrowest wgmma operand); a consumer group
#: multiplies them by Q (c = scale * Q . mean16 for those blocks) at its first block and
#: at each aligned one, and picks each block's column
MEAN_ROWS = 8
#: registers per consumer thread, with 2 or 3 groups (the loader warp's 24 and the
#: consumers' must fit the SM's 64k; the first group, the default partition, gets
#: what the others leave)
CONSUMER_REGS = {2: 240, 3: 168}
ALGORITHMS = ("pasa-exact", "pasa", "fa-fp32")
HEAD_DIMS = (64, 128)
#: under a causal or band mask, the query tiles of (batch, head) pairs with this many
#: K/V bytes together are scheduled heaviest first (2 MiB pairs at S = 4k, d = 128: 4
#: pairs). In a scratch A/B on the H100 that was faster than one pair at a time at 4k
#: causal and even at 16k (8 MiB pairs: groups of one); 24 MiB and more lost K/V from L2
#: and ran slower. Without a mask the tiles weigh the same: one pair at a time.
TILE_GROUP_BYTES = 8 << 20


def consumer_groups(head_dim: int) -> int:
    """Consumer warp groups per program: 3 (192-row tiles) at d = 64, where a group's
    chain of QKᵀ, softmax and PV leaves the tensor cores idle for longer than at d = 128;
    2 (128-row tiles) at d = 128, where three groups' registers would not hold the
    accumulators. Every allocation and mask alike since the kv loop was split into masked
    and interior loops (before, pasa-exact and pasa spilled inside a causal kv loop at
    three groups' 168 registers a thread and kept two groups there)."""
    return 3 if head_dim == 64 else 2


def _stages(head_dim: int) -> int:
    """K/V ring depth that fits shared memory (227 KiB): 2 at d = 128, 3 at d = 64."""
    return 2 if head_dim > 64 else 3


if AVAILABLE:
    LOG2E = gl.constexpr(1.4426950408889634)
    _CONSUMER_REGS_2 = gl.constexpr(CONSUMER_REGS[2])
    _CONSUMER_REGS_3 = gl.constexpr(CONSUMER_REGS[3])
    _LOADER_REGS = gl.constexpr(LOADER_REGS)
    ROWS = gl.constexpr(GROUP_ROWS)
    MEAN_ROWS_C = gl.constexpr(MEAN_ROWS)
    #: a thin matmul's 64 x 8 fp32 result (the row sums on the tensor cores, pasa-exact's
    #: row constants): wgmma's narrowest N
    THIN_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 16]))

    @gluon.jit
    def _tile(t, n_tiles, n_pairs, tile_group, n_heads, group, q_len, BLOCK_M: gl.constexpr):
        """Query tile ``t`` of the launch order: (batch, head, kv head, first row). Tiles go
        by groups of ``tile_group`` (batch, head) pairs (TILE_GROUP_BYTES); within a group
        the heaviest query tiles of all its pairs first (under causal and band masks the
        last tiles see the most keys). The tiles end at the last row and start before row
        0 by whole groups of rows where q_len is no tile multiple, so that the groups left
        without rows are in the first tile, the lightest under a mask, not in the last,
        the heaviest (S = 4k at 192-row tiles: two idle groups in a tile of 64 rows)."""
        g0 = t // (tile_group * n_tiles) * tile_group
        size = gl.minimum(tile_group, n_pairs - g0)
        rank = t - g0 * n_tiles
        pid_m = n_tiles - 1 - rank // size
        bh = g0 + rank % size
        h = bh % n_heads
        before = (n_tiles * BLOCK_M - q_len) // ROWS * ROWS
        return bh // n_heads, h, h // group, pid_m * BLOCK_M - before

    @gluon.jit
    def _tile_publish(tile_ids, tile_ready, t, n):
        """Loader: publish tile ``t`` as this program's ``n``-th, in slot n % 2."""
        tile_ids.index(n % 2).store(gl.full([1], t, gl.int32, gl.BlockedLayout([1], [32], [1],
                                                                                [0])))
        gl.thread_barrier()
        mbarrier.arrive(tile_ready.index(n % 2))

    @gluon.jit
    def _tile_read(tile_ids, tile_ready, n):
        """Consumer: this program's ``n``-th tile, once the loader has published it."""
        mbarrier.wait(tile_ready.index(n % 2), (n // 2) & 1)
        return gl.max(tile_ids.index(n % 2).load(gl.BlockedLayout([1], [32], [4], [0])), 0)

    @gluon.jit
    def _loader(q_desc, k_desc, v_desc, m_desc, q_smem, k_smem, v_smem, mean_smem, q_bar,
                q_empty, kv_ready, kv_empty, tile_ids, tile_ready, next_tile, band_pre,
                band_next, q_len, kv_len, n_heads, group, n_tiles, n_pairs, tile_group,
                n_blocks, PSEUDO_AVERAGE_SHIFT: gl.constexpr, EXACT_SHIFT: gl.constexpr, HAS_BAND: gl.constexpr,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """Loader warp: takes this program's tiles (its own index first, then the next
        untaken one from the ``next_tile`` counter, so that a program that finishes early
        takes more) and publishes each to the consumers; for each, the groups' parts of Q
        once they are done with the previous tile's, then K and V block by block
        into the ring, which runs on across tiles. Publishes an index past the last tile
        at the end."""
        total = n_tiles * n_pairs
        stage_bytes: gl.constexpr = (k_desc.block_type.nbytes + v_desc.block_type.nbytes
                                     + (m_desc.block_type.nbytes if EXACT_SHIFT else 0))
        it = 0  # kv blocks loaded by this program so far, over all its tiles
        n = 0  # tiles so far
        t = gl.program_id(0)
        while t < total:
            b, h, hk, m0 = _tile(t, n_tiles, n_pairs, tile_group, n_heads, group, q_len, BLOCK_M)
            lo, hi, full_lo, full_hi, pre, nxt = _tile_kv_blocks(
                m0, q_len, kv_len, band_pre, band_next, b, HAS_BAND, BLOCK_M, BLOCK_N)
            for w in gl.static_range(BLOCK_M // ROWS):
                mbarrier.wait(q_empty.index(w), (n & 1) ^ 1, pred=n > 0)
                mbarrier.expect(q_bar.index(w), q_desc.block_type.nbytes)
                # a group of rows before row 0 loads row 0's and never reads them
                tma.async_copy_global_to_shared(q_desc, [b, h, gl.maximum(m0 + w * ROWS, 0), 0],
                                                q_bar.index(w), q_smem.index(w))
            # every group is past tile n-1's Q, so each has read ids n-1 and n-2
            _tile_publish(tile_ids, tile_ready, t, n)
            mean_row0 = (b * (n_heads // group) + hk) * n_blocks
            for blk in range(lo, hi):
                stage = it % STAGES
                # the first pass over the ring finds every stage free
                mbarrier.wait(kv_empty.index(stage), ((it // STAGES) & 1) ^ 1,
                              pred=it >= STAGES)
                ready = kv_ready.index(stage)
                mbarrier.expect(ready, stage_bytes)
                if EXACT_SHIFT:  # with every block: fetching only those read was no faster
                    tma.async_copy_global_to_shared(
                        m_desc, [mean_row0 + blk - blk % MEAN_ROWS_C, 0], ready,
                        mean_smem.index(stage))
                tma.async_copy_global_to_shared(k_desc, [b, hk, blk * BLOCK_N, 0], ready,
                                                k_smem.index(stage))
                tma.async_copy_global_to_shared(v_desc, [b, hk, blk * BLOCK_N, 0], ready,
                                                v_smem.index(stage))
                it += 1
            n += 1
            t = gl.num_programs(0) + gl.atomic_add(next_tile, 1)
        for w in gl.static_range(BLOCK_M // ROWS):
            mbarrier.wait(q_empty.index(w), (n & 1) ^ 1, pred=n > 0)
        _tile_publish(tile_ids, tile_ready, t, n)

    @gluon.jit
    def _release_blocks(kv_ready, kv_empty, start, end, it, STAGES: gl.constexpr):
        """Consumer: pass over kv blocks start .. end-1 of the ring unread, releasing each
        once it has arrived (a release before the load would count towards the stage's
        previous use). Returns the new count of blocks."""
        for _ in range(start, end):
            stage = it % STAGES
            mbarrier.wait(kv_ready.index(stage), (it // STAGES) & 1)
            mbarrier.arrive(kv_empty.index(stage))
            it += 1
        return it

    @gluon.jit
    def _row_sum_start(x16, ones):
        """Start the sums over axis 1 of the fp16 tile x16 (64 rows) on the tensor cores:
        x16 times a tile of ones, fp32 accumulation, asynchronous (warpgroup_mma_wait, then
        :func:`_row_sum_read`)."""
        a = gl.convert_layout(x16, gl.DotOperandLayout(operand_index=0, parent=THIN_LAYOUT,
                                                       k_width=2))
        return warpgroup_mma(a, ones.permute((1, 0)),
                             gl.zeros([x16.shape[0], 8], gl.float32, THIN_LAYOUT),
                             use_acc=False, is_async=True)

    @gluon.jit
    def _own_column(a, b):
        """gl.reduce's combine for a tile whose columns are equal: each thread keeps its own
        value. ptxas then drops the reduction's shuffles, whose results go unused (a
        gl.max over the 8 equal columns of a thin matmul's row sums cost 2 shuffles and 3
        maxes per row)."""
        return a

    @gluon.jit
    def _column(x, j):
        """Column j of a thin matmul's 64 x MEAN_ROWS tile x (THIN_LAYOUT) as a row vector.
        A thread holds two adjacent columns of its rows, the four lanes of a quad all 8,
        so it takes the one of j's parity and a shuffle within the quad fetches column j
        (a sum over the tile with the other columns zeroed took 2 shuffles and adds a
        row)."""
        even, odd = gl.split(gl.reshape(x, [x.shape[0], x.shape[1] // 2, 2]))
        own = gl.where(j % 2 == 0, even, odd)
        lane = gl.full(own.shape, j // 2, gl.int32, own.type.layout)
        # 0x1c1f: the warp cut into segments of 4 lanes, $2 the lane within one's quad
        got = gl.inline_asm_elementwise("shfl.sync.idx.b32 $0, $1, $2, 0x1c1f, 0xffffffff;",
                                        "=f,f,r", [own, lane], dtype=gl.float32, is_pure=True,
                                        pack=1)
        return gl.reduce(got, 1, _own_column)

    @gluon.jit
    def _row_sum_read(sums, like):
        """The row sums of a finished :func:`_row_sum_start` (its 8 columns are equal),
        laid out as ``like``."""
        return gl.convert_layout(gl.reduce(sums, 1, _own_column), like.type.layout)

    @gluon.jit
    def _visible_keys(rows, q_len, kv_len, pre, nxt, HAS_BAND: gl.constexpr):
        """The keys each row sees, key_lo .. key_hi, and their count (0 for a row outside
        0 .. q_len-1). Recomputed in each masked block rather than kept across the kv loop:
        three fewer registers per row, which kept the kv loop of three consumer groups under
        a causal mask from spilling at 168 registers a thread."""
        key_lo = gl.zeros_like(rows)
        key_hi = gl.zeros_like(rows) + kv_len - 1
        if HAS_BAND:
            key_lo = gl.maximum(rows - pre, key_lo)
            key_hi = gl.minimum(rows + nxt, key_hi)
        valid = rows.to(gl.uint32, bitcast=True) < q_len
        return key_lo, key_hi, gl.where(valid, gl.maximum(key_hi - key_lo + 1, 0), 0)

    @gluon.jit
    def _last_visible_col(rows, blk, q_len, kv_len, pre, nxt, HAS_BAND: gl.constexpr,
                          BLOCK_N: gl.constexpr):
        """For a block past every row's lower edge (a trailing masked block): the last of
        its columns each row sees, -1 where a row sees none."""
        _, key_hi, key_count = _visible_keys(rows, q_len, kv_len, pre, nxt, HAS_BAND)
        return gl.where(key_count > 0, key_hi - blk * BLOCK_N, -1)

    @gluon.jit
    def _key_visible(rows, cols, blk, q_len, kv_len, pre, nxt, HAS_BAND: gl.constexpr,
                     MASK: gl.constexpr, BLOCK_N: gl.constexpr):
        """Whether key blk * BLOCK_N + cols is visible to each row: 0 <= key - key_lo <
        key_count, one unsigned compare per element; under a band, in a trailing block (MASK
        2: past every row's lower edge), col <= the row's :func:`_last_visible_col`. Under
        a band ptxas packs the predicates of the first form into bit fields, about six
        instructions per element, and compiles the second to a compare with an immediate
        and a select (``triton_aot --sass``); without a band key_lo is 0 and the first
        compiles to that already."""
        if HAS_BAND and MASK == 2:
            last = _last_visible_col(rows, blk, q_len, kv_len, pre, nxt, HAS_BAND, BLOCK_N)
            return cols[None, :] <= last[:, None]
        key_lo, _, key_count = _visible_keys(rows, q_len, kv_len, pre, nxt, HAS_BAND)
        return ((cols[None, :] + (blk * BLOCK_N - key_lo)[:, None]).to(gl.uint32, bitcast=True)
                < key_count.to(gl.uint32, bitcast=True)[:, None])

    @gluon.jit
    def _row_sees_block(rows, blk, q_len, kv_len, pre, nxt, HAS_BAND: gl.constexpr,
                        MASK: gl.constexpr, BLOCK_N: gl.constexpr):
        """Whether each row sees any key of masked block ``blk``, in the form of
        :func:`_key_visible` for the same MASK."""
        if HAS_BAND and MASK == 2:
            return _last_visible_col(rows, blk, q_len, kv_len, pre, nxt, HAS_BAND, BLOCK_N) >= 0
        key_lo, key_hi, key_count = _visible_keys(rows, q_len, kv_len, pre, nxt, HAS_BAND)
        return ((key_count > 0) & (key_lo < (blk + 1) * BLOCK_N)
                & (key_hi >= blk * BLOCK_N))

    @gluon.jit
    def _halves_max(x16):
        """The element-wise max of the fp16 tile x16's left and right halves (columns j and
        j + n/2, which the same thread holds), two elements an instruction (max.f16x2)."""
        half: gl.constexpr = x16.shape[1] // 2
        left, right = gl.split(gl.permute(gl.reshape(x16, [x16.shape[0], 2, half]), (0, 2, 1)))
        return gl.inline_asm_elementwise("max.f16x2 $0, $1, $2;", "=r,r,r", [left, right],
                                         dtype=gl.float16, is_pure=True, pack=2)

    @gluon.jit
    def _row_max_f16(x16):
        """The row max of the fp16 tile x16 (128 columns) in fp32, laid out as x16's rows:
        four halvings on packed pairs, then the last 8 columns reduced. (gl.max of the
        tile, even of its fp16 values, compiled to an fp32 max per element wherever the
        fp32 values are live anyway, as for pasa-exact's exponentials: 64 FMNMX a thread
        and block, against 22 packed maxes here, in the sm_90 SASS.)"""
        eighth = _halves_max(_halves_max(_halves_max(_halves_max(x16))))
        return gl.convert_layout(gl.max(eighth.to(gl.float32), 1),
                                 gl.SliceLayout(1, x16.type.layout))

    @gluon.jit
    def _softmax_fa(qk, vis, m_i, l_i, scale, MASKED: gl.constexpr):
        """fa-fp32: fp32 scores and statistics. Returns (m, l, alpha, P in fp16)."""
        s = qk * scale
        if MASKED:
            s = gl.where(vis, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        # a row that has seen no key yet keeps m = -inf: exponentiate against 0
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2((m_i - m_use) * LOG2E)
        p = gl.exp2(s * LOG2E - (m_use * LOG2E)[:, None])
        return m_new, alpha * l_i + gl.sum(p, 1), alpha, _fp16(p)

    @gluon.jit
    def _softmax_exact(qk, vis, m_i, c, MASKED: gl.constexpr):
        """pasa-exact: S' rounded to fp16, the row constant c carried in fp32, P' rounded to
        fp16 (the caller sums it in fp32 on the tensor cores). Returns (m, alpha, P' in
        fp16)."""
        if MASKED:  # masked in fp32, where a select is one instruction (fp16(-inf) = -inf)
            qk = gl.where(vis, qk, float("-inf"))
        sp16 = _fp16(qk)
        sp = sp16.to(gl.float32)
        if MASKED:  # the packed max here made the third group's diagonal loop spill
            m_blk = gl.max(sp, 1)
        else:
            m_blk = _row_max_f16(sp16)
        m_new = gl.maximum(m_i, m_blk + c)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2((m_i - m_use) * LOG2E)
        p16 = _fp16(gl.exp2(sp * LOG2E - ((m_use - c) * LOG2E)[:, None]))
        return m_new, alpha, p16

    @gluon.jit
    def _scores_pasa(qk, vis, ones, MASKED: gl.constexpr):
        """pasa, the block's tile: S' in fp16, its row sums on the tensor cores (every
        column, masked or not: the block mean), its row max (an fp16 max: the max of fp16
        values) and P' = e^(S' - max) in fp16, each an fp16 step. Returns (the sums, the
        max, P'). The sums are waited for here: left in flight past the exponentials, ptxas
        serialised every matmul of the kernel."""
        low: gl.constexpr = gl.float16
        sp16 = _fp16(qk)
        score_sums = warpgroup_mma_wait(0, deps=(_row_sum_start(sp16, ones),))
        if MASKED:  # masked in fp32, where a select is one instruction (fp16(-inf) = -inf)
            sp16 = _fp16(gl.where(vis, qk, float("-inf")))
        # ptxas packs most of this max already (at 22f9850 the halvings cut 9 of 592, and
        # were no faster at d = 128, 4k in a scratch A/B on the H100)
        m_loc = gl.max(sp16, 1).to(gl.float32)
        # a masked key: exp2(-inf) = 0 (a row with no key of the block gets NaN here, and
        # the caller keeps its state)
        p16 = gl.exp2((sp16 - m_loc.to(low)[:, None]).to(gl.float32) * LOG2E).to(low)
        return score_sums, m_loc, p16

    @gluon.jit
    def _statistics_pasa(m_i, f_i, cnt_i, m_loc, s_mean, gamma):
        """pasa: the statistics, every one an fp16 step (the online pseudo-average f over
        the blocks seen, its count, the invariance gamma). Returns (m, f, count, alpha and
        the block's weight beta); l follows once the block's P' sums are in."""
        low: gl.constexpr = gl.float16
        cnt1 = cnt_i + 1.0
        f_new = _rl(_rl(_rl((cnt1 - 1.0) * f_i, low) + s_mean, low) / cnt1, low)
        x = _rl(m_i + _rl(gamma * _rl(f_i - f_new, low), low), low)
        y = _rl(m_loc + _rl(gamma * _rl(s_mean - f_new, low), low), low)
        m_new = gl.maximum(x, y)
        alpha = _rl(gl.exp2(_rl(x - m_new, low) * LOG2E), low)
        beta_w = _rl(gl.exp2(_rl(y - m_new, low) * LOG2E), low)
        return m_new, f_new, cnt1, alpha, beta_w

    @gluon.jit
    def _consumer(shared, W: gl.constexpr, PSEUDO_AVERAGE_SHIFT: gl.constexpr, EXACT_SHIFT: gl.constexpr, HAS_BAND: gl.constexpr,
                  HAS_LSE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        """Consumer warp group W: for each tile the loader publishes, rows m0 + W*64 .. +63 of
        it, every kv block its rows see in turn (it releases the tile's other blocks
        unread). The allocation: pasa (PSEUDO_AVERAGE_SHIFT), pasa-exact (EXACT_SHIFT) or
        fa-fp32 (neither)."""
        (q_smem, k_smem, v_smem, mean_smem, q_bar, q_empty, kv_ready, kv_empty, tile_ids,
         tile_ready, O, LSE, band_pre, band_next, q_len, kv_len, n_heads, group, n_tiles, n_pairs,
         tile_group, scale, gamma, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
         stride_ls, ones) = shared
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
        t = _tile_read(tile_ids, tile_ready, n)
        while t < n_tiles * n_pairs:
            b, h, hk, m0 = _tile(t, n_tiles, n_pairs, tile_group, n_heads, group, q_len, BLOCK_M)
            lo, hi, _, _, _, _ = _tile_kv_blocks(m0, q_len, kv_len, band_pre, band_next, b,
                                                 HAS_BAND, BLOCK_M, BLOCK_N)
            # the blocks this group's rows see, a part of the tile's (with three groups,
            # a causal tile's first rows see fewer)
            g_lo, g_hi, full_lo, full_hi, pre, nxt = _tile_kv_blocks(
                m0 + W * ROWS, q_len, kv_len, band_pre, band_next, b, HAS_BAND, ROWS, BLOCK_N)
            if (m0 + W * ROWS < 0) | (m0 + W * ROWS >= q_len):  # a group without rows
                g_hi = g_lo
                full_lo = g_lo
                full_hi = g_lo
            it = _consumer_tile(
                q, k_smem, v_smem, mean_smem, q_bar.index(W), q_empty.index(W), kv_ready,
                kv_empty, O, LSE, b, h, m0, lo, hi, g_lo, g_hi, full_lo, full_hi, q_len, kv_len,
                pre, nxt, scale, gamma, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                stride_ls, ones, cols, c_zero, s_zero, o_zero, it, n, W, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, HAS_LSE,
                BLOCK_N, HEAD_DIM, STAGES)
            n += 1
            t = _tile_read(tile_ids, tile_ready, n)

    @gluon.jit
    def _kv_step(q, k_smem, v_smem, mean_smem, kv_ready, kv_empty, q_free, ones, blk, g_lo, g_hi,
                 it, acc, m_i, l_i, f_i, cnt_i, c8, rows, cols, c_zero, s_zero, o_zero, q_len,
                 kv_len, pre, nxt, scale, gamma, PSEUDO_AVERAGE_SHIFT: gl.constexpr, EXACT_SHIFT: gl.constexpr, HAS_BAND: gl.constexpr,
                 MASK: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                 STAGES: gl.constexpr):
        """Consumer group: kv block ``blk`` (the program's ``it``-th), QKᵀ, the softmax, P'V
        and the fold into the state (acc, m, l, f, count; pasa-exact's row constants c8 of
        :data:`MEAN_ROWS` blocks). MASK: 0 for a block every row sees whole; 1 for a
        leading masked block (a band's lower edge), 2 for a trailing one (the diagonal, the
        last block past kv_len), whose keys are tested one by one (:func:`_key_visible`).
        Returns the new count and state."""
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
            c = gl.convert_layout(_column(c8, blk % MEAN_ROWS_C), row_s)
        qk = warpgroup_mma_wait(0, deps=(qk,))
        if blk == g_hi - 1:  # the group's last use of Q: the loader may fetch the next
            mbarrier.arrive(q_free)

        if PSEUDO_AVERAGE_SHIFT:  # P'V rounded to fp16; the statistics and the fold in fp16 steps
            if MASKED:
                vis = _key_visible(rows, cols, blk, q_len, kv_len, pre, nxt, HAS_BAND, MASK,
                                   BLOCK_N)
                score_sums, m_loc, p16 = _scores_pasa(qk, vis, ones, True)
            else:
                score_sums, m_loc, p16 = _scores_pasa(qk, None, ones, False)
            # the block sum and P'V start now; the statistics run while they do
            p_sums = _row_sum_start(p16, ones)
            pv = warpgroup_mma(gl.convert_layout(p16, p_layout), v, o_zero, use_acc=False,
                               is_async=True)
            s_mean = _rl(_row_sum_read(score_sums, m_i) / BLOCK_N, gl.float16)
            m_new, f_new, cnt_new, alpha, beta_w = _statistics_pasa(m_i, f_i, cnt_i, m_loc,
                                                                    s_mean, gamma)
            p_sums = warpgroup_mma_wait(1, deps=(p_sums,))
            l_loc = _rl(_row_sum_read(p_sums, m_i), gl.float16)
            l_new = _rl(_rl(alpha * l_i, gl.float16) + _rl(beta_w * l_loc, gl.float16),
                        gl.float16)
            pv = warpgroup_mma_wait(0, deps=(pv,))
            mbarrier.arrive(kv_empty.index(stage))
            alpha16 = gl.convert_layout(alpha.to(gl.float16), row_o)
            beta16 = gl.convert_layout(beta_w.to(gl.float16), row_o)
            acc_new = acc * alpha16[:, None] + _fp16(pv) * beta16[:, None]
            if MASKED:  # rows that see no key of the block keep their state
                row_any = _row_sees_block(rows, blk, q_len, kv_len, pre, nxt, HAS_BAND, MASK,
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
                    vis = _key_visible(rows, cols, blk, q_len, kv_len, pre, nxt, HAS_BAND,
                                       MASK, BLOCK_N)
                    m_new, alpha, p16 = _softmax_exact(qk, vis, m_i, c, True)
                else:
                    m_new, alpha, p16 = _softmax_exact(qk, None, m_i, c, False)
                # P'V in its own fp32 tile, rounded to fp16, then added; alongside, the
                # block's P' summed on the tensor cores (for l)
                p_sums = _row_sum_start(p16, ones)
                pv = warpgroup_mma(gl.convert_layout(p16, p_layout), v, o_zero,
                                   use_acc=False, is_async=True)
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                p_sums = warpgroup_mma_wait(1, deps=(p_sums,))
                l_new = alpha * l_i + _row_sum_read(p_sums, m_i)
                pv = warpgroup_mma_wait(0, deps=(pv,))
                mbarrier.arrive(kv_empty.index(stage))
                acc = acc + _fp16(pv).to(gl.float32)
            else:  # fa-fp32: accumulated in place
                if MASKED:
                    vis = _key_visible(rows, cols, blk, q_len, kv_len, pre, nxt, HAS_BAND,
                                       MASK, BLOCK_N)
                    m_new, l_new, alpha, p16 = _softmax_fa(qk, vis, m_i, l_i, scale, True)
                else:
                    m_new, l_new, alpha, p16 = _softmax_fa(qk, None, m_i, l_i, scale, False)
                p16 = gl.convert_layout(p16, p_layout)
                alpha = gl.convert_layout(alpha, row_o)
                acc = acc * alpha[:, None]
                acc = warpgroup_mma(p16, v, acc, use_acc=True, is_async=True)
                acc = warpgroup_mma_wait(0, deps=(acc,))
                mbarrier.arrive(kv_empty.index(stage))
            m_i, l_i = m_new, l_new
        return it + 1, acc, m_i, l_i, f_i, cnt_i, c8


    @gluon.jit
    def _consumer_tile(q, k_smem, v_smem, mean_smem, q_ready, q_free, kv_ready, kv_empty, O,
                       LSE, b, h, m0, lo, hi, g_lo, g_hi, full_lo, full_hi, q_len, kv_len, pre,
                       nxt, scale, gamma, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                       stride_ls, ones, cols, c_zero, s_zero, o_zero, it, n, W: gl.constexpr,
                       PSEUDO_AVERAGE_SHIFT: gl.constexpr, EXACT_SHIFT: gl.constexpr,
                       HAS_BAND: gl.constexpr, HAS_LSE: gl.constexpr,
                       BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        """One tile's 64 rows of consumer group W (the ``n``-th tile of this program; ``it``
        kv blocks before it): the kv loop over the group's blocks [g_lo, g_hi), releasing
        the rest of the tile's [lo, hi) unread, then O and LSE. Q is released (``q_free``)
        once its last QKᵀ is done. Returns the new count of kv blocks."""
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

        it = _release_blocks(kv_ready, kv_empty, lo, g_lo, it, STAGES)
        # three loops, so that what the masked blocks need is not held across the interior
        # ones (one loop with both kinds of block spilled at three groups under a causal
        # mask): leading masked blocks (a band's lower edge), interior, trailing masked
        # blocks (the diagonal; a last block past kv_len)
        if HAS_BAND:
            for blk in range(g_lo, full_lo):
                it, acc, m_i, l_i, f_i, cnt_i, c8 = _kv_step(
                    q, k_smem, v_smem, mean_smem, kv_ready, kv_empty, q_free, ones, blk, g_lo,
                    g_hi, it, acc, m_i, l_i, f_i, cnt_i, c8, rows, cols, c_zero, s_zero, o_zero,
                    q_len, kv_len, pre, nxt, scale, gamma, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, 1, BLOCK_N, HEAD_DIM,
                    STAGES)
        for blk in range(full_lo, full_hi):
            it, acc, m_i, l_i, f_i, cnt_i, c8 = _kv_step(
                q, k_smem, v_smem, mean_smem, kv_ready, kv_empty, q_free, ones, blk, g_lo,
                g_hi, it, acc, m_i, l_i, f_i, cnt_i, c8, rows, cols, c_zero, s_zero, o_zero,
                q_len, kv_len, pre, nxt, scale, gamma, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, 0, BLOCK_N, HEAD_DIM,
                STAGES)
        for blk in range(full_hi, g_hi):
            it, acc, m_i, l_i, f_i, cnt_i, c8 = _kv_step(
                q, k_smem, v_smem, mean_smem, kv_ready, kv_empty, q_free, ones, blk, g_lo,
                g_hi, it, acc, m_i, l_i, f_i, cnt_i, c8, rows, cols, c_zero, s_zero, o_zero,
                q_len, kv_len, pre, nxt, scale, gamma, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, 2, BLOCK_N, HEAD_DIM,
                STAGES)
        if g_hi <= g_lo:  # a group that sees no kv block never used Q
            mbarrier.arrive(q_free)
        it = _release_blocks(kv_ready, kv_empty, gl.maximum(g_hi, g_lo), hi, it, STAGES)

        # rows that saw no key: output 0, LSE -inf (as the Triton kernel's _finish)
        seen = m_i > float("-inf")
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
        o_ptrs = (O + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
                  + rows_o.to(gl.int64)[:, None] * stride_os + dims[None, :])
        # rows 0 .. q_len-1 (one unsigned compare: the first tile may start before row 0)
        gl.store(o_ptrs, o.to(gl.float16),
                 mask=(rows_o.to(gl.uint32, bitcast=True) < q_len)[:, None])
        if HAS_LSE:
            gl.store(LSE + b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh
                     + rows.to(gl.int64) * stride_ls, lse,
                     mask=rows.to(gl.uint32, bitcast=True) < q_len)
        return it

    @gluon.jit
    def _prefill_ws(q_desc, k_desc, v_desc, m_desc, O, LSE, next_tile, band_pre, band_next,
                    stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_ls,
                    n_heads, group, q_len, kv_len, n_blocks, scale, gamma, n_tiles, n_pairs,
                    tile_group,
                    PSEUDO_AVERAGE_SHIFT: gl.constexpr, EXACT_SHIFT: gl.constexpr, HAS_BAND: gl.constexpr, HAS_LSE: gl.constexpr,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                    STAGES: gl.constexpr):
        """Persistent, one program per SM: each takes tiles of :func:`_tile`'s order until
        none is left (``next_tile``: a zeroed counter; :func:`_loader`), so that its loader
        fetches a tile's Q, K and V while its consumers finish the one before. (A fixed
        stride over the tiles, heaviest first within groups of pairs, left the programs'
        work unbalanced under a causal mask.)"""
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
        # what every consumer group takes: the groups differ only in W
        shared = (q_smem, k_smem, v_smem, mean_smem, q_bar, q_empty, kv_ready, kv_empty, tile_ids,
                  tile_ready, O, LSE, band_pre, band_next, q_len, kv_len, n_heads, group, n_tiles,
                  n_pairs, tile_group, scale, gamma, stride_ob, stride_oh, stride_os,
                  stride_lb, stride_lh, stride_ls, ones)
        if GROUPS == 3:
            gl.warp_specialize([
                (_consumer, (shared, 0, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, HAS_LSE, BLOCK_M, BLOCK_N, HEAD_DIM,
                             STAGES)),
                (_consumer, (shared, 1, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, HAS_LSE, BLOCK_M, BLOCK_N, HEAD_DIM,
                             STAGES)),
                (_consumer, (shared, 2, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, HAS_LSE, BLOCK_M, BLOCK_N, HEAD_DIM,
                             STAGES)),
                (_loader, (q_desc, k_desc, v_desc, m_desc, q_smem, k_smem, v_smem, mean_smem,
                           q_bar, q_empty, kv_ready, kv_empty, tile_ids, tile_ready, next_tile,
                           band_pre, band_next, q_len, kv_len, n_heads, group, n_tiles, n_pairs,
                           tile_group, n_blocks, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, BLOCK_M, BLOCK_N, STAGES)),
            ], [4, 4, 1], [_CONSUMER_REGS_3, _CONSUMER_REGS_3, _LOADER_REGS])
        else:
            gl.warp_specialize([
                (_consumer, (shared, 0, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, HAS_LSE, BLOCK_M, BLOCK_N, HEAD_DIM,
                             STAGES)),
                (_consumer, (shared, 1, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, HAS_LSE, BLOCK_M, BLOCK_N, HEAD_DIM,
                             STAGES)),
                (_loader, (q_desc, k_desc, v_desc, m_desc, q_smem, k_smem, v_smem, mean_smem,
                           q_bar, q_empty, kv_ready, kv_empty, tile_ids, tile_ready, next_tile,
                           band_pre, band_next, q_len, kv_len, n_heads, group, n_tiles, n_pairs,
                           tile_group, n_blocks, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, BLOCK_M, BLOCK_N, STAGES)),
            ], [4, 1], [_CONSUMER_REGS_2, _LOADER_REGS])


# --------------------------------------------------------------------------- host


def _tma_strides(t: torch.Tensor):
    """t's (B, N, S, D) strides as TMA takes them (:func:`kernel_common.tma_strides`), or
    None where TMA cannot address t; a broadcast axis (stride 0, batch included: this
    kernel steps every axis) is refused too."""
    if 0 in t.stride()[1:] or t.stride(0) == 0 and t.shape[0] > 1:
        return None
    return tma_strides(t, t.stride(0))


def supported(problem: AttentionProblem, lengths: tuple) -> bool:
    """Whether this kernel computes ``problem`` (module docstring); ``lengths``: the host
    ints (q_starts, q_lens, kv_starts, kv_lens) per batch."""
    q, k, v, out = problem.query, problem.key, problem.value, problem.out
    if not AVAILABLE or INTERPRET.value or q.device.type != "cuda":
        return False
    if problem.allocation.name not in ALGORITHMS or problem.tiling.kv_block != BLOCK_N:
        return False
    if problem.mask is not None or problem.rounding_guard or problem.packed:
        return False
    if any(t.dtype != torch.float16 for t in (q, k, v, out)):
        return False
    if not (q.shape[3] == k.shape[3] == v.shape[3] and q.shape[3] in HEAD_DIMS):
        return False
    q_starts, q_lens, kv_starts, kv_lens = lengths
    if any(q_starts) or any(kv_starts) or set(q_lens) != {q.shape[2]} \
            or set(kv_lens) != {k.shape[2]}:
        return False  # ragged lengths: the Triton kernel masks them
    if out.stride(3) != 1:
        return False
    if device_capability(q.device.index) != (9, 0):
        return False
    return all(_tma_strides(t) is not None for t in (q, k, v))


@functools.lru_cache(maxsize=None)
def _smem_layout(block: tuple):
    """The shared-memory layout of an fp16 TMA block (computing it costs host time on
    every call)."""
    return gl.NVMMASharedLayout.get_default_for(list(block), gl.float16)


def _descriptor(t: torch.Tensor, rows: int):
    """A TMA descriptor loading (rows, D) tiles of one (batch, head) of the (B, N, S, D)
    view ``t``; rows past S read as zero."""
    block = (1, 1, rows, t.shape[3])
    return TensorDescriptor(t, list(t.shape), _tma_strides(t), list(block), _smem_layout(block))


@functools.lru_cache(maxsize=8)
def _no_means(device: torch.device, head_dim: int) -> torch.Tensor:
    """fa-fp32 has no block means: a never-read stand-in the descriptor can point at."""
    return torch.zeros(MEAN_ROWS, head_dim, dtype=torch.float16, device=device)


def run(problem: AttentionProblem, gamma: float, k_used: torch.Tensor, means,
        band_pre, band_next, lse_arg: torch.Tensor) -> None:
    """Launch the kernel for a :func:`supported` problem. ``gamma``: PASA's
    invariance as the Triton kernel takes it; ``k_used``: K'
    (B, Nkv, blocks*128, D) for PASA (and pasa-exact's block means, (B, Nkv, blocks, D)),
    K and None for fa-fp32; ``band_*``: the per-batch band limits on the device (read only
    under a band)."""
    q, v, out, lse = problem.query, problem.value, problem.out, problem.lse
    head_dim = q.shape[3]
    n_blocks = means.shape[2] if means is not None else 0
    if means is None:
        means = _no_means(q.device, head_dim)
    means_2d = means.reshape(-1, head_dim)
    m_desc = TensorDescriptor(means_2d, list(means_2d.shape), list(means_2d.stride()),
                              [MEAN_ROWS, head_dim], _smem_layout((MEAN_ROWS, head_dim)))
    block_m = GROUP_ROWS * consumer_groups(head_dim)
    n_tiles = -(-problem.max_q_len // block_m)
    n_pairs = problem.batch * q.shape[1]
    kv_bytes = (k_used.shape[2] + v.shape[2]) * head_dim * 2  # one pair's K/V
    tile_group = 1
    if problem.band is not None:
        tile_group = max(1, min(n_pairs, TILE_GROUP_BYTES // kv_bytes))
    grid = (min(n_tiles * n_pairs, sm_count(q.device.index)),)
    launch(
        _prefill_ws, grid,
        _descriptor(q, GROUP_ROWS), _descriptor(k_used, BLOCK_N), _descriptor(v, BLOCK_N),
        m_desc, out, lse_arg, torch.zeros(1, dtype=torch.int32, device=q.device), band_pre,
        band_next, out.stride(0), out.stride(1), out.stride(2),
        lse_arg.stride(0) if lse is not None else 0, lse_arg.stride(1), lse_arg.stride(2),
        q.shape[1], q.shape[1] // problem.key.shape[1], q.shape[2], problem.key.shape[2],
        n_blocks, problem.scale, gamma, n_tiles, n_pairs, tile_group,
        PSEUDO_AVERAGE_SHIFT=problem.allocation.pseudo_average_shift,
        EXACT_SHIFT=problem.allocation.exact_shift, HAS_BAND=problem.band is not None, HAS_LSE=lse is not None,
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, HEAD_DIM=head_dim, STAGES=_stages(head_dim),
        num_warps=4, enable_fp_fusion=not problem.allocation.low_statistics)
