"""torch_npu's paged KV cache, ``block_table`` and ``block_size``, checked and turned into
what :class:`~pasa_npu.problem.AttentionProblem` takes (its docstring states the contract).

torch_npu's rules (``npu_fused_infer_attention_score``, page attention): ``block_table`` is
int32 (B, max_blocks); ``block_size`` is a multiple of 128 from 128 to 512 when the query
length S1 > 1, a multiple of 16 up to 512 in decode (S1 = 1); ``actual_seq_lengths_kv``
is required and gives each batch's kv length (per batch, also for TND); the caches are
(num_blocks, block_size, H) or (num_blocks, N_kv, block_size, D), the latter only with
query layouts BNSD and TND (NTD here too), and K and V share num_blocks, N_kv and
block_size. The table's entries are checked here, which torch_npu leaves to the caller.
"""
from __future__ import annotations

import torch

from .arguments import describe, int_arg

#: block_size when S1 > 1: a multiple of PREFILL_BLOCK_ALIGN up to MAX_BLOCK_SIZE
PREFILL_BLOCK_ALIGN = 128
#: block_size in decode (S1 = 1): a multiple of DECODE_BLOCK_ALIGN up to MAX_BLOCK_SIZE
DECODE_BLOCK_ALIGN = 16
MAX_BLOCK_SIZE = 512
#: query layouts that take the (num_blocks, N_kv, block_size, D) cache (torch_npu: BNSD, TND)
FOUR_DIM_CACHE_LAYOUTS = ("BNSD", "TND", "NTD")


def check_arguments(block_table, block_size, device: torch.device) -> int:
    """``block_size`` as an int > 0, after checking that the two arguments come together
    and ``block_table``'s type, dtype, rank and device (its shape against the batch and
    its entries are checked per call: :func:`table_for_call`)."""
    block_size = int_arg(block_size, "block_size", minimum=0)
    if block_table is None:
        raise ValueError(f"block_size={block_size} needs a block_table (paged KV), got None")
    if not block_size:
        raise ValueError("block_table needs block_size > 0 (the tokens per cache block), "
                         "got 0")
    if not isinstance(block_table, torch.Tensor):
        raise TypeError(f"block_table must be a tensor or None, got {describe(block_table)}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise TypeError(f"block_table must be a 2-D int32 tensor (B, max_blocks), got "
                        f"{describe(block_table)}")
    if block_table.device not in (device, torch.device("cpu")):
        raise ValueError(f"block_table is on {block_table.device}; it must be on the query's "
                         f"device ({device}) or on the host")
    return block_size


def check_block_size(block_size: int, decode: bool) -> None:
    """torch_npu's block_size rule for the query length (``decode``: S1 = 1)."""
    align = DECODE_BLOCK_ALIGN if decode else PREFILL_BLOCK_ALIGN
    if block_size % align or block_size > MAX_BLOCK_SIZE:
        case = "in decode (S1 = 1)" if decode else "when S1 > 1"
        raise ValueError(f"block_size must be a multiple of {align} up to {MAX_BLOCK_SIZE} "
                         f"{case}, as torch_npu requires; got {block_size}")


def cache_views(key, value, layout: str, num_kv_heads: int, block_size: int):
    """(key, value) as (num_blocks, N_kv, block_size, D) views of torch_npu's paged caches
    (num_blocks, block_size, N_kv * D) or (num_blocks, N_kv, block_size, D); no copy."""
    views = []
    for name, cache in (("key", key), ("value", value)):
        shape = tuple(cache.shape)
        if cache.dim() == 3:
            if shape[1] != block_size or shape[2] % num_kv_heads:
                raise ValueError(
                    f"{name} cache {shape} does not fit (num_blocks, block_size, N_kv * D) "
                    f"with block_size={block_size} and N_kv={num_kv_heads}")
            views.append(cache.unflatten(2, (num_kv_heads, shape[2] // num_kv_heads))
                         .permute(0, 2, 1, 3))
        elif cache.dim() == 4 and layout in FOUR_DIM_CACHE_LAYOUTS:
            if shape[1] != num_kv_heads or shape[2] != block_size:
                raise ValueError(
                    f"{name} cache {shape} does not fit (num_blocks, N_kv, block_size, D) "
                    f"with N_kv={num_kv_heads} and block_size={block_size}")
            views.append(cache)
        else:
            allowed = ("(num_blocks, block_size, N_kv * D) or (num_blocks, N_kv, block_size, D)"
                       if layout in FOUR_DIM_CACHE_LAYOUTS else
                       f"(num_blocks, block_size, N_kv * D) (torch_npu takes the 4-D cache "
                       f"with query layouts {', '.join(FOUR_DIM_CACHE_LAYOUTS[:2])} only)")
            raise ValueError(f"{name} cache with block_table must be {allowed} for input_layout "
                             f"{layout}; got shape {shape}")
    k, v = views
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"value cache has {v.shape[0]} blocks but the key cache "
                         f"{k.shape[0]}")
    return k, v


def table_for_call(table: torch.Tensor, kv_lens: torch.Tensor, num_blocks: int,
                   block_size: int, device: torch.device) -> torch.Tensor:
    """``table`` checked and on ``device``: every entry of a key below its batch's kv length
    in [0, num_blocks). A host table is checked on the host (no wait for the device) and
    copied to the device without blocking it; a device table is checked on the device and
    its verdict read back, one synchronisation per call, except while a CUDA graph is
    being captured, where no read-back is possible and the entries are trusted (as
    torch_npu trusts them always)."""
    if table.shape[0] != kv_lens.numel():
        raise ValueError(f"block_table has {table.shape[0]} rows but the batch is "
                         f"{kv_lens.numel()} (one row per batch)")
    on_host = table.device.type == "cpu"
    if not on_host and device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return table
    blocks = (kv_lens + (block_size - 1)) // block_size
    used = torch.arange(table.shape[1], device=table.device)[None, :] < \
        blocks.to(table.device)[:, None]
    bad = used & ((table < 0) | (table >= num_blocks))
    if bool(bad.any()):
        b, j = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"block_table[{b}, {j}] = {int(table[b, j])} is not a block of the "
                         f"cache: entries for keys below actual_seq_lengths_kv[{b}] = "
                         f"{int(kv_lens[b])} must lie in [0, {num_blocks})")
    if on_host and device.type != "cpu":
        source = table.pin_memory() if device.type == "cuda" else table
        return source.to(device, non_blocking=True)
    return table


def gather(cache: torch.Tensor, table: torch.Tensor, kv_lens: torch.Tensor,
           block_size: int) -> torch.Tensor:
    """The paged ``cache`` (num_blocks, N_kv, block_size, D) as a zero-padded
    (B, N_kv, max kv length, D) copy through ``table``: only the entries of keys below the
    kv lengths are read, and rows past a kv length are zero whatever the block holds."""
    width = int(kv_lens.max()) if kv_lens.numel() else 0
    n_blocks = -(-width // block_size)
    rows = torch.arange(n_blocks * block_size, device=cache.device)
    valid = rows[None, :] < kv_lens.to(cache.device)[:, None]       # (B, n_blocks*size)
    used = valid[:, ::block_size]                                   # (B, n_blocks)
    ids = torch.where(used, table[:, :n_blocks].to(cache.device).long(), 0)
    dense = cache[ids].permute(0, 2, 1, 3, 4).flatten(2, 3)         # (B, N, n_blocks*size, D)
    return torch.where(valid[:, None, :, None], dense, 0)[:, :, :width]


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
