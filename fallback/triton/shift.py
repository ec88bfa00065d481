"""PASA's key shift on the GPU: K' per kv block, in a separate pass over K
(:func:`prepare_keys`, the ``_shift_keys`` kernel) or inside an attention kernel
(:func:`shift_keys_in_kernel`, the one definition both use); or the same shift applied to
a block's scores (:func:`shift_scores`, decode).

``pasa`` / ``pasa-mixed``: K' = M^T K per kv block (the stored shifting matrix, scale
folded), evaluated element-wise from M's two distinct entries: in fp32, rounded once, as a
matmul's fp32 accumulation is (the n x n matmul it replaces would read M in every
program). ``pasa-exact``: mean16 per block and K' = fp16((K - mean16) * scale). A
part-filled last block is shifted over its valid keys alone (the matrix for that many
keys, :func:`pasa_npu.beta.partial_block_shift`; the mean of those keys) and its padded
rows of K' are zero (docs/design.md, "Shifting the keys on the matrix engine").

Paged KV: K' is kept per physical block, in one slot per (batch, table entry) of
:func:`page_slots`: a block that lies wholly below the kv length of every batch that
references it is shifted once, in the slot of its first reference, and the other
references read that slot; a batch's last, partly filled block is shifted in its own
slot, as the contiguous pass shifts it. The attention kernels read K' through the slot
table as they read V through the block table.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from pasa_npu.beta import partial_block_shift
from pasa_npu.fallback.kernel_common import Binding, cdiv, interpreting
from pasa_npu.problem import AttentionProblem, device_cached, keeps_device_tensors


@triton.jit
def _shift_keys(K, KS, MEAN, SHIFT, kv_starts, kv_lens, PAGES, SLOTS,
                stride_kb, stride_kh, stride_ks, stride_kd,
                stride_sb, stride_sh, stride_ss,
                stride_mb, stride_mh, stride_mblk,
                stride_pb, slots_per_batch, page_size,
                n_kv_heads, n_blocks, scale, head_dim,
                EXACT_SHIFT: tl.constexpr, PAGED: tl.constexpr,
                BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """K' for one kv block of one (batch, kv head) (:func:`shift_keys_in_kernel`, the one
    definition decode uses too); rows past the valid length are zero. PAGED: K is the cache
    (num_blocks, N_kv, page_size, D) read through the block table ``PAGES``; K' and the
    means go to the slot ``SLOTS[b, j]`` of the block's table entry j (SLOTS is contiguous,
    ``slots_per_batch`` per batch), by the one program that owns the slot
    (:func:`page_slots`)."""
    blk = tl.program_id(0) % n_blocks  # a 1-D grid: CUDA caps the other axes at 65535
    bh = tl.program_id(0) // n_blocks
    b = bh // n_kv_heads
    h = bh % n_kv_heads
    kv_len = tl.load(kv_lens + b)
    rows = blk * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    if PAGED:
        entry = blk * BLOCK_N // page_size
        slot = tl.load(SLOTS + b * slots_per_batch + entry)
        if blk * BLOCK_N >= kv_len or slot != b * slots_per_batch + entry:
            return  # past the kv length, or another reference's slot holds this block
        page = tl.load(PAGES + b.to(tl.int64) * stride_pb + entry).to(tl.int64)
        first = blk * BLOCK_N % page_size  # BLOCK_N divides page_size
        out_rows = first + tl.arange(0, BLOCK_N)
        k_ptrs = (K + page * stride_kb + h.to(tl.int64) * stride_kh
                  + out_rows[:, None].to(tl.int64) * stride_ks + dims[None, :] * stride_kd)
        out_b = slot.to(tl.int64)
        mean_blk = first // BLOCK_N
    else:
        kv_start = tl.load(kv_starts + b)
        k_ptrs = (K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
                  + (kv_start + rows)[:, None].to(tl.int64) * stride_ks
                  + dims[None, :] * stride_kd)
        out_b = b.to(tl.int64)
        out_rows = rows
        mean_blk = blk
    k = tl.load(k_ptrs, mask=(rows[:, None] < kv_len) & (dims[None, :] < head_dim), other=0.0)
    shifted, mean = shift_keys_in_kernel(k, SHIFT, scale, kv_len - blk * BLOCK_N, EXACT_SHIFT,
                                         True, BLOCK_N, tl.arange(0, BLOCK_N))
    if EXACT_SHIFT:
        tl.store(MEAN + out_b * stride_mb + h * stride_mh + mean_blk * stride_mblk + dims,
                 mean.to(tl.float16))
    tl.store(KS + out_b * stride_sb + h.to(tl.int64) * stride_sh
             + out_rows[:, None].to(tl.int64) * stride_ss + dims[None, :], shifted)


@triton.jit
def shift_keys_in_kernel(k, SHIFT, scale, valid, EXACT_SHIFT: tl.constexpr,
                         PART_FILLED: tl.constexpr, BLOCK_N: tl.constexpr, rows):
    """K' of one zero-padded raw K tile whose first ``valid`` rows are keys (all of them
    where ``valid >= BLOCK_N``): in the preprocessing pass (``_shift_keys``), at the start
    of the Gluon prefill's launch, and inside the attention loop (fused: decode, and prefill
    with ``Tuning.shift == "fused"``). ``SHIFT``: the pseudo-average shift's table
    (:func:`cached_shift_table`); ``rows``: 0 .. BLOCK_N - 1 in the layout of ``k``'s rows
    (the function makes no tensor of its own, so that Gluon kernels call it too). Returns
    K', zero past the valid rows, and the block's column statistic in fp32: pasa-exact's
    mean16 over its valid rows, pasa's column sums. PART_FILLED False: the caller knows
    the tile is a whole block (``valid`` unused), and the code has no per-key masking (the
    same values: the scaling by 1/BLOCK_N, a power of two, is exact)."""
    if PART_FILLED:
        n = tl.maximum(tl.minimum(valid, BLOCK_N), 1)
    else:
        n = BLOCK_N
    if EXACT_SHIFT:
        if PART_FILLED:
            sum_k = tl.math.div_rn(tl.sum(k.to(tl.float32), 0), n.to(tl.float32))
        else:
            sum_k = tl.sum(k.to(tl.float32), 0) * (1.0 / BLOCK_N)
        mean16 = sum_k.to(tl.float16)
        shifted = ((k.to(tl.float32) - mean16.to(tl.float32)[None, :]) * scale).to(tl.float16)
        mean = mean16.to(tl.float32)
    else:
        # M^T K without the n x n matmul: row i of M^T K is diag * K_i - off * (sum_j K_j - K_i)
        # for M's stored entries (diag, -off), evaluated in fp32 and rounded once, as the
        # matmul's fp32 accumulation is; an n-times cheaper pass where K is read once anyway
        diag = tl.load(SHIFT + n * 4)
        off = tl.load(SHIFT + n * 4 + 1)
        k32 = k.to(tl.float32)
        mean = tl.sum(k32, 0)
        shifted = ((diag + off) * k32 - off * mean[None, :]).to(tl.float16)
    if PART_FILLED:
        shifted = tl.where((rows < n)[:, None], shifted, 0.0)
    return shifted, mean


@triton.jit
def shift_scores(qk, key_seen, diag, off, scale, valid, EXACT_SHIFT: tl.constexpr,
                 PART_FILLED: tl.constexpr, KEYS_HIDDEN: tl.constexpr, BLOCK_N: tl.constexpr):
    """S' of one block from its raw scores ``qk`` = Q K^T (fp32 accumulation, zero in the
    columns past the first ``valid`` keys): the shift applied to the scores instead of the
    keys, for a kernel that reads each K block once (decode). ``pasa`` / ``pasa-mixed``:
    row i of S' is the map M^T makes of K, diag * S_ij - off * (sum_k S_ik - S_ij), with
    the entries for the block's keys (the row of :func:`cached_shift_table` for that many).
    ``pasa-exact``: S' = scale * S - c with c = scale * (the row's mean score), which is
    Q . mean(K) of the block, one fused multiply-add. Both in fp32 and equal to Q K'^T in
    exact arithmetic; they
    skip K''s rounding to fp16 and carry fp32's cancellation in the scores instead, which
    is fa-fp32's (docs/design.md, "Shifting the scores in decode"). Returns S' (zero past
    the valid keys), c (pasa-exact; zeros otherwise) and each row's maximum of S' rounded
    to fp16, as an fp32 value: over every key of the block, or with KEYS_HIDDEN over the
    keys ``key_seen`` (BLOCK_N) shows (-inf where it shows none).
    S' is an increasing function of S_ij within a row, each of its steps rounding
    monotonically, so that maximum is the same map of the row's maximum score, bit for
    bit: it comes out of the reduction that sums the row, one barrier round trip where a
    row is spread over several warps."""
    if PART_FILLED:
        n = tl.maximum(tl.minimum(valid, BLOCK_N), 1)
    else:
        n = BLOCK_N
    seen = qk
    if KEYS_HIDDEN:
        seen = tl.where(key_seen[None, :], qk, float("-inf"))
    row_sum, row_max = tl.reduce((qk, seen), 1, _sum_and_max)
    if EXACT_SHIFT:
        if PART_FILLED:
            c = tl.math.div_rn(row_sum, n.to(tl.float32)) * scale
        else:
            c = row_sum * (1.0 / BLOCK_N) * scale
        # one rounding, spelled out: the tile and its maximum must round alike, and a
        # compile with FMA contraction may fuse the one and not the other
        shifted = tl.fma(qk, scale, -c[:, None])
        top = tl.fma(row_max, scale, -c)
    else:
        shifted = (diag + off) * qk - off * row_sum[:, None]
        top = (diag + off) * row_max - off * row_sum
        c = tl.zeros([qk.shape[0]], tl.float32)
    if PART_FILLED:
        shifted = tl.where((tl.arange(0, BLOCK_N) < n)[None, :], shifted, 0.0)
    return shifted, c, top.to(tl.float16).to(tl.float32)


@triton.jit
def _sum_and_max(sum0, max0, sum1, max1):
    return sum0 + sum1, tl.maximum(max0, max1)


@device_cached(maxsize=64)
def cached_shift_table(beta: float, n: int, scale: float, device: torch.device) -> torch.Tensor:
    """The pseudo-average shift of a block holding v keys, for v = 1 .. n, on ``device``:
    row v of an (n + 1, 4) fp32 table holds the stored shifting matrix's diagonal and
    off-diagonal magnitude (fp16 values) and the factor that turns the block's sum of S'
    into its row mean (:func:`pasa_npu.beta.partial_block_shift`; 1/n for a full block).
    Copied from the host's table, pinned on a CUDA device, so that where a call keeps
    nothing (:func:`~pasa_npu.problem.keeping_nothing`) the copy needs no wait, and a CUDA
    graph that captures it reads a source kept for good."""
    host = _shift_table(beta, n, scale, device.type == "cuda")
    return host.to(device, non_blocking=not keeps_device_tensors())


@functools.lru_cache(maxsize=64)
def _shift_table(beta: float, n: int, scale: float, pinned: bool) -> torch.Tensor:
    table = torch.zeros(n + 1, 4, dtype=torch.float64)
    for valid in range(1, n + 1):
        table[valid, :3] = torch.tensor(partial_block_shift(beta, valid, n, torch.float16,
                                                            scale), dtype=torch.float64)
    return table.to(torch.float32).pin_memory() if pinned else table.to(torch.float32)


class ShiftedKeys(NamedTuple):
    """The separate pass's output. ``keys``: K' (B, Nkv, blocks*block_n, head_dim_p), or
    paged the slots (slots, Nkv, block_size, head_dim_p) that ``pages`` (int32 (B, entries),
    None when not paged) maps each table entry to; ``means``: pasa-exact's block means
    (B, Nkv, blocks, head_dim_p), contiguous, per batch either way (None for pasa)."""

    keys: torch.Tensor
    means: Optional[torch.Tensor]
    pages: Optional[torch.Tensor]


def prepare_keys(problem: AttentionProblem, k: torch.Tensor, kv_starts: torch.Tensor,
                 kv_lens: torch.Tensor, block_n: int, head_dim_p: int,
                 binding: Binding, launch: bool = True) -> ShiftedKeys:
    """The separate preprocessing pass over ``k`` (the problem's K, or its cache when
    paged): K' padded to whole blocks and the block means (written for pasa-exact only),
    workspaces and launches through ``binding``. ``launch`` False (contiguous K only): the
    workspaces alone, for a kernel that fills them in its own launch."""
    if problem.paged and not launch:
        raise ValueError("paged K' is shifted by the separate pass (its slots are assigned "
                         "on the device)")
    dev = k.device
    batch, n_kv = problem.batch, k.shape[1]
    exact = problem.allocation.exact_shift
    if problem.paged:
        size = problem.block_size
        entries = max(1, cdiv(problem.max_kv_len, size))
        slots = page_slots(problem.block_table, kv_lens, size, entries, k.shape[0], binding)
        rows, n_blocks, out_batch = size, entries * (size // block_n), batch * entries
    else:
        n_blocks = max(1, cdiv(problem.max_kv_len, block_n))
        rows, out_batch, slots = n_blocks * block_n, batch, None
    k_shift = binding.empty("k_shift", (out_batch, n_kv, rows, head_dim_p), torch.float16, dev)
    means = (binding.empty("means", (out_batch, n_kv, rows // block_n, head_dim_p),
                           torch.float16, dev) if exact else None)
    if not launch:
        return ShiftedKeys(k_shift, means, None)
    if exact:
        shift = mean_arg = means
    else:  # no means to write: K' stands in for them, never written through MEAN
        shift = cached_shift_table(problem.beta, block_n, problem.scale, dev)
        mean_arg = k_shift
    pages = problem.block_table if problem.paged else kv_lens
    binding.launch(
        _shift_keys, (n_blocks * batch * n_kv,),
        k, k_shift, mean_arg, shift, kv_starts, kv_lens,
        pages, slots if slots is not None else pages,
        0 if problem.packed and not problem.paged else k.stride(0), k.stride(1), k.stride(2),
        k.stride(3), k_shift.stride(0), k_shift.stride(1), k_shift.stride(2),
        mean_arg.stride(0), mean_arg.stride(1), mean_arg.stride(2),
        pages.stride(0), slots.shape[1] if slots is not None else 0, problem.block_size,
        n_kv, n_blocks, problem.scale, k.shape[3],
        EXACT_SHIFT=exact, PAGED=problem.paged, BLOCK_N=block_n, HEAD_DIM=head_dim_p,
        num_warps=1 if interpreting() else 4)
    if slots is not None and exact:  # each batch's means in its blocks' order
        means = binding.derive("means_by_batch", means, _means_by_batch, slots)
    return ShiftedKeys(k_shift, means, slots)


def _means_by_batch(means: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    return means[slots.long()].transpose(1, 2).flatten(2, 3).contiguous()


def page_slots(table: torch.Tensor, kv_lens: torch.Tensor, block_size: int, entries: int,
               num_blocks: int, binding: Binding) -> torch.Tensor:
    """int32 (B, entries): the K' slot of each batch's table entry, slot ``b * entries + j``
    being entry j of batch b's own. A physical block wholly below the kv length of a batch
    that references it (shareable: no zero padding of its own) maps to the slot of its first
    such reference, the one program that shifts it; other entries keep their own slot. On
    the device in three launches (a fill and two passes of ``_page_slots``), without a host
    synchronisation; ``table`` has unit column stride, ``kv_lens`` is int32 on its device."""
    n_entries = table.shape[0] * entries
    first = binding.empty("first_slot", (num_blocks,), torch.int32, table.device, n_entries)
    slots = binding.empty("slots", (table.shape[0], entries), torch.int32, table.device)
    grid = (max(1, cdiv(n_entries, _SLOTS_PER_PROGRAM)),)
    for claim in (True, False):
        binding.launch(_page_slots, grid, table, kv_lens, first, slots, table.stride(0),
                       entries, n_entries, block_size, num_blocks, CLAIM=claim,
                       BLOCK=_SLOTS_PER_PROGRAM, num_warps=1 if interpreting() else 4)
    return slots


_SLOTS_PER_PROGRAM = 512


@triton.jit
def _page_slots(TABLE, KV_LENS, FIRST, SLOTS, stride_tb, entries, n_entries, block_size,
                num_blocks, CLAIM: tl.constexpr, BLOCK: tl.constexpr):
    """One pass of :func:`page_slots` over BLOCK entries (flat index b * entries + j).
    CLAIM: each entry of a whole block lowers FIRST[block] to its own slot; otherwise each
    entry's slot is stored, FIRST[block] for a whole block and its own else. An entry
    outside [0, num_blocks) counts as not whole (never read: the API layer checks)."""
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = idx < n_entries
    b = idx // entries
    j = idx % entries
    kv_len = tl.load(KV_LENS + b, mask=live, other=0)
    page = tl.load(TABLE + b.to(tl.int64) * stride_tb + j, mask=live, other=-1)
    whole = live & ((j + 1) * block_size <= kv_len) & (page >= 0) & (page < num_blocks)
    if CLAIM:
        tl.atomic_min(FIRST + page, idx, mask=whole)
    else:
        first = tl.load(FIRST + page, mask=whole, other=0)
        tl.store(SLOTS + idx, tl.where(whole, first, idx), mask=live)
