"""Building blocks of the warp-specialised Gluon prefill (:mod:`kernel`): the
aggregates its partitions share, the tile schedule, the row sums on the tensor cores, the
visibility of keys under a band, and each allocation's softmax of one block. Needs Gluon
(Triton 3.5 and later); :mod:`prefill` imports it only where Gluon exists.

No ``from __future__ import annotations`` here: an aggregate's field annotations must be
the Gluon types themselves.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.language.core import _aggregate as aggregate

from pasa_npu.fallback.gluon import config
from pasa_npu.fallback.kernel_common import to_fp16_paired, round_low
from pasa_npu.fallback.triton.shift import shift_keys_in_kernel

LOG2E = gl.constexpr(1.4426950408889634)
ROWS = gl.constexpr(config.GROUP_ROWS)
MEAN_ROWS_C = gl.constexpr(config.MEAN_ROWS)
#: a thin matmul's 64 x 8 fp32 result (the row sums on the tensor cores, pasa-exact's
#: row constants): wgmma's narrowest N
THIN_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(
    version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 16]))
#: a scalar kernel argument: a value, or a constant where the JIT specialised it (an int
#: equal to 1, say)
SCALAR = (gl.tensor, gl.constexpr)


@constexpr_function
def _fill(instance, **fields):
    """Set an aggregate's fields. A constructor receives an argument the JIT specialised
    (an int equal to 1, say) as a Python number: it is kept as a constexpr."""
    for name, value in fields.items():
        if isinstance(value, (bool, int, float)):
            value = gl.constexpr(value)
        setattr(instance, name, value)


@aggregate
class Ring:
    """The K/V ring: ``STAGES`` stages of K (K' for PASA), V and pasa-exact's block means
    that the loader fills (``ready``, with the bytes it expects) and every consumer group
    releases (``empty``), running on from tile to tile."""

    k: gl.shared_memory_descriptor
    v: gl.shared_memory_descriptor
    means: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor

    @constexpr_function
    def __init__(self, k, v, means, ready, empty):
        _fill(self, k=k, v=v, means=means, ready=ready, empty=empty)


@aggregate
class Queries:
    """Each consumer group's rows of Q: the buffers, loaded (``ready``) and released once
    the group's last QKᵀ of a tile is done (``free``), one barrier of each per group."""

    smem: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    free: gl.shared_memory_descriptor

    @constexpr_function
    def __init__(self, smem, ready, free):
        _fill(self, smem=smem, ready=ready, free=free)


@aggregate
class Schedule:
    """The launch's tiles in :func:`tile`'s order and their hand-off from the loader to
    the consumers (``ids``: two slots, ``ready``: a barrier per slot)."""

    ids: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    n_tiles: SCALAR
    n_pairs: SCALAR
    tile_group: SCALAR
    n_heads: SCALAR
    group: SCALAR

    @constexpr_function
    def __init__(self, ids, ready, n_tiles, n_pairs, tile_group, n_heads, group):
        _fill(self, ids=ids, ready=ready, n_tiles=n_tiles, n_pairs=n_pairs, tile_group=tile_group,
              n_heads=n_heads, group=group)


@aggregate
class Sizes:
    """The problem's lengths, its per-batch band limits (pointers), the scale, PASA's
    invariance gamma, and pasa's part-filled last kv block: its index (-1: none) and the
    factor that turns its sum of S' into its row mean."""

    q_len: SCALAR
    kv_len: SCALAR
    band_pre: SCALAR
    band_next: SCALAR
    scale: SCALAR
    gamma: SCALAR
    tail_block: SCALAR
    tail_factor: SCALAR

    @constexpr_function
    def __init__(self, q_len, kv_len, band_pre, band_next, scale, gamma, tail_block,
                 tail_factor):
        _fill(self, q_len=q_len, kv_len=kv_len, band_pre=band_pre, band_next=band_next,
              scale=scale, gamma=gamma, tail_block=tail_block, tail_factor=tail_factor)


@aggregate
class Output:
    """Where O and the LSE go: the pointers and their (batch, head, row) strides; the
    overflow check's row flags (contiguous (B, N, q_len)) and its overflow word (set
    nonzero by a flagged row)."""

    o: SCALAR
    lse: SCALAR
    stride_ob: SCALAR
    stride_oh: SCALAR
    stride_os: SCALAR
    stride_lb: SCALAR
    stride_lh: SCALAR
    stride_ls: SCALAR
    flags: SCALAR
    overflow_word: SCALAR

    @constexpr_function
    def __init__(self, o, lse, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                 stride_ls, flags, overflow_word):
        _fill(self, o=o, lse=lse, stride_ob=stride_ob, stride_oh=stride_oh, stride_os=stride_os,
              stride_lb=stride_lb, stride_lh=stride_lh, stride_ls=stride_ls, flags=flags,
              overflow_word=overflow_word)


@aggregate
class Blocks:
    """One consumer group's kv blocks of a tile: the tile's [lo, hi), the group's own
    [g_lo, g_hi) with its interior [full_lo, full_hi), and the band limits (pre, nxt) of
    the tile's batch."""

    lo: SCALAR
    hi: SCALAR
    g_lo: SCALAR
    g_hi: SCALAR
    full_lo: SCALAR
    full_hi: SCALAR
    pre: SCALAR
    nxt: SCALAR

    @constexpr_function
    def __init__(self, lo, hi, g_lo, g_hi, full_lo, full_hi, pre, nxt):
        _fill(self, lo=lo, hi=hi, g_lo=g_lo, g_hi=g_hi, full_lo=full_lo, full_hi=full_hi, pre=pre,
              nxt=nxt)


@aggregate
class Pages:
    """Paged KV: the block tables K (K' for PASA: the slots of the key-shift pass) and V
    are read through, one row of ``stride_k`` / ``stride_v`` entries per batch, and the
    cache's block size (a multiple of BLOCK_N)."""

    k: SCALAR
    v: SCALAR
    stride_k: SCALAR
    stride_v: SCALAR
    size: SCALAR

    @constexpr_function
    def __init__(self, k, v, stride_k, stride_v, size):
        _fill(self, k=k, v=v, stride_k=stride_k, stride_v=stride_v, size=size)


@gluon.jit
def paged_kv_rows(pages, b, n0):
    """Paged KV: the physical blocks of K and of V that hold batch ``b``'s keys n0 ..
    n0 + BLOCK_N - 1, and the row of key n0 in them."""
    entry = n0 // pages.size
    k_block = gl.load(pages.k + b.to(gl.int64) * pages.stride_k + entry)
    v_block = gl.load(pages.v + b.to(gl.int64) * pages.stride_v + entry)
    return k_block, v_block, n0 % pages.size


@aggregate
class KeyShift:
    """PASA's keys as the launch shifts them (SHIFT_KEYS): the raw K, its (batch, head,
    row) strides and kv heads; the workspaces K' (contiguous (B, N_kv, n_blocks*BLOCK_N, D))
    and pasa-exact's block means (contiguous (B, N_kv, n_blocks, D)); pasa's shift table;
    the (batch, kv head) pairs; and ``arrivals``, a zeroed counter of the consumer groups
    done with their share, which the loader leaves zeroed."""

    k: SCALAR
    shifted: SCALAR
    means: SCALAR
    table: SCALAR
    stride_b: SCALAR
    stride_h: SCALAR
    stride_s: SCALAR
    n_kv_heads: SCALAR
    n_kv_pairs: SCALAR
    n_blocks: SCALAR
    arrivals: SCALAR

    @constexpr_function
    def __init__(self, k, shifted, means, table, stride_b, stride_h, stride_s, n_kv_heads,
                 n_kv_pairs, n_blocks, arrivals):
        _fill(self, k=k, shifted=shifted, means=means, table=table, stride_b=stride_b,
              stride_h=stride_h, stride_s=stride_s, n_kv_heads=n_kv_heads,
              n_kv_pairs=n_kv_pairs, n_blocks=n_blocks, arrivals=arrivals)


@gluon.jit
def _fence_proxy_async_global():
    """Orders this thread's plain (generic-proxy) accesses to global memory with its TMA
    (async-proxy) ones: K' is written by stores and read by TMA loads."""
    gl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, $1;", "=r,r",
                              [gl.program_id(0)], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def shift_keys_part(key_shift, sizes, part, parts, EXACT_SHIFT: gl.constexpr,
                    BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """One consumer group's share of the launch's key shift: kv blocks ``part``,
    ``part + parts``, ... of all (batch, kv head, block), each by the separate pass's
    :func:`~pasa_npu.fallback.triton.shift.shift_keys_in_kernel` (the same K' and means but
    for the order of the column sums), written to the workspaces; then the group counts
    itself done (release: its stores before the count)."""
    # each warp a quarter of the columns: the sums over the rows stay inside the warp
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1024 // HEAD_DIM, HEAD_DIM // 32],
                                            [1, 4], [1, 0])
    rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    n_blocks = key_shift.n_blocks
    for item in range(part, key_shift.n_kv_pairs * n_blocks, parts):
        blk = item % n_blocks
        pair = item // n_blocks  # b * n_kv_heads + kv head: the workspaces' order
        keys = blk * BLOCK_N + rows
        base = ((pair // key_shift.n_kv_heads).to(gl.int64) * key_shift.stride_b
                + (pair % key_shift.n_kv_heads).to(gl.int64) * key_shift.stride_h)
        k = gl.load(key_shift.k + base + keys[:, None].to(gl.int64) * key_shift.stride_s
                    + dims[None, :], mask=(keys < sizes.kv_len)[:, None], other=0.0)
        shifted, mean = shift_keys_in_kernel(k, key_shift.table, sizes.scale,
                                             sizes.kv_len - blk * BLOCK_N, EXACT_SHIFT, True,
                                             BLOCK_N, rows)
        block = pair.to(gl.int64) * n_blocks + blk
        gl.store(key_shift.shifted + (block * BLOCK_N + rows[:, None]) * HEAD_DIM
                 + dims[None, :], shifted)
        if EXACT_SHIFT:
            gl.store(key_shift.means + block * HEAD_DIM + dims, mean.to(gl.float16))
    _fence_proxy_async_global()
    gl.thread_barrier()
    gl.atomic_add(key_shift.arrivals, 1, sem="release", scope="gpu")


@gluon.jit
def await_shifted_keys(key_shift, groups):
    """The loader: wait until all ``groups`` consumer groups of the launch have shifted
    their share of the keys (acquire), before any TMA load of K'."""
    while gl.atomic_add(key_shift.arrivals, 0, sem="acquire", scope="gpu") < groups:
        pass
    _fence_proxy_async_global()


@aggregate
class Variant:
    """The compiled variant, as constexprs: the allocation (pasa: PSEUDO_AVERAGE_SHIFT,
    pasa-exact: EXACT_SHIFT, fa-fp32: neither), the mask (HAS_BAND), the LSE output, the
    overflow check (CHECK), pasa's part-filled last kv block (PART_FILLED), the key shift
    in the launch (SHIFT_KEYS), the tile (BLOCK_M query rows, BLOCK_N keys, HEAD_DIM) and
    the ring's depth."""

    PSEUDO_AVERAGE_SHIFT: gl.constexpr
    EXACT_SHIFT: gl.constexpr
    HAS_BAND: gl.constexpr
    HAS_LSE: gl.constexpr
    CHECK: gl.constexpr
    PART_FILLED: gl.constexpr
    SHIFT_KEYS: gl.constexpr
    BLOCK_M: gl.constexpr
    BLOCK_N: gl.constexpr
    HEAD_DIM: gl.constexpr
    STAGES: gl.constexpr

    @constexpr_function
    def __init__(self, PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT, HAS_BAND, HAS_LSE, CHECK,
                 PART_FILLED, SHIFT_KEYS, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES):
        _fill(self, PSEUDO_AVERAGE_SHIFT=PSEUDO_AVERAGE_SHIFT, EXACT_SHIFT=EXACT_SHIFT,
              HAS_BAND=HAS_BAND, HAS_LSE=HAS_LSE, CHECK=CHECK, PART_FILLED=PART_FILLED,
              SHIFT_KEYS=SHIFT_KEYS, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM,
              STAGES=STAGES)


@aggregate
class Operands:
    """What a consumer group's every block takes and never changes: the tile of ones the
    row sums multiply by, the key columns, and zero tiles of pasa-exact's row constants,
    of S and of O in their layouts."""

    ones: gl.shared_memory_descriptor
    cols: gl.tensor
    c_zero: gl.tensor
    s_zero: gl.tensor
    o_zero: gl.tensor

    @constexpr_function
    def __init__(self, ones, cols, c_zero, s_zero, o_zero):
        _fill(self, ones=ones, cols=cols, c_zero=c_zero, s_zero=s_zero, o_zero=o_zero)


@gluon.jit
def query_tile(t, n_tiles, n_pairs, tile_group, n_heads, group, q_len, BLOCK_M: gl.constexpr):
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
def publish_tile(tile_ids, tile_ready, t, n):
    """Loader: publish tile ``t`` as this program's ``n``-th, in slot n % 2."""
    tile_ids.index(n % 2).store(gl.full([1], t, gl.int32, gl.BlockedLayout([1], [32], [1],
                                                                            [0])))
    gl.thread_barrier()
    mbarrier.arrive(tile_ready.index(n % 2))


@gluon.jit
def read_tile(tile_ids, tile_ready, n):
    """Consumer: this program's ``n``-th tile, once the loader has published it."""
    mbarrier.wait(tile_ready.index(n % 2), (n // 2) & 1)
    return gl.max(tile_ids.index(n % 2).load(gl.BlockedLayout([1], [32], [4], [0])), 0)


@gluon.jit
def release_blocks(kv_ready, kv_empty, start, end, it, STAGES: gl.constexpr):
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
def row_sum_start(x16, ones):
    """Start the sums over axis 1 of the fp16 tile x16 (64 rows) on the tensor cores:
    x16 times a tile of ones, fp32 accumulation, asynchronous (warpgroup_mma_wait, then
    :func:`row_sum_read`)."""
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
def thin_column(x, j):
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
def row_sum_read(sums, like):
    """The row sums of a finished :func:`row_sum_start` (its 8 columns are equal),
    laid out as ``like``."""
    return gl.convert_layout(gl.reduce(sums, 1, _own_column), like.type.layout)


@gluon.jit
def _visible_keys(rows, q_len, kv_len, pre, nxt, HAS_BAND: gl.constexpr):
    """The keys each row sees, key_lo .. key_hi, and their count (0 for a row outside
    0 .. q_len-1). Recomputed in each masked block rather than kept across the kv loop:
    three fewer registers per row, which keep the kv loop of three consumer groups under
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
def key_visible(rows, cols, blk, q_len, kv_len, pre, nxt, HAS_BAND: gl.constexpr,
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
def row_sees_block(rows, blk, q_len, kv_len, pre, nxt, HAS_BAND: gl.constexpr,
                    MASK: gl.constexpr, BLOCK_N: gl.constexpr):
    """Whether each row sees any key of masked block ``blk``, in the form of
    :func:`key_visible` for the same MASK."""
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
def softmax_fa(qk, vis, m_i, l_i, scale, MASKED: gl.constexpr):
    """fa-fp32: fp32 scores and statistics. Returns (m, l, alpha, P in fp16)."""
    s = qk * scale
    if MASKED:
        s = gl.where(vis, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    # a row that has seen no key yet keeps m = -inf: exponentiate against 0
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2((m_i - m_use) * LOG2E)
    p = gl.exp2(gl.fma(s, LOG2E, -(m_use * LOG2E)[:, None]))  # as softmax.block_update's
    return m_new, alpha * l_i + gl.sum(p, 1), alpha, to_fp16_paired(p)


@gluon.jit
def softmax_exact(qk, vis, m_i, c, MASKED: gl.constexpr):
    """pasa-exact: S' rounded to fp16, the row constant c carried in fp32, P' rounded to
    fp16 (the caller sums it in fp32 on the tensor cores). Returns (m, alpha, P' in
    fp16, the block's row max of S')."""
    if MASKED:  # masked in fp32, where a select is one instruction (fp16(-inf) = -inf)
        qk = gl.where(vis, qk, float("-inf"))
    sp16 = to_fp16_paired(qk)
    sp = sp16.to(gl.float32)
    if MASKED:  # the packed max here makes the third group's diagonal loop spill
        m_blk = gl.max(sp, 1)
    else:
        m_blk = _row_max_f16(sp16)
    m_new = gl.maximum(m_i, m_blk + c)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2((m_i - m_use) * LOG2E)
    p16 = to_fp16_paired(gl.exp2(gl.fma(sp, LOG2E, -((m_use - c) * LOG2E)[:, None])))
    return m_new, alpha, p16, m_blk


@gluon.jit
def scores_pasa(qk, vis, ones, MASKED: gl.constexpr):
    """pasa, the block's tile: S' in fp16, its row sums on the tensor cores (every
    column, masked or not: the block mean), its row max (an fp16 max: the max of fp16
    values) and P' = e^(S' - max) in fp16, each an fp16 step. Returns (the sums, the
    max, P'). The sums are waited for here: left in flight past the exponentials, ptxas
    serialised every matmul of the kernel."""
    low: gl.constexpr = gl.float16
    sp16 = to_fp16_paired(qk)
    score_sums = warpgroup_mma_wait(0, deps=(row_sum_start(sp16, ones),))
    if MASKED:  # masked in fp32, where a select is one instruction (fp16(-inf) = -inf)
        sp16 = to_fp16_paired(gl.where(vis, qk, float("-inf")))
    # ptxas packs most of this max already: the halvings of _row_max_f16 gain little here
    m_loc = gl.max(sp16, 1).to(gl.float32)
    # a masked key: exp2(-inf) = 0 (a row with no key of the block gets NaN here, and
    # the caller keeps its state)
    p16 = gl.exp2((sp16 - m_loc.to(low)[:, None]).to(gl.float32) * LOG2E).to(low)
    return score_sums, m_loc, p16


@gluon.jit
def statistics_pasa(m_i, f_i, cnt_i, m_loc, s_mean, gamma):
    """pasa: the statistics, every one an fp16 step (the online pseudo-average f over
    the blocks seen, its count, the invariance gamma). Returns (m, f, count, alpha and
    the block's weight beta); l follows once the block's P' sums are in."""
    low: gl.constexpr = gl.float16
    cnt1 = cnt_i + 1.0
    f_new = round_low(round_low(round_low((cnt1 - 1.0) * f_i, low) + s_mean, low) / cnt1, low)
    x = round_low(m_i + round_low(gamma * round_low(f_i - f_new, low), low), low)
    y = round_low(m_loc + round_low(gamma * round_low(s_mean - f_new, low), low), low)
    m_new = gl.maximum(x, y)
    alpha = round_low(gl.exp2(round_low(x - m_new, low) * LOG2E), low)
    beta_w = round_low(gl.exp2(round_low(y - m_new, low) * LOG2E), low)
    return m_new, f_new, cnt1, alpha, beta_w
