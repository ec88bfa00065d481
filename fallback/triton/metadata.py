"""The Triton kernels' per-batch metadata on the device: lengths and band limits as int32
rows of one tensor, copied once per distinct set of values (:func:`device_metadata`), and
the host ints they come from (:func:`host_ints`)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from pasa_npu.problem import AttentionProblem, keeps_device_tensors

INT_BIG = 1 << 30  # stands for "no band limit" (index math is int32)

_HOST_INTS: dict = {}
_DEVICE_METADATA: dict = {}
_CAPTURED_METADATA: dict = {}  # read by captured CUDA graphs: never freed
_CAPTURED_SOURCES: dict = {}  # pinned sources of the copies captured in calls that keep nothing


def host_ints(values: torch.Tensor) -> tuple[int, ...]:
    """Small per-batch metadata (lengths, band limits) as Python ints, cached by identity:
    the API layer reuses its length tensors across calls with the same arguments and never
    writes them."""
    hit = _HOST_INTS.get(id(values))
    if hit is not None and hit[0] is values:
        return hit[1]
    if len(_HOST_INTS) > 512:
        _HOST_INTS.clear()
    ints = tuple(values.tolist())
    _HOST_INTS[id(values)] = (values, ints)
    return ints


def device_metadata(problem: AttentionProblem, device: torch.device) -> tuple:
    """(q_starts, q_lens, kv_starts, kv_lens, band_pre, band_next) as int32 rows of one
    tensor on ``device`` (the band rows repeat q_lens when there is no band; band limits
    are clamped to +-INT_BIG).

    Cached by value: a repeated call copies nothing. New values (a decode step whose
    lengths grew) are copied from pinned memory without blocking, so the host never waits
    for the work queued on the stream, as a pageable copy would make it. Another stream
    that reuses the copy waits for it on the GPU. While a CUDA graph is being captured the
    copy is captured; an entry a graph reads, and the pinned source of a captured copy, are
    kept for good. A call that keeps nothing (:func:`~pasa_npu.problem.keeping_nothing`)
    gets a copy of its own, from a pinned source kept for good where it is captured."""
    rows = [host_ints(t) for t in (problem.q_starts, problem.q_lens, problem.kv_starts,
                                    problem.kv_lens)]
    if problem.band is not None:
        rows += [tuple(max(-INT_BIG, min(INT_BIG, x)) for x in host_ints(t))
                 for t in problem.band]
    else:
        rows += [rows[1], rows[1]]
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device, tuple(rows))
    capturing = cuda and torch.cuda.is_current_stream_capturing()
    # the raw handle Triton launches on: a cheap query, unlike torch.cuda.current_stream
    stream = torch._C._cuda_getCurrentRawStream(device.index) if cuda else None
    if not keeps_device_tensors():
        source = _CAPTURED_SOURCES.get(key)
        if source is None:
            _check_int32(rows)
            source = torch.tensor(rows, dtype=torch.int32, pin_memory=cuda)
            if capturing:
                _CAPTURED_SOURCES[key] = source
        return source.to(device, non_blocking=True).unbind(0)
    entry = _DEVICE_METADATA.get(key) or _CAPTURED_METADATA.get(key)
    if entry is None:
        _check_int32(rows)
        if len(_DEVICE_METADATA) > 512:
            _DEVICE_METADATA.clear()
        host = torch.tensor(rows, dtype=torch.int32, pin_memory=cuda)
        copy = host.to(device, non_blocking=True)
        copied = None
        if cuda and not capturing:
            copied = torch.cuda.Event()
            copied.record()
        entry = _DEVICE_METADATA[key] = _Metadata(copy.unbind(0), copy, stream, copied,
                                                  host if capturing else None)
    elif cuda and stream != entry.stream and not capturing:
        # (a capture starts after a device synchronisation: the copy is complete then)
        current = torch.cuda.current_stream(device)
        if entry.copied is not None:
            current.wait_event(entry.copied)
        entry.tensor.record_stream(current)  # not reused while this stream may read it
    if capturing:
        _CAPTURED_METADATA[key] = entry
    return entry.rows


def _check_int32(rows: list) -> None:
    if max((max(row, default=0) for row in rows[:4]), default=0) > INT_BIG:  # all >= 0
        raise NotImplementedError(f"the Triton backend indexes in int32; got lengths "
                                  f"{[list(r) for r in rows[:4]]}")


class _Metadata(NamedTuple):
    rows: tuple            # the six int32 rows: views of ``tensor``
    tensor: torch.Tensor   # on the device
    stream: object         # the raw handle of the stream the copy was issued on
    copied: object         # an event after the copy (None where there is no CUDA stream)
    pinned_source: object  # the host tensor a captured copy reads on every replay
