"""Paged KV caches read through a block table into dense copies: what the contract
(:class:`~pasa_npu.problem.AttentionProblem`) and the plan need of a table that
:mod:`pasa_npu.paging` has checked."""
from __future__ import annotations

import torch


def gather(cache: torch.Tensor, table: torch.Tensor, kv_lens: torch.Tensor,
           block_size: int) -> torch.Tensor:
    """The paged ``cache`` (num_blocks, N_kv, block_size, D) as a zero-padded
    (B, N_kv, max kv length, D) copy through ``table``: only the entries of keys below the
    kv lengths are read, and rows past a kv length are zero whatever the block holds."""
    width = int(kv_lens.max()) if kv_lens.numel() else 0
    n_blocks = -(-width // block_size)
    rows = torch.arange(n_blocks * block_size, device=cache.device)
    valid = rows[None, :] < to_device(kv_lens, cache.device)[:, None]  # (B, n_blocks*size)
    used = valid[:, ::block_size]                                   # (B, n_blocks)
    ids = torch.where(used, table[:, :n_blocks].to(cache.device).long(), 0)
    dense = cache[ids].permute(0, 2, 1, 3, 4).flatten(2, 3)         # (B, N, n_blocks*size, D)
    return torch.where(valid[:, None, :, None], dense, 0)[:, :, :width]


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; a host tensor goes to a CUDA device from pinned memory without
    blocking (a pageable copy would wait for the work queued on the stream)."""
    if t.device == device:
        return t
    if t.device.type == "cpu" and device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def contiguous(key: torch.Tensor, value: torch.Tensor, table: torch.Tensor,
               kv_lens: torch.Tensor, block_size: int, packed: bool):
    """(key, value, kv_starts): the paged caches' used rows as contiguous copies, (B, N_kv,
    max kv length, D) zero-padded, or packed (1, N_kv, sum of kv lengths, D) segments from
    ``kv_starts`` when ``packed``."""
    k, v = (gather(t, table, kv_lens, block_size) for t in (key, value))
    lens = kv_lens.tolist()
    starts = torch.tensor([0] + lens[:-1], dtype=torch.int64).cumsum(0)
    if not packed:
        return k, v, torch.zeros_like(starts)
    k, v = (torch.cat([t[b, :, :n] for b, n in enumerate(lens)], 1)[None] for t in (k, v))
    return k, v, starts
