"""The Triton decode kernel (query length 1): ``decode_split_kernel``, one launch.

One program per (kv split, batch, kv head) stacks the query heads of its group as rows,
so that K/V are read once per group and a single query row still fills the GPU (the
splits make one wave of resident programs, :func:`launch.decode_programs`). Each split
writes its partial result; the last split of a group to finish (an arrival count on the
device, which it resets) merges the group's splits by their log-sum-exp in fp32, as
FlashDecoding does in a second launch (:func:`merge_splits`). For PASA each split starts
its own pseudo-average, and the shift is applied there to each raw K block's scores or
keys (``Tuning.decode_shift``). Where the call is checked for overflow (CHECK), the
merging program recomputes each merged row that is not finite by fa-fp32
(:func:`repair.fp32_tile`) and flags it repaired (or still not finite, from a NaN or
inf input): no launch of its own."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pasa_npu.fallback.triton import launch as heuristics
from pasa_npu.fallback.kernel_common import (Binding, kv_row_offsets, cdiv,
                                             kv_tile_descriptors, placeholder, sm_count)
from pasa_npu.fallback.triton.repair import ROW_NONFINITE_C, ROW_REPAIRED_C, fp32_tile
from pasa_npu.fallback.triton.tuning import Tuning
from pasa_npu.fallback.triton.shift import shift_keys_in_kernel, shift_scores
from pasa_npu.fallback.triton.softmax import (block_update, finish_rows, initial_state,
                                              nonfinite_lse, nonfinite_row_mask,
                                              block_row_constant)
from pasa_npu.problem import AttentionProblem


# Over 80 lines: one kv loop holds the contiguous and the paged addressing, the fused key
# shift and the mask, each a few lines that read the loop's state.
@triton.jit
def decode_split_kernel(
    Q, K, V, K_DESC, V_DESC, MASK, SHIFT, PART_O, PART_LSE, PAGES,
    q_starts, kv_starts, kv_lens,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_xb, stride_xk, stride_pb, page_size, table_cols,
    n_kv_heads, group, scale, gamma, head_dim, head_dim_v, blocks_per_split, n_splits,
    n_chunks, group_rows,
    ARRIVALS, O, LSE, FLAGS, SINK, q_lens,
    stride_ob, stride_oh, stride_os, stride_od, stride_lb, stride_lh, stride_ls,
    stride_fb, stride_fh,
    PSEUDO_AVERAGE_SHIFT: tl.constexpr, EXACT_SHIFT: tl.constexpr, LOW_SCORES: tl.constexpr,
    LOW_STATISTICS: tl.constexpr, LOW_ACCUMULATOR: tl.constexpr,
    HAS_MASK: tl.constexpr, GUARD: tl.constexpr, PAGED: tl.constexpr, WHOLE_PAGE: tl.constexpr,
    CHECK: tl.constexpr, SHIFT_SCORES: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEAD_DIM_V: tl.constexpr, HAS_LSE: tl.constexpr, HAS_SINK: tl.constexpr,
    REPAIR_KEYS: tl.constexpr, REPAIR_WHOLE_PAGE: tl.constexpr, USE_TMA: tl.constexpr,
):
    """One split of the kv blocks for BLOCK_G query heads of one kv head's group (a group
    larger than BLOCK_G is cut into ``n_chunks``), query length 1. Writes the partial
    results to rows ``chunk * BLOCK_G + g`` of the group's ``group_rows``. PASA's shift is
    done here on each zero-padded raw K block: on its scores (SHIFT_SCORES, set for the
    shifted allocations only: :func:`shift.shift_scores`) or on the keys
    (:func:`shift.shift_keys_in_kernel`). PAGED: K and V are the caches
    (num_blocks, N_kv, page_size, D), read through the block table ``PAGES``
    (``table_cols`` entries in a row of ``stride_pb`` per batch), whose strides
    ``stride_kb``/``stride_vb`` step blocks.
    USE_TMA: the whole blocks are read through the TMA descriptors ``K_DESC``/``V_DESC``
    of (1, 1, BLOCK_N, HEAD_DIM) tiles over the (B, N_kv, S, D) views (PAGED: the caches,
    each block inside one cache block), the part-filled one as without.
    The last split of the group to arrive (``ARRIVALS``, one count per (batch, kv head,
    chunk), which it resets to 0) merges the group's splits (:func:`merge_splits`) and
    writes the rows of O, LSE and the row flags (:func:`write_merged_rows`); rows of a
    batch whose query length is 0 are left as they are. CHECK: a row that lost resolution
    here, or whose partial output is not finite, leaves a NaN partial LSE, which the merge
    carries into the merged row."""
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
    # loaded here, with the other scalars, not after the arrival: the merge's rows wait on it
    has_query = tl.load(q_lens + b) > 0
    g = chunk * BLOCK_G + tl.arange(0, BLOCK_G)  # query heads of the group
    dims = tl.arange(0, HEAD_DIM)
    dims_v = tl.arange(0, HEAD_DIM_V)
    cols = tl.arange(0, BLOCK_N)
    heads = hk * group + g
    q = tl.load(Q + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh
                + q_start * stride_qs + dims[None, :] * stride_qd,
                mask=(g[:, None] < group) & (dims[None, :] < head_dim), other=0.0)
    pages = PAGES + b.to(tl.int64) * stride_pb  # read only where PAGED
    if PAGED:
        k_base = K + hk.to(tl.int64) * stride_kh
        v_base = V + hk.to(tl.int64) * stride_vh
    else:
        k_base = (K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
                  + kv_start * stride_ks)
        v_base = (V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
                  + kv_start * stride_vs)

    m, l, acc, f, cnt, c = initial_state(BLOCK_G, HEAD_DIM_V, LOW_ACCUMULATOR, q.dtype)
    n_blocks = (kv_len + BLOCK_N - 1) // BLOCK_N
    n_whole = kv_len // BLOCK_N  # blocks all of whose keys are valid
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, n_blocks)
    keys_in_part = tl.maximum(kv_len - n_whole * BLOCK_N, 1)  # the part-filled block's keys
    # pasa's shift entries for a whole block and for the part-filled one, loaded once, up
    # front: a load between the two loops would stall every split's tail
    whole_diag = 0.0
    whole_off = 0.0
    part_diag = 0.0
    part_off = 0.0
    if PSEUDO_AVERAGE_SHIFT and SHIFT_SCORES:
        whole_diag = tl.load(SHIFT + BLOCK_N * 4)
        whole_off = tl.load(SHIFT + BLOCK_N * 4 + 1)
        part_diag = tl.load(SHIFT + keys_in_part * 4)
        part_off = tl.load(SHIFT + keys_in_part * 4 + 1)
    part_mean_factor = 1.0 / BLOCK_N
    if PSEUDO_AVERAGE_SHIFT:  # the mean over the part-filled block's own keys
        part_mean_factor = tl.load(SHIFT + keys_in_part * 4 + 2)
    # two loops: this split's whole blocks, then the part-filled last block if it holds
    # it, so that the first loop's body has none of that block's key masking, own shift
    # and own mean factor
    for part in tl.static_range(2):
        if part == 0:
            lo = first
            hi = tl.minimum(last, n_whole)
            entry_diag = whole_diag
            entry_off = whole_off
        else:
            lo = tl.maximum(first, n_whole)
            hi = last
            entry_diag = part_diag
            entry_off = part_off
        # the part-filled block is not pipelined: it is one block at most
        page_next = 0
        if PAGED and USE_TMA and part == 0:
            # bounded by the table, not by ``lo < hi``: the load need not wait for kv_len
            first_page = lo * BLOCK_N // page_size
            page_next = tl.load(pages + first_page, mask=first_page < table_cols, other=0)
        for blk in tl.range(lo, hi, num_stages=1 if part == 1 else None):
            n = blk * BLOCK_N + cols
            vis = g[:, None] < group
            if USE_TMA and part == 0:  # a whole block lies inside the tensors: no masks
                if PAGED:  # and inside one cache block (WHOLE_PAGE)
                    page = page_next
                    page_next = tl.load(pages + (blk + 1) * BLOCK_N // page_size, mask=blk + 1 < hi,
                                        other=0)
                    k = K_DESC.load([page, hk, blk * BLOCK_N % page_size, 0])
                    v = V_DESC.load([page, hk, blk * BLOCK_N % page_size, 0])
                else:
                    row0 = (kv_start + blk * BLOCK_N).to(tl.int32)
                    k = K_DESC.load([tl.where(stride_kb == 0, 0, b), hk, row0, 0])
                    v = V_DESC.load([tl.where(stride_vb == 0, 0, b), hk, row0, 0])
                k = k.reshape(BLOCK_N, HEAD_DIM)
                v = v.reshape(BLOCK_N, HEAD_DIM_V)
            else:
                k_rows, v_rows = kv_row_offsets(pages, blk * BLOCK_N, cols, kv_len, page_size,
                                                stride_kb, stride_ks, stride_vb, stride_vs,
                                                PAGED, WHOLE_PAGE)
                k_mask = dims[None, :] < head_dim
                v_mask = dims_v[None, :] < head_dim_v
                if part == 1:
                    in_kv = n < kv_len
                    vis = vis & in_kv[None, :]
                    k_mask = k_mask & in_kv[:, None]
                    v_mask = v_mask & in_kv[:, None]
                k = tl.load(k_base + k_rows[:, None] + dims[None, :] * stride_kd, mask=k_mask,
                            other=0.0)
                v = tl.load(v_base + v_rows[:, None] + dims_v[None, :] * stride_vd,
                            mask=v_mask, other=0.0)
            if (PSEUDO_AVERAGE_SHIFT or EXACT_SHIFT) and not SHIFT_SCORES:
                k, mean = shift_keys_in_kernel(k, SHIFT, scale, kv_len - blk * BLOCK_N,
                                               EXACT_SHIFT, part == 1, BLOCK_N,
                                               tl.arange(0, BLOCK_N))
                if EXACT_SHIFT:
                    c = block_row_constant(q, mean, scale)
            key_seen = n < kv_len  # the keys the rows see (all of a whole block's)
            # whether a key of the block may be hidden from a row: the part-filled block's
            # padding, or the mask; else every row sees every key, and the padding rows past
            # the group compute on zero queries, never stored
            keys_hidden = part == 1 or HAS_MASK
            if HAS_MASK:
                masked = tl.load(MASK + b.to(tl.int64) * stride_xb + n * stride_xk,
                                 mask=key_seen, other=1)
                key_seen = masked == 0
                vis = vis & key_seen[None, :]
            qk = tl.dot(q, tl.trans(k))  # fp32 accumulation
            block_max = 0.0
            if SHIFT_SCORES:
                qk, c, block_max = shift_scores(qk, key_seen, entry_diag, entry_off, scale,
                                                kv_len - blk * BLOCK_N, EXACT_SHIFT, part == 1,
                                                keys_hidden, BLOCK_N)
            if PSEUDO_AVERAGE_SHIFT and part == 1:
                mean_factor = part_mean_factor
            elif PSEUDO_AVERAGE_SHIFT:
                mean_factor = 1.0 / BLOCK_N
            else:
                mean_factor = scale
            row_any = tl.max(vis.to(tl.int32), 1) > 0
            m, l, acc, f, cnt = block_update(qk, v, c, vis, row_any, m, l, acc, f, cnt,
                                              scale, gamma, mean_factor, PSEUDO_AVERAGE_SHIFT,
                                              EXACT_SHIFT, LOW_SCORES, LOW_STATISTICS,
                                              keys_hidden, GUARD, BLOCK_N, CHECK, block_max,
                                              SHIFT_SCORES)
    # a split's partial result: the sink joins once, in the merge
    o, lse = finish_rows(m, l, acc.to(tl.float32), f, cnt, gamma, 0.0, PSEUDO_AVERAGE_SHIFT, False)
    if CHECK:  # so the merge's test reads LSEs only: a partial row not finite has a NaN one
        lse = tl.where(nonfinite_row_mask(o, lse), float("nan"), lse)
    part_rows = (bh * n_splits).to(tl.int64) * group_rows + g  # split 0's rows
    rows = part_rows + split * group_rows
    in_group = g < group  # the padding rows' partial results are never read
    tl.store(PART_O + rows[:, None] * HEAD_DIM_V + dims_v[None, :], o, mask=in_group[:, None])
    tl.store(PART_LSE + rows, lse, mask=in_group)
    tl.debug_barrier()  # every thread's stores before the arrival that publishes them
    arrival = ARRIVALS + bh * n_chunks + chunk
    if tl.atomic_add(arrival, 1, sem="acq_rel") == n_splits - 1:
        tl.store(arrival, 0)  # the count left zeroed for the next call
        live = in_group & has_query
        o, lse = merge_splits(PART_O, PART_LSE, SINK, part_rows, group_rows, n_splits, heads,
                              live, HAS_SINK, BLOCK_G, HEAD_DIM_V)
        write_merged_rows(o, lse, O, LSE, FLAGS, SINK, b, heads, live, q_start,
                          stride_ob, stride_oh, stride_os, stride_od, stride_lb, stride_lh,
                          stride_ls, stride_fb, stride_fh, group,
                          Q, K, V, MASK, PAGES, q_lens, kv_start, kv_len,
                          stride_qb, stride_qh, stride_qs, stride_qd,
                          stride_kb, stride_kh, stride_ks, stride_kd,
                          stride_vb, stride_vh, stride_vs, stride_vd,
                          stride_xb, stride_xk, stride_pb, page_size, scale, head_dim,
                          head_dim_v, HAS_LSE, HAS_SINK, CHECK, HAS_MASK, GUARD, PAGED,
                          REPAIR_WHOLE_PAGE, REPAIR_KEYS, BLOCK_G, HEAD_DIM, HEAD_DIM_V)


@triton.jit
def split_rows(PART_O, PART_LSE, rows, present, dims_v, HEAD_DIM_V: tl.constexpr):
    """One split's partial LSE and output at ``rows`` (-inf and 0 where the row mask
    ``present`` is false). Read past L1: other programs wrote them."""
    lse = tl.load(PART_LSE + rows, mask=present, other=float("-inf"), cache_modifier=".cg")
    o = tl.load(PART_O + rows[:, None] * HEAD_DIM_V + dims_v[None, :], mask=present[:, None],
                other=0.0, cache_modifier=".cg")
    return lse, o


@triton.jit
def merge_splits(PART_O, PART_LSE, SINK, part_rows, group_rows, n_splits, heads, live,
                 HAS_SINK: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM_V: tl.constexpr):
    """The merged output (fp32) and LSE of the BLOCK_G rows whose split-0 partial results
    are at ``part_rows`` (split s: ``s * group_rows`` further), by log-sum-exp in fp32,
    four splits a step, each step's loads in flight together (the merge is the kernel's
    serial tail) and rescaled onto a running maximum; rows not ``live`` are read as rows
    without keys. A split's NaN or +inf LSE (a NaN or inf in the keys or values it saw, or
    a row that lost resolution there) makes its weight NaN, so the merged row's output and
    LSE are NaN: the check needs no flag of its own per split. Where every split's row is
    finite the merged row is: fp16 values merged in fp32 cannot overflow. HAS_SINK: each
    head's learnable sink joins the merged row (docs/design.md, "Learnable sinks")."""
    dims_v = tl.arange(0, HEAD_DIM_V)
    top = tl.full([BLOCK_G], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    o = tl.zeros([BLOCK_G, HEAD_DIM_V], tl.float32)
    for s in range(0, n_splits, 4):
        rows = part_rows + s * group_rows
        lse0, o0 = split_rows(PART_O, PART_LSE, rows, live & (s < n_splits), dims_v,
                              HEAD_DIM_V)
        lse1, o1 = split_rows(PART_O, PART_LSE, rows + group_rows, live & (s + 1 < n_splits),
                              dims_v, HEAD_DIM_V)
        lse2, o2 = split_rows(PART_O, PART_LSE, rows + 2 * group_rows,
                              live & (s + 2 < n_splits), dims_v, HEAD_DIM_V)
        lse3, o3 = split_rows(PART_O, PART_LSE, rows + 3 * group_rows,
                              live & (s + 3 < n_splits), dims_v, HEAD_DIM_V)
        new_top = tl.maximum(tl.maximum(top, lse0), tl.maximum(tl.maximum(lse1, lse2), lse3))
        base = tl.where(new_top > float("-inf"), new_top, 0.0)
        w0 = tl.exp(lse0 - base)
        w1 = tl.exp(lse1 - base)
        w2 = tl.exp(lse2 - base)
        w3 = tl.exp(lse3 - base)
        rescale = tl.exp(top - base)
        total = total * rescale + w0 + w1 + w2 + w3
        o = (o * rescale[:, None] + o0 * w0[:, None] + o1 * w1[:, None] + o2 * w2[:, None]
             + o3 * w3[:, None])
        top = new_top
    top_safe = tl.where(top > float("-inf"), top, 0.0)
    # total is 0 where no split saw a key, at least 1 where one did, and NaN where a
    # split's LSE is NaN: that row is NaN
    seen = total != 0
    if HAS_SINK:  # as softmax.finish_rows, with the splits' merged sum as l
        sink = tl.load(SINK + heads, mask=live, other=0.0)
        joined = tl.where(seen, tl.maximum(top_safe, sink), top_safe)
        rebase = tl.exp(top_safe - joined)
        total = rebase * total + tl.where(seen, tl.exp(sink - joined), 0.0)
        o = o * rebase[:, None]
        top_safe = joined
    o = tl.where(seen[:, None], o / tl.where(seen, total, 1.0)[:, None], 0.0)
    lse = tl.where(seen, top_safe + tl.log(tl.where(seen, total, 1.0)), float("-inf"))
    return o, lse


# Over 50 lines: the merged rows' stores and the checked rows' fa-fp32 repair share the
# merge's rows and the repair's many arguments.
@triton.jit
def write_merged_rows(o, lse, O, LSE, FLAGS, SINK, b, heads, live, q_start,
                      stride_ob, stride_oh, stride_os, stride_od, stride_lb, stride_lh,
                      stride_ls, stride_fb, stride_fh, group,
                      Q, K, V, MASK, PAGES, q_lens, kv_start, kv_len,
                      stride_qb, stride_qh, stride_qs, stride_qd,
                      stride_kb, stride_kh, stride_ks, stride_kd,
                      stride_vb, stride_vh, stride_vs, stride_vd,
                      stride_xb, stride_xk, stride_pb, page_size, scale, head_dim, head_dim_v,
                      HAS_LSE: tl.constexpr, HAS_SINK: tl.constexpr, CHECK: tl.constexpr,
                      HAS_MASK: tl.constexpr, GUARD: tl.constexpr, PAGED: tl.constexpr,
                      WHOLE_PAGE: tl.constexpr, REPAIR_KEYS: tl.constexpr,
                      BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr):
    """Store the merged rows of query ``heads`` (where ``live``) into O and LSE. CHECK:
    each row's flag; a row whose LSE is not finite (the splits mark a partial row whose
    output is not finite with a NaN LSE, which makes the merged row's LSE and output NaN;
    -inf: no key, not flagged) is recomputed from Q, K and V by fa-fp32
    (:func:`repair_row`) and flagged repaired, or still not finite where an input was."""
    dims_v = tl.arange(0, HEAD_DIM_V)
    b64 = b.to(tl.int64)
    o_rows = O + b64 * stride_ob + heads.to(tl.int64) * stride_oh + q_start * stride_os
    tl.store(o_rows[:, None] + dims_v[None, :] * stride_od, o.to(O.dtype.element_ty),
             mask=live[:, None] & (dims_v[None, :] < head_dim_v))
    lse_rows = LSE + b64 * stride_lb + heads.to(tl.int64) * stride_lh + q_start * stride_ls
    if HAS_LSE:
        tl.store(lse_rows, lse, mask=live)
    if CHECK:
        flag_rows = FLAGS + b64 * stride_fb + heads.to(tl.int64) * stride_fh + q_start
        flag = (live & nonfinite_lse(lse)).to(tl.uint8)
        tl.store(flag_rows, flag, mask=live)
        if tl.max(flag, 0) != 0:
            tl.debug_barrier()  # the rows' first stores before their repairs overwrite them
            lane = tl.arange(0, BLOCK_G)
            for r in range(BLOCK_G):
                if tl.sum(tl.where(lane == r, flag, 0).to(tl.int32), 0) != 0:
                    h = tl.sum(tl.where(lane == r, heads, 0), 0)
                    repair_row(O, LSE, FLAGS, SINK, b, h, q_start,
                               stride_ob, stride_oh, stride_os, stride_od, stride_lb,
                               stride_lh, stride_ls, stride_fb, stride_fh, group,
                               Q, K, V, MASK, PAGES, q_lens, kv_start, kv_len,
                               stride_qb, stride_qh, stride_qs, stride_qd,
                               stride_kb, stride_kh, stride_ks, stride_kd,
                               stride_vb, stride_vh, stride_vs, stride_vd,
                               stride_xb, stride_xk, stride_pb, page_size, scale, head_dim,
                               head_dim_v, HAS_LSE, HAS_SINK, HAS_MASK, GUARD, PAGED,
                               WHOLE_PAGE, REPAIR_KEYS, HEAD_DIM, HEAD_DIM_V)


@triton.jit(noinline=True)
def repair_row(O, LSE, FLAGS, SINK, b, h, q_start,
               stride_ob, stride_oh, stride_os, stride_od, stride_lb, stride_lh,
               stride_ls, stride_fb, stride_fh, group,
               Q, K, V, MASK, PAGES, q_lens, kv_start, kv_len,
               stride_qb, stride_qh, stride_qs, stride_qd,
               stride_kb, stride_kh, stride_ks, stride_kd,
               stride_vb, stride_vh, stride_vs, stride_vd,
               stride_xb, stride_xk, stride_pb, page_size, scale, head_dim, head_dim_v,
               HAS_LSE: tl.constexpr, HAS_SINK: tl.constexpr, HAS_MASK: tl.constexpr,
               GUARD: tl.constexpr, PAGED: tl.constexpr, WHOLE_PAGE: tl.constexpr,
               REPAIR_KEYS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr):
    """Recompute query head ``h``'s merged row by fa-fp32 (:func:`repair.fp32_tile` on a
    one-row tile, whose products :func:`softmax.fp32_product` forms without a matrix
    instruction, REPAIR_KEYS keys a step, one stage) and flag it repaired, or still not
    finite where an input was. A function of its own, not inlined, so that a path that
    rarely runs leaves the decode kernel's schedule alone (an H200 decoded slightly faster
    so)."""
    dims_v = tl.arange(0, HEAD_DIM_V)
    b64 = b.to(tl.int64)
    sink = 0.0
    if HAS_SINK:
        sink = tl.load(SINK + h)
    o_t, lse_t = fp32_tile(Q, K, V, MASK, PAGES, b, h, h // group, 0,
                           q_start, 1, kv_start, kv_len, q_lens, q_lens,
                           stride_qb, stride_qh, stride_qs, stride_qd,
                           stride_kb, stride_kh, stride_ks, stride_kd,
                           stride_vb, stride_vh, stride_vs, stride_vd,
                           stride_xb, 0, stride_xk, stride_pb, page_size,
                           scale, head_dim, head_dim_v, HAS_MASK, False,
                           GUARD, PAGED, WHOLE_PAGE, 1, REPAIR_KEYS,
                           HEAD_DIM, HEAD_DIM_V, 1, sink, HAS_SINK)
    o_r = tl.sum(o_t, 0)  # the tile's one row
    lse_r = tl.sum(lse_t, 0)
    still = tl.max(nonfinite_row_mask(o_t, lse_t).to(tl.int32), 0) > 0
    h64 = h.to(tl.int64)
    o_at = O + b64 * stride_ob + h64 * stride_oh + q_start * stride_os
    tl.store(o_at + dims_v * stride_od, o_r.to(O.dtype.element_ty), mask=dims_v < head_dim_v)
    if HAS_LSE:
        tl.store(LSE + b64 * stride_lb + h64 * stride_lh + q_start * stride_ls, lse_r)
    tl.store(FLAGS + b64 * stride_fb + h64 * stride_fh + q_start,
             tl.where(still, ROW_NONFINITE_C, ROW_REPAIRED_C).to(tl.uint8))

def run(problem: AttentionProblem, tuning: Tuning, shared, binding: Binding) -> None:
    """Launch the decode kernel for ``problem`` (query length 1;
    :class:`attention.Shared` holds the arguments the launches share) through
    ``binding``, which records them."""
    q, k, v, out = problem.query, problem.key, problem.value, problem.out
    q_starts, q_lens, kv_starts, kv_lens = shared.lengths
    batch, n_heads, n_kv = problem.batch, q.shape[1], k.shape[1]
    group = n_heads // n_kv
    head_dim_p, head_dim_vp = shared.constexprs["HEAD_DIM"], shared.constexprs["HEAD_DIM_V"]
    n_blocks = max(1, cdiv(problem.max_kv_len, shared.constexprs["BLOCK_N"]))
    sms = 132 if shared.interpret else sm_count(q.device.index or 0)
    shift_site = heuristics.decode_shift_site(problem.allocation, tuning)
    block_g, n_chunks, n_splits, blocks_per_split = heuristics.decode_programs(
        group, head_dim_p, shift_site, n_blocks, batch * n_kv, sms)
    group_rows = n_chunks * block_g
    sizes = (batch * n_kv * n_splits * group_rows * head_dim_vp,
             batch * n_kv * n_splits * group_rows)
    part_o = binding.empty("part_o", (sizes[0],), torch.float32, q.device)
    part_lse = binding.empty("part_lse", (sizes[1],), torch.float32, q.device)
    warps = 1 if shared.interpret else 4
    pages = problem.block_table if problem.paged else q_starts
    detect = problem.overflow is not None
    flags = problem.overflow.row_flags if detect else placeholder(q.device, torch.uint8)
    whole_page = problem.block_size % shared.constexprs["BLOCK_N"] == 0
    has_lse = problem.lse is not None
    lse_arg = shared.lse_arg
    # one arrival count per (batch, kv head, chunk), left zeroed by the kernel
    arrivals = binding.zeroed((batch * n_kv * n_chunks,), torch.int32, q.device)
    repair_keys = heuristics.decode_repair_keys(shared.interpret)
    descriptors = (kv_tile_descriptors(binding, k, shared.kv_strides(k)[0], v,
                                       shared.kv_strides(v)[0], shared.constexprs["BLOCK_N"],
                                       head_dim_p, head_dim_vp)
                   if tuning.loads == "tma" and (not problem.paged or whole_page) else None)
    use_tma = descriptors is not None
    stages = 1 if shared.interpret else heuristics.decode_stages(
        shift_site, head_dim_p, table_in_pipeline=problem.paged and not use_tma)
    binding.launch(
        decode_split_kernel, (n_chunks * n_splits * batch * n_kv,),
        q, k, v, *(descriptors or (k, v)), shared.mask,
        shared.shift if shared.shift is not None else part_lse, part_o, part_lse, pages,
        q_starts, kv_starts, kv_lens,
        *shared.strides(q), *shared.kv_strides(k), *shared.kv_strides(v),
        shared.mask_strides[0], shared.mask_strides[2], pages.stride(0), problem.block_size,
        pages.shape[1] if problem.paged else 0, n_kv, group, problem.scale, shared.gamma,
        q.shape[3], v.shape[3], blocks_per_split, n_splits, n_chunks, group_rows,
        arrivals, out, lse_arg, flags, shared.sink, q_lens, *shared.strides(out),
        (shared.batch_stride(lse_arg) if has_lse else 0), lse_arg.stride(1), lse_arg.stride(2),
        shared.batch_stride(flags) if detect else 0, flags.stride(1),
        PAGED=problem.paged, WHOLE_PAGE=whole_page, CHECK=detect,
        SHIFT_SCORES=shift_site == "scores", BLOCK_G=block_g, HAS_LSE=has_lse,
        HAS_SINK=problem.sink is not None, REPAIR_KEYS=repair_keys,
        REPAIR_WHOLE_PAGE=problem.block_size % repair_keys == 0, USE_TMA=use_tma,
        num_warps=warps, num_stages=stages, **shared.constexprs,
        **heuristics.fp_options(problem.allocation))
