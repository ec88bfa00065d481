"""Overflow detection and repair (docs/design.md, "Overflow detection and repair").

The PASA allocations keep their scores and statistics in fp16. Where the scores' spread
within a block exceeds fp16 (the shift removes a block's mean, not its spread), where P'V
exceeds it (pasa's fp16 accumulator, pasa-exact's fp16 P'V tile), or an input is NaN or
infinite, a query row's result is not finite. Where a block's shifted scores, or the bias
the pseudo-average shift recovers from the block's mean, reach
:data:`~pasa_npu.numerics.RESOLUTION_LIMIT`, fp16 cannot resolve the row's softmax: its
result is finite and wrong. Every backend checks its own results for both: it writes a
flag per query row into :attr:`OverflowCheck.row_flags` and recomputes the flagged rows
by the ``fa-fp32`` path (fp32 scores and statistics) before it returns, without a host
synchronisation. The flags tell :func:`overflow_report` what
happened in the last call.
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from .arguments import caller_stacklevel
from .numerics import RESOLUTION_LIMIT
# the check's contract with the backends lives in problem.py; re-exported here
from .problem import (ROW_FLAGGED, ROW_NONFINITE, ROW_OK, ROW_REPAIRED,  # noqa: F401
                      AttentionProblem, OverflowCheck, fp32_problem, host_memory)

class OverflowRepairWarning(RuntimeWarning):
    """Some query rows of a PASA call overflowed fp16, or lost the resolution of their
    softmax in it, and were recomputed in fp32."""


@dataclass
class OverflowReport:
    """What the overflow check of the last :func:`pasa_npu.fused_attention` call found.

    ``checked``: whether its results were checked: True for the PASA allocations unless
    the call passed ``repair_overflow=False``; fa-* allocations are never checked.
    ``rows``: query rows (of one query head each) recomputed by fa-fp32; ``tiles``: the
    (batch, query head, ``q_block`` rows) tiles holding them; ``nonfinite_rows``: those of
    them still NaN or infinite after the repair, whose inputs hold NaN or inf (fa-fp32
    gives the same rows).

    The counts are read from the call's row flags when the report is asked for: on a GPU
    that waits for the device to finish the call (the call itself never waits), and reads
    the flags as they are then (under a CUDA graph, the latest replay's). The first report
    that finds a repaired row issues an :class:`OverflowRepairWarning`, once per process.
    Under torch.compile the flags are an output of the compiled graph
    (:func:`record_compiled`); with ``mode="reduce-overhead"`` read a report before the
    next call replays its graph, which overwrites them.
    """

    algorithm: Optional[str] = None
    backend: Optional[str] = None
    checked: bool = False
    check: Optional[OverflowCheck] = dataclasses.field(default=None, repr=False)
    layout: Optional[tuple] = dataclasses.field(default=None, repr=False)  # see _count
    _counts: Optional[tuple[int, int, int]] = dataclasses.field(default=None, repr=False)

    @property
    def rows(self) -> int:
        return self._read()[0]

    @property
    def tiles(self) -> int:
        return self._read()[1]

    @property
    def nonfinite_rows(self) -> int:
        return self._read()[2]

    def __str__(self) -> str:
        if not self.checked:
            return f"pasa_npu.overflow_report(): {self.algorithm or 'no call'}: not checked"
        return (f"pasa_npu.overflow_report(): {self.algorithm} on {self.backend}: {self.rows} "
                f"rows in {self.tiles} tiles recomputed by fa-fp32, {self.nonfinite_rows} of "
                f"them non-finite inputs")

    def _read(self) -> tuple[int, int, int]:
        if self._counts is None:
            self._counts = (0, 0, 0) if not self.checked else _count(self.check.row_flags,
                                                                       *self.layout)
            self.check = None  # the counts are all the report keeps of the call
            if self._counts[0]:
                _warn_once(self)
        return self._counts


_LAST = OverflowReport()
_WARNED = [False]
#: how to make the report of a call newer than ``_LAST`` (a function and its arguments),
#: made when asked for, so that a call that nobody asks about pays for no report; or None
_NEWER: list = [None]


def overflow_report() -> OverflowReport:
    """The :class:`OverflowReport` of the last :func:`pasa_npu.fused_attention` call in this
    process, its counts read now (a later call of the same plan reuses its row flags)."""
    global _LAST
    if _NEWER[0] is not None:
        make, arguments = _NEWER[0]
        _LAST = make(*arguments)
        _NEWER[0] = None
        _LAST._read()
    return _LAST


class CompiledCall(NamedTuple):
    """What the report of a call under torch.compile needs, resolved at trace time:
    the allocation's name, the ``backend`` argument, whether the layout is packed, the
    query tile and the cumulative query lengths as given (a list, a tensor or None)."""

    algorithm: str
    backend: str
    packed: bool
    q_block: int
    q_ends: object


def record_compiled(row_flags: torch.Tensor, call: CompiledCall) -> None:
    """Under torch.compile: the call that just ran is the latest; ``row_flags`` are its
    operator's (zero where no row was flagged or computed, empty where the call was not
    checked). Traced into the compiled code: it only keeps them, and the report is made
    from them when asked for."""
    _NEWER[0] = (_compiled_report, (row_flags, call))


def _compiled_report(row_flags: torch.Tensor, call: CompiledCall) -> OverflowReport:
    """The report of a compiled call from its operator's row flags. Rows of no sequence
    read 0, so the layout is the flags' own: every row of each batch, or for a packed
    layout the sequences its cumulative query lengths delimit (a tensor of them is read
    here, when the report is asked for)."""
    from .backends import resolve

    backend = resolve(call.backend, row_flags.device).name
    if row_flags.numel() == 0:
        return OverflowReport(call.algorithm, backend, False)
    batches, rows = row_flags.shape[0], row_flags.shape[2]
    if call.packed:
        layout = (None, call.q_ends if call.q_ends is not None else [rows], True, call.q_block)
    else:
        layout = (torch.zeros(batches, dtype=torch.int64), torch.full((batches,), rows),
                  False, call.q_block)
    return OverflowReport(call.algorithm, backend, True, OverflowCheck(row_flags), layout)


def record(problem: AttentionProblem, backend: str) -> None:
    """Make the report of the call that just ran ``problem`` on ``backend`` the latest;
    where its flags are on the CPU, count them now (and warn, once)."""
    layout = (problem.q_starts, problem.q_lens, problem.packed, problem.tiling.q_block)
    if problem.packed and problem.device_lengths is not None:
        layout = (None, problem.device_lengths.q_lens, True, problem.tiling.q_block)
    record_check(problem.allocation.name, backend, problem.overflow, layout)


def record_check(algorithm: str, backend: str, check: Optional[OverflowCheck],
                 layout: tuple) -> None:
    """:func:`record` from its parts: ``check`` None where the call was not checked;
    ``layout`` (q_starts, q_lens, packed, q_block), see :func:`_count`."""
    _NEWER[0] = pending_check(algorithm, backend, check, layout)
    if check is not None and host_memory(check.row_flags.device):
        overflow_report()._read()


def pending_check(algorithm: str, backend: str, check: Optional[OverflowCheck],
                  layout: tuple) -> tuple:
    """What :func:`record_check` makes the latest report, for :func:`record_pending`."""
    return OverflowReport, (algorithm, backend, check is not None, check, layout)


def record_pending(pending: tuple) -> None:
    """:func:`record_check` of a check whose flags are on a device (or of no check), made
    once by :func:`pending_check` for the many calls that share it."""
    _NEWER[0] = pending


def record_unchecked(algorithm: str, backend: str) -> None:
    _NEWER[0] = (OverflowReport, (algorithm, backend, False))


def _count(flags: torch.Tensor, q_starts, q_lens, packed: bool,
           q_block: int) -> tuple[int, int, int]:
    """(repaired rows, tiles holding them, rows still non-finite) over the rows inside
    the query lengths (``q_starts`` None: ``q_lens`` are a packed call's cumulative query
    lengths as given, a list or a tensor, read here). One reduction where no flag anywhere
    reads repaired (the common case: CPU flags are zero-filled, so rows outside the
    lengths read 0 there)."""
    flags = flags.cpu()
    if flags.numel() == 0 or int(flags.max()) < ROW_REPAIRED:
        return 0, 0, 0
    if q_starts is None:
        ends = q_lens.tolist() if isinstance(q_lens, torch.Tensor) else list(q_lens)
        starts = [0, *ends[:-1]]
        q_starts = torch.tensor(starts)
        q_lens = torch.tensor([max(0, e - s) for s, e in zip(starts, ends)])
    rows = tiles = nonfinite = 0
    for b, (start, n) in enumerate(zip(q_starts.tolist(), q_lens.tolist())):
        seg = flags[0 if packed else b, :, start:start + n]  # (Nq, n)
        repaired = seg >= ROW_REPAIRED
        rows += int(repaired.sum())
        nonfinite += int((seg == ROW_NONFINITE).sum())
        pad = -n % q_block
        per_tile = torch.nn.functional.pad(repaired, (0, pad)).view(seg.shape[0], -1, q_block)
        tiles += int(per_tile.any(-1).sum())
    return rows, tiles, nonfinite


def _warn_once(report: OverflowReport) -> None:
    if _WARNED[0]:
        return
    _WARNED[0] = True
    rows, tiles, nonfinite = report._counts
    overflowed = rows - nonfinite
    parts = []
    if overflowed:
        parts.append(
            f"{overflowed} query rows of a {report.algorithm} call were recomputed with fp32 "
            f"scores (fa-fp32): in fp16 they were not finite (the scores' spread within a kv "
            f"block, or P'V with large values, exceeds fp16's range) or their shifted scores, "
            f"or the bias the pseudo-average shift recovers from a block's mean, reached "
            f"{RESOLUTION_LIMIT:g}, where fp16 cannot resolve the softmax. A smaller `scale` "
            f"(for the scores), algorithm='pasa-exact' (for a bias that queries and keys "
            f"share), 'pasa-mixed' (for the values) or 'fa-fp32' for such inputs avoids the "
            f"repair.")
    if nonfinite:
        parts.append(f"{nonfinite} query rows stay NaN or infinite: their inputs hold NaN or "
                     f"inf (fa-fp32 gives the same rows).")
    warnings.warn(f"pasa_npu: {' '.join(parts)} ({tiles} tiles in all; shown once, "
                  f"pasa_npu.overflow_report() describes each call)", OverflowRepairWarning,
                  stacklevel=caller_stacklevel())
