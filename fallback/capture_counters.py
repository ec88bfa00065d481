"""Zeroed int32 counters for the GPU kernels of a call made under CUDA graph capture, so
that the captured graph holds no fill of its own for them.

The kernels leave their counters zeroed when they finish (each resets its own after its
last use), so counters that are zero when a graph is first replayed stay so for every
replay. A call not under capture keeps a reserve per device, zero-filled on its stream
before any capture that could take from it (``torch.cuda.graph`` synchronises the device
when a capture begins). Under capture, each capture sequence and capturing stream has an
arena cut from that reserve: the calls captured one after another on that stream take its
counters from its start, disjoint within one call; calls on another stream or in another
capture take other counters, so graphs replayed side by side never share one. Arenas are
kept for good: a captured graph may be replayed for as long as it lives. Where the capture
cannot be identified or the reserve is short, the caller fills its own counters, and the
graph holds that fill."""
from __future__ import annotations

import collections
import ctypes
import functools
import threading
from typing import Optional

import torch

#: counters a device's reserve is topped up to, at least, by a call not under capture
RESERVE_COUNTERS = 1 << 14

_LOCK = threading.Lock()
_RESERVES: dict = {}  # device -> [zeroed chunk, index of its first counter not handed out]
#: (device, capture id, stream handle) -> its arena (a slice of a reserve), the latest
#: captures' only: an arena dropped here stays in its chunk, for the graphs that hold it
_ARENAS: collections.OrderedDict = collections.OrderedDict()
_ARENAS_HELD = 64
_KEPT: list = []  # every chunk made: a captured graph may hold slices of any of them


def top_up(device: torch.device, need: int) -> None:
    """Outside a capture: ``device`` keeps at least ``max(RESERVE_COUNTERS, 4 * need)``
    zeroed counters that no capture has taken (``need``: counters one call takes)."""
    want = max(RESERVE_COUNTERS, 4 * need)
    with _LOCK:
        reserve = _RESERVES.get(device)
        if reserve is not None and reserve[0].numel() - reserve[1] >= want:
            return
        chunk = torch.zeros(want, dtype=torch.int32, device=device)
        _KEPT.append(chunk)
        _RESERVES[device] = [chunk, 0]


def arena(device: torch.device, need: int) -> Optional[torch.Tensor]:
    """Under capture: the zeroed counters (at least ``need``) of the current capture
    sequence and stream on ``device``; None where the capture cannot be identified or the
    reserve holds too few."""
    key = _capture_key(device)
    if key is None:
        return None
    with _LOCK:
        held = _ARENAS.get(key)
        if held is not None and held.numel() >= need:
            return held
        reserve = _RESERVES.get(device)
        if reserve is None or reserve[0].numel() - reserve[1] < need:
            return None
        chunk, start = reserve
        reserve[1] = start + need
        made = _ARENAS[key] = chunk[start:start + need]
        if len(_ARENAS) > _ARENAS_HELD:
            _ARENAS.popitem(last=False)
        return made


def _capture_key(device: torch.device) -> Optional[tuple]:
    """(device, capture id, stream handle) of the capture on ``device``'s current stream;
    None where the driver does not identify one."""
    stream = torch.cuda.current_stream(device).cuda_stream
    capture = _capture_id(stream)
    return None if capture is None else (device, capture, stream)


def _capture_id(stream: int) -> Optional[int]:
    """The id of the capture sequence active on CUDA stream ``stream`` (the driver's
    ``cuStreamGetCaptureInfo``); None where none is, or the driver does not say."""
    query = _capture_info()
    if query is None:
        return None
    status, capture = ctypes.c_int(0), ctypes.c_uint64(0)
    if query(ctypes.c_void_p(stream), ctypes.byref(status), ctypes.byref(capture),
             None, None, None) != 0 or status.value != 1:  # 1: CU_STREAM_CAPTURE_STATUS_ACTIVE
        return None
    return capture.value


@functools.lru_cache(maxsize=None)
def _capture_info():
    """The driver's ``cuStreamGetCaptureInfo_v2``, or None where it cannot be loaded."""
    try:
        query = ctypes.CDLL("libcuda.so.1").cuStreamGetCaptureInfo_v2
    except (OSError, AttributeError):
        return None
    query.restype = ctypes.c_int
    query.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int),
                      ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_void_p,
                      ctypes.c_void_p]
    return query
