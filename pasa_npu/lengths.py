"""torch_npu's ``actual_seq_lengths`` and ``actual_seq_lengths_kv``, checked and turned into
the per-batch lengths and starts :class:`~pasa_npu.problem.AttentionProblem` takes: per batch
for the padded layouts (1 entry for all, or at least B), cumulative for the packed ones
(TND, NTD), per batch with a block table."""
from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import Optional

import torch

from .arguments import LENGTH_ARGUMENTS, describe
from .options import MAX_PACKED_BATCH
from .paging import DECODE_BLOCK_ALIGN, MAX_BLOCK_SIZE, PREFILL_BLOCK_ALIGN

__all__ = ["LENGTH_ARGUMENTS", "read_device_lengths", "sequence_lengths", "check_block_size",
           "capacity_lengths", "check_ignored", "int_list"]


def read_device_lengths(call, names: tuple[str, ...]):
    """``call`` with its length arguments ``names`` (device tensors) as host lists, read in
    one transfer: the one wait for the device that lengths given on it cost (the plan
    validates them and derives the launches from them)."""
    for name in names:
        _check_integer_tensor(getattr(call, name), name)
    tensors = [getattr(call, name) for name in names]
    flat = torch.cat([t.to(torch.int64) for t in tensors]).tolist()
    given, start = {}, 0
    for name, t in zip(names, tensors):
        given[name], start = flat[start:start + t.numel()], start + t.numel()
    return dataclasses.replace(call, **given)


def capacity_lengths(call, q, s_kv: int, packed: bool, names: tuple[str, ...],
                     block_size: int = 0):
    """:func:`sequence_lengths` of a call whose length arguments ``names`` stay on the device
    (the others None): every batch at its capacity, the query's S1 (T when packed) and
    ``s_kv``, starting at 0; those arguments checked as far as the host can without reading
    them, with the host lengths' rules and messages (their type, which are required, how
    many entries). The block size follows torch_npu's rule for prefill when packed (the
    query lengths are unknown)."""
    for name in names:
        _check_integer_tensor(getattr(call, name), name)
    _require_table_lengths(call, block_size > 0)
    q_given, kv_given = call.actual_seq_lengths, call.actual_seq_lengths_kv
    if packed:
        _require_cumulative(q_given, "actual_seq_lengths")
        batch = q_given.numel()
        if not batch:
            raise ValueError(_EMPTY.format("actual_seq_lengths"))
        if block_size:
            _check_packed_counts(batch, None)
            _check_count("actual_seq_lengths_kv", kv_given.numel(), batch, exact=True)
        else:
            _require_cumulative(kv_given, "actual_seq_lengths_kv")
            _check_packed_counts(batch, kv_given.numel())
    else:
        batch = q.shape[0]
        for name in names:
            _check_count(name, getattr(call, name).numel(), batch)
    if block_size:
        check_block_size(block_size, not packed and q.shape[2] <= 1)
    zeros = _zero_starts(batch)
    return _full_lengths(batch, q.shape[2]), zeros, _full_lengths(batch, s_kv), zeros


def sequence_lengths(call, q, s_kv: int, packed: bool, block_size: int = 0):
    """(q_lens, q_starts, kv_lens, kv_starts) as int64 CPU tensors of length B, from
    ``call``'s length arguments (on the host: :func:`read_device_lengths`). ``s_kv``: the
    kv axis' length, with a block table (``block_size`` > 0) the table's capacity; paged kv
    lengths are per batch, also for packed layouts, as torch_npu takes them with a block
    table, and required; and the block size follows torch_npu's rule for the query length
    (:func:`check_block_size`)."""
    if not block_size:
        return _sequence_lengths(call, q, s_kv, packed)
    lengths = _sequence_lengths(call, q, s_kv, packed, f"block_table's {s_kv // block_size} "
                                f"blocks of block_size {block_size}")
    check_block_size(block_size, (max(lengths[0].tolist(), default=0) if packed
                                  else q.shape[2]) <= 1)
    return lengths


def check_block_size(block_size: int, decode: bool) -> None:
    """torch_npu's block_size rule for the query length (``decode``: S1 = 1)."""
    align = DECODE_BLOCK_ALIGN if decode else PREFILL_BLOCK_ALIGN
    if block_size % align or block_size > MAX_BLOCK_SIZE:
        case = "in decode (S1 = 1)" if decode else "when S1 > 1"
        raise ValueError(f"block_size must be a multiple of {align} up to {MAX_BLOCK_SIZE} "
                         f"{case}, as torch_npu requires; got {block_size}")


def _sequence_lengths(call, q, s_kv: int, packed: bool, table_capacity: Optional[str] = None):
    """:func:`sequence_lengths` of host lengths; ``table_capacity``: with a block table, the
    words for ``s_kv``."""
    paged = table_capacity is not None
    _require_table_lengths(call, paged)
    if packed:
        q_lens, q_starts = _cumulative(call.actual_seq_lengths, "actual_seq_lengths", q.shape[2])
        if paged:
            _check_packed_counts(q_lens.numel(), None)
            kv_lens = _per_batch(call.actual_seq_lengths_kv, "actual_seq_lengths_kv",
                                 q_lens.numel(), s_kv, exact=True, extent=table_capacity)
            return q_lens, q_starts, kv_lens, _zero_starts(q_lens.numel())
        kv_lens, kv_starts = _cumulative(call.actual_seq_lengths_kv, "actual_seq_lengths_kv",
                                         s_kv)
        _check_packed_counts(q_lens.numel(), kv_lens.numel())
        return q_lens, q_starts, kv_lens, kv_starts
    batch = q.shape[0]
    zeros = _zero_starts(batch)
    # decode (S1 = 1, not packed): FIA documents actual_seq_lengths as having no effect
    q_given = call.actual_seq_lengths if q.shape[2] != 1 else None
    return (_per_batch(q_given, "actual_seq_lengths", batch, q.shape[2]), zeros,
            _per_batch(call.actual_seq_lengths_kv, "actual_seq_lengths_kv", batch, s_kv,
                       extent=table_capacity or "the sequence length of the tensor"),
            zeros)


def int_list(value, name: str) -> list[int]:
    """``value``, a list of ints or a 1-D integer host tensor, as a list of ints."""
    if isinstance(value, torch.Tensor):
        _check_integer_tensor(value, name)
        return [int(x) for x in value.tolist()]
    if type(value) in (list, tuple) and all(type(x) is int for x in value):
        return list(value)  # the common case, without ABC checks (a decode step's lengths)
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in value):
        raise TypeError(f"{name} must be a list of ints, got {describe(value)}")
    return [int(x) for x in value]


def check_ignored(value, name: str) -> None:
    """The type of a length argument whose values have no effect (None: none given), as
    torch_npu's schema checks it; a device tensor is not read."""
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        _check_integer_tensor(value, name)
    else:
        int_list(value, name)


def _check_integer_tensor(value: torch.Tensor, name: str) -> None:
    if value.dim() != 1 or value.dtype.is_floating_point or value.dtype == torch.bool:
        raise TypeError(f"{name} must be a list of ints or a 1-D integer tensor, got "
                        f"{describe(value)}")


@functools.lru_cache(maxsize=256)
def _full_lengths(batch: int, full: int) -> torch.Tensor:
    """Shared, never written: every batch at the tensor's full length."""
    return torch.full((batch,), full, dtype=torch.int64)


@functools.lru_cache(maxsize=256)
def _zero_starts(batch: int) -> torch.Tensor:
    return torch.zeros(batch, dtype=torch.int64)


def _per_batch(value, name: str, batch: int, full: int, exact: bool = False,
               extent: str = "the sequence length of the tensor") -> torch.Tensor:
    """Per-batch lengths in [0, full] (``extent`` says what ``full`` is): 1 entry for every
    batch, or the first ``batch`` of at least as many (``exact``: exactly ``batch`` entries,
    the batch of a packed layout)."""
    if value is None:
        return _full_lengths(batch, full)
    lens = int_list(value, name)
    _check_count(name, len(lens), batch, exact)
    lens = lens * batch if len(lens) == 1 else lens[:batch]
    for b, n in enumerate(lens):
        if not 0 <= n <= full:
            raise ValueError(f"{name}[{b}] = {n} is outside [0, {full}] ({extent})")
    return torch.tensor(lens, dtype=torch.int64)


def _check_count(name: str, count: int, batch: int, exact: bool = False) -> None:
    """A per-batch length argument of ``count`` entries: 1 for every batch, or at least
    ``batch`` (``exact``: exactly ``batch``, the sequences of a packed layout)."""
    if exact and count != batch:
        raise ValueError(f"{name} must have one entry per batch ({batch}, the entries of "
                         f"actual_seq_lengths) with block_table, got {count}")
    if count != 1 and count < batch:
        raise ValueError(f"{name} must have 1 or at least batch={batch} entries, got {count}")


def _check_packed_counts(batch: int, kv_count: Optional[int]) -> None:
    """A packed layout's ``batch`` sequences (actual_seq_lengths' entries) within
    torch_npu's limit, and as many cumulative kv lengths (``kv_count``; None: per batch,
    with a block table, :func:`_check_count`)."""
    if batch > MAX_PACKED_BATCH:
        raise ValueError(f"actual_seq_lengths must have at most {MAX_PACKED_BATCH} entries "
                         f"with packed layouts (torch_npu's limit), got {batch}")
    if kv_count is not None and kv_count != batch:
        raise ValueError(f"actual_seq_lengths_kv has {kv_count} entries but "
                         f"actual_seq_lengths has {batch} (packed layouts take the batch "
                         f"from their length)")


def _require_table_lengths(call, paged: bool) -> None:
    if paged and call.actual_seq_lengths_kv is None:
        raise ValueError("actual_seq_lengths_kv is required with block_table (torch_npu's "
                         "page attention): the kv length of each batch")


def _require_cumulative(value, name: str) -> None:
    if value is None:
        raise ValueError(f"{name} is required with packed layouts (TND, NTD): the cumulative "
                         f"sequence lengths, one per batch")


_EMPTY = "{} must not be empty with packed layouts"


def _cumulative(value, name: str, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    _require_cumulative(value, name)
    ends = int_list(value, name)
    if not ends:
        raise ValueError(_EMPTY.format(name))
    prev = 0
    for b, e in enumerate(ends):
        if e < prev:
            raise ValueError(f"{name} must be non-decreasing cumulative lengths starting at >= 0; "
                             f"entry {b} is {e} after {prev}")
        prev = e
    if ends[-1] > total:
        raise ValueError(f"{name} ends at {ends[-1]} but the tensor holds only T={total} tokens")
    ends_t = torch.tensor(ends, dtype=torch.int64)
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), ends_t[:-1]])
    return ends_t - starts, starts
