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

from typing import Optional

import torch

from .arguments import describe
from .tensor_memo import TensorMemo

#: block_size when S1 > 1: a multiple of PREFILL_BLOCK_ALIGN up to MAX_BLOCK_SIZE
PREFILL_BLOCK_ALIGN = 128
#: block_size in decode (S1 = 1): a multiple of DECODE_BLOCK_ALIGN up to MAX_BLOCK_SIZE
DECODE_BLOCK_ALIGN = 16
MAX_BLOCK_SIZE = 512
#: query layouts that take the (num_blocks, N_kv, block_size, D) cache (torch_npu: BNSD, TND)
FOUR_DIM_CACHE_LAYOUTS = ("BNSD", "TND", "NTD")


def check_arguments(block_table, block_size: int, device: torch.device) -> None:
    """Check that ``block_table`` and ``block_size`` (an int >= 0) come together, and
    ``block_table``'s type, dtype, rank and device (its shape against the batch and its
    entries are checked per call: :func:`table_for_call`)."""
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
                   block_size: int, device: torch.device, table_on_host: bool,
                   on_host: bool, device_lengths: bool = False) -> torch.Tensor:
    """``table`` checked and on ``device`` with unit column stride (``table_on_host``,
    ``on_host``: whether the table and ``device`` are the host's memory,
    :func:`~pasa_npu.problem.host_memory`): every entry of a key
    below its batch's kv length in [0, num_blocks), or a ``ValueError`` naming the first
    entry that is not. Never a wait for the device on a checked table:

    * a host table is checked on the host on every call and copied to the device from
      pinned memory without blocking;
    * a device table is checked once per version of its contents (its ``_version``,
      storage and shape), with one read-back to the host, then trusted while they stay the
      same: a loop that reuses one table pays once, whatever its kv lengths; a table
      rewritten in place between calls pays at its next call. Writes that bypass
      PyTorch's version counter (a custom kernel, ``.data``, DLPack) are not seen, and an
      inference tensor has no version: it is checked on every call. While a CUDA graph is
      being captured a table not checked before is trusted (as torch_npu trusts them
      always);
    * with ``device_lengths`` (the call's kv lengths stay on the device, ``kv_lens`` are the
      capacities) nothing is read: the backend holds each kv length against the keys of
      its row's leading entries in [0, num_blocks) on the device
      (:class:`~pasa_npu.problem.DeviceLengths`)."""
    if table.shape[0] != kv_lens.numel():
        raise ValueError(f"block_table has {table.shape[0]} rows but the batch is "
                         f"{kv_lens.numel()} (one row per batch)")
    if table_on_host:
        if not device_lengths:
            _check_entries(table, kv_lens, num_blocks, block_size,
                           _host_prefix(table, num_blocks))
        if table.shape[1] > 1 and table.stride(1) != 1:
            table = table.contiguous()
        if on_host:
            return table
        source = table.pin_memory() if device.type == "cuda" else table
        return source.to(device, non_blocking=True)
    prefix = None if device_lengths else checked_prefix(table, num_blocks)
    if prefix is not None:
        _check_entries(table, kv_lens, num_blocks, block_size, prefix)
    if table.shape[1] > 1 and table.stride(1) != 1:
        table = table.contiguous()  # the kernels step a row's entries one by one
    return table


def _check_entries(table: torch.Tensor, kv_lens: torch.Tensor, num_blocks: int,
                   block_size: int, prefix: tuple) -> None:
    """Raise for the first batch whose kv length needs more entries than the ``prefix``
    of its row that lies in [0, num_blocks), naming that entry."""
    for b, (kv_len, valid) in enumerate(zip(kv_lens.tolist(), prefix)):
        if kv_len > valid * block_size:
            raise ValueError(f"block_table[{b}, {valid}] = {int(table[b, valid])} is not a "
                             f"block of the cache: entries for keys below "
                             f"actual_seq_lengths_kv[{b}] = {kv_len} must lie in "
                             f"[0, {num_blocks})")


def _host_prefix(table: torch.Tensor, num_blocks: int) -> tuple:
    """:func:`_valid_prefix` of a host table, with the common case (every entry in range)
    from one reduction."""
    if table.numel():
        low, high = torch.aminmax(table)
        if int(low) >= 0 and int(high) < num_blocks:
            return (table.shape[1],) * table.shape[0]
    return _valid_prefix(table, num_blocks)


def _valid_prefix(table: torch.Tensor, num_blocks: int) -> tuple:
    """For each row of ``table``, how many of its leading entries lie in [0, num_blocks)
    (one read-back from a device table)."""
    valid = (table >= 0) & (table < num_blocks)
    return tuple(valid.to(torch.int32).cumprod(1).sum(1).tolist())


#: device tables' :func:`_valid_prefix`, by table and cache size
_CHECKED = TensorMemo()


def checked_prefix(table: torch.Tensor, num_blocks: int,
                   memo: TensorMemo = _CHECKED) -> Optional[tuple]:
    """A device ``table``'s :func:`_valid_prefix`: remembered for its contents, or read back
    now; None while a CUDA graph is being captured and none is remembered."""
    prefix = memo.get(table, (num_blocks,))
    if prefix is not None:
        return prefix
    if table.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    prefix = _valid_prefix(table, num_blocks)
    memo.put(table, prefix, (num_blocks,))
    return prefix
