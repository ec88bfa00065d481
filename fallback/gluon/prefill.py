"""Warp-specialised prefill for Hopper (sm_90), written in Gluon: pasa-exact, pasa, fa-fp32.

The same computation as :func:`pasa_npu.fallback.triton.prefill.prefill_kernel` for
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
  once, and spills; only pasa's statistics run while its P'V matmul does). The overlap
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
(tests/fallback/gluon/test_gluon_prefill.py).

Overflow check (where the call is checked): each consumer group flags its rows whose
output or LSE is not finite (the LSE through the row's statistics, whose log a call
without LSE never takes), a flagged row setting the call's overflow word (the word
after the tile counter, in a buffer the kernels leave zeroed); the Triton repair launch
(:mod:`triton.repair`) recomputes them. pasa's part-filled last kv block (kv_len not a
multiple of 128) takes its keys' mean (:func:`pasa_npu.beta.partial_block_shift`), as the
Triton kernel does (PART_FILLED: compiled in only where the problem has one).

Scope (:func:`supported`): fp16 inputs; head dim 64 or 128 (Q, K and V alike); kv_block
128; every batch at the full lengths (no ragged or packed varlen input); no explicit mask
(causal and band modes are computed in the kernel); no rounding guard; no learnable sink
(torch_npu takes sinks with packed layouts only, which this kernel does not read; a sink
joins on the Triton kernel, :func:`triton.softmax.finish_rows`); layouts TMA can
address; fewer than 2**31 query rows over all batches and heads (the row flags' offsets
are 32-bit). Paged KV too, where the block size is a multiple of 128 and every batch has the
same kv length, a multiple of 128 (the loader reads whole kv blocks of the caches: rows
past a kv length would be the cache's other contents); the loader looks each kv block's
physical block up in the table (K' in the key-shift pass's slots) and loads it through
descriptors over the whole caches. Everything else runs on the Triton kernel.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

try:  # Gluon ships with Triton >= 3.5
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from pasa_npu.fallback.gluon.kernel import prefill_ws_kernel
    AVAILABLE = True
except ImportError:  # pragma: no cover - older Triton
    AVAILABLE = False

from pasa_npu.beta import partial_block_shift
from pasa_npu.fallback.gluon.config import BLOCK_N, GROUP_ROWS, MEAN_ROWS
from pasa_npu.fallback.kernel_common import (INTERPRET, Binding, device_capability, sm_count,
                                             tma_strides)
from pasa_npu.problem import AttentionProblem, device_cached

ALGORITHMS = ("pasa-exact", "pasa", "fa-fp32")
HEAD_DIMS = (64, 128)
#: under a causal or band mask, the query tiles of (batch, head) pairs with this many K/V
#: bytes together are scheduled heaviest first (more lost K/V from L2); without a mask the
#: tiles weigh the same: one pair at a time
TILE_GROUP_BYTES = 8 << 20


def consumer_groups(head_dim: int) -> int:
    """Consumer warp groups per program: 3 (192-row tiles) at d = 64, where a group's
    chain of QKᵀ, softmax and PV leaves the tensor cores idle for longer than at d = 128;
    2 (128-row tiles) at d = 128, where three groups' registers would not hold the
    accumulators."""
    return 3 if head_dim == 64 else 2


def _stages(head_dim: int) -> int:
    """K/V ring depth that fits shared memory (227 KiB): 2 at d = 128, 3 at d = 64."""
    return 2 if head_dim > 64 else 3


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
    if problem.sink is not None:
        return False
    if any(t.dtype != torch.float16 for t in (q, k, v, out)):
        return False
    if not (q.shape[3] == k.shape[3] == v.shape[3] and q.shape[3] in HEAD_DIMS):
        return False
    q_starts, q_lens, kv_starts, kv_lens = lengths
    full_kv = {k.shape[2]}
    if problem.paged:  # one kv length, in whole kv blocks of whole cache blocks
        full_kv = {problem.max_kv_len} if problem.max_kv_len % BLOCK_N == 0 else {-1}
        if problem.block_size % BLOCK_N:
            return False
    if any(q_starts) or any(kv_starts) or set(q_lens) != {q.shape[2]} \
            or set(kv_lens) != full_kv:
        return False  # ragged lengths: the Triton kernel masks them
    if out.stride(3) != 1 or q.shape[:3].numel() >= 2 ** 31:  # 32-bit row-flag offsets
        return False
    if device_capability(q.device.index) != (9, 0):
        return False
    return all(_tma_strides(t) is not None for t in (q, k, v))


@functools.lru_cache(maxsize=None)
def _smem_layout(block: tuple):
    """The shared-memory layout of an fp16 TMA block (computing it costs host time on
    every call)."""
    return gl.NVMMASharedLayout.get_default_for(list(block), gl.float16)


def _new_descriptor(t: torch.Tensor, rows: int):
    """A TMA descriptor loading (rows, D) tiles of one (batch, head) of the (B, N, S, D)
    view ``t``; rows past S read as zero."""
    block = (1, 1, rows, t.shape[3])
    return TensorDescriptor(t, list(t.shape), _tma_strides(t), list(block), _smem_layout(block))


def _new_means_descriptor(means: torch.Tensor):
    """A TMA descriptor loading MEAN_ROWS block means at a time from the contiguous
    ``means`` (..., D), read as its rows (a view would cost a step per call)."""
    if not means.is_contiguous():
        raise ValueError(f"the block means must be contiguous, got strides {means.stride()}")
    head_dim = means.shape[-1]
    return TensorDescriptor(means, [means.numel() // head_dim, head_dim], [head_dim, 1],
                            [MEAN_ROWS, head_dim], _smem_layout((MEAN_ROWS, head_dim)))


@device_cached(maxsize=8)
def _no_means(device: torch.device, head_dim: int) -> torch.Tensor:
    """fa-fp32 has no block means: a never-read stand-in the descriptor can point at."""
    return torch.zeros(MEAN_ROWS, head_dim, dtype=torch.float16, device=device)


def shifts_in_launch(problem: AttentionProblem, tuning) -> bool:
    """Whether the kernel shifts PASA's keys itself, at the start of its launch
    (:func:`parts.shift_keys_part`), rather than after a separate pass: for contiguous
    K/V under ``Tuning.shift`` "in-launch" (paged K' is kept per physical block, in slots
    that the separate pass assigns)."""
    return (problem.allocation.shifts_keys and not problem.paged
            and tuning.shift == "in-launch")


def run(problem: AttentionProblem, gamma: float, k_used: torch.Tensor, means,
        band_pre, band_next, lse_arg: torch.Tensor, shift_table, k_pages,
        binding: Binding, shift_in_launch: bool = False) -> Optional[torch.Tensor]:
    """Launch the kernel for a :func:`supported` problem. ``gamma``: PASA's
    invariance as the Triton kernel takes it; ``k_used``: K'
    (B, Nkv, blocks*128, D) for PASA (and pasa-exact's block means, (B, Nkv, blocks, D)),
    K and None for fa-fp32; ``band_*``: the per-batch band limits on the device (read only
    under a band); ``shift_table``: pasa's (:func:`triton.shift.cached_shift_table`) or
    None. ``shift_in_launch`` (:func:`shifts_in_launch`): ``k_used`` and ``means`` are
    workspaces that the launch fills from ``problem.key`` before its tiles, as a
    cooperative launch. Paged: ``k_used`` is the key cache, or K's slots for PASA, and
    ``k_pages`` the table that maps each batch's kv blocks into it. ``binding`` makes the
    workspaces and descriptors and launches, recording them. Where the call is checked for
    overflow (the flags are ``problem.overflow``'s), returns its overflow word on the
    device: nonzero once a row is flagged, followed by the repair's arrival count (both
    after the kernel's tile counter, in a buffer the kernels leave zeroed)."""
    q, v, out, lse = problem.query, problem.value, problem.out, problem.lse
    head_dim = q.shape[3]
    detect = problem.overflow is not None
    flags = problem.overflow.row_flags if detect else out
    if detect and (tuple(flags.shape) != tuple(q.shape[:3]) or not flags.is_contiguous()):
        raise ValueError(f"the Gluon prefill writes contiguous row flags of shape "
                         f"{tuple(q.shape[:3])}, got {tuple(flags.shape)} strides "
                         f"{flags.stride()}")
    tail_block, tail_factor = -1, 1.0 / BLOCK_N
    kv_len = problem.max_kv_len if problem.paged else problem.key.shape[2]
    if shift_table is not None and kv_len % BLOCK_N:  # pasa's part-filled last block
        tail_block = kv_len // BLOCK_N
        tail_factor = partial_block_shift(problem.beta, kv_len % BLOCK_N, BLOCK_N,
                                          torch.float16, problem.scale)[2]
    n_blocks = (means.shape[2] if means is not None
                else k_used.shape[2] // BLOCK_N if shift_in_launch else 0)
    means_arg = means if means is not None else _no_means(q.device, head_dim)
    m_desc = binding.descriptor(means_arg, _new_means_descriptor)
    block_m = GROUP_ROWS * consumer_groups(head_dim)
    n_tiles = -(-problem.max_q_len // block_m)
    n_pairs = problem.batch * q.shape[1]
    kv_rows = 2 * kv_len if problem.paged else k_used.shape[2] + v.shape[2]
    kv_bytes = kv_rows * head_dim * 2  # one pair's K/V
    v_pages = problem.block_table if problem.paged else band_pre  # never read unpaged
    k_pages = k_pages if problem.paged else band_pre
    tile_group = 1
    if problem.band is not None:
        tile_group = max(1, min(n_pairs, TILE_GROUP_BYTES // kv_bytes))
    grid = (min(n_tiles * n_pairs, sm_count(q.device.index)),)
    # the tile counter, the overflow word, the repair's arrivals and the key shift's,
    # left zeroed by the kernels (the loader's last fetch, the repair's last program)
    counters = binding.zeroed((4,), torch.int32, q.device)
    overflow_word = counters[1:]
    descriptors = [binding.descriptor(t, _new_descriptor, rows=rows)
                   for t, rows in ((q, GROUP_ROWS), (k_used, BLOCK_N), (v, BLOCK_N))]
    raw = problem.key if shift_in_launch else out  # never read unless shifted here
    binding.launch(
        prefill_ws_kernel, grid, *descriptors,
        m_desc, out, lse_arg, flags, overflow_word, counters, band_pre,
        band_next, k_pages, v_pages, raw, k_used if shift_in_launch else out, means_arg,
        shift_table if shift_table is not None else lse_arg,
        out.stride(0), out.stride(1), out.stride(2),
        lse_arg.stride(0) if lse is not None else 0, lse_arg.stride(1), lse_arg.stride(2),
        k_pages.stride(0), v_pages.stride(0), problem.block_size,
        raw.stride(0), raw.stride(1), raw.stride(2),
        q.shape[1], q.shape[1] // problem.key.shape[1], q.shape[2], kv_len,
        n_blocks, problem.scale, gamma, tail_block, tail_factor, n_tiles, n_pairs, tile_group,
        PSEUDO_AVERAGE_SHIFT=problem.allocation.pseudo_average_shift,
        EXACT_SHIFT=problem.allocation.exact_shift, HAS_BAND=problem.band is not None,
        HAS_LSE=lse is not None, PAGED=problem.paged, CHECK=detect,
        PART_FILLED=tail_block >= 0, SHIFT_KEYS=shift_in_launch,
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, HEAD_DIM=head_dim, STAGES=_stages(head_dim),
        num_warps=4, enable_fp_fusion=not problem.allocation.low_statistics,
        launch_cooperative_grid=shift_in_launch)
    return overflow_word if detect else None
