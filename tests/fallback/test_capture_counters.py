"""The counters handed to calls under CUDA graph capture (``fallback/capture_counters.py``),
their bookkeeping on the CPU with the capture identified by hand: every counter handed out
is zero, a capture's calls share its arena, another capture or stream never shares one, a
counter once in an arena never returns to the reserve, and a short reserve or an
unidentified capture hands out nothing (the caller then fills its own). On a GPU,
tests/fallback/triton/test_triton_host.py captures real calls."""
from __future__ import annotations

import pytest
import torch

from pasa_npu.fallback import capture_counters

CPU = torch.device("cpu")


@pytest.fixture
def counters(monkeypatch):
    """capture_counters with empty state and the capture key set by the test."""
    monkeypatch.setattr(capture_counters, "_RESERVES", {})
    monkeypatch.setattr(capture_counters, "_ARENAS", type(capture_counters._ARENAS)())
    monkeypatch.setattr(capture_counters, "_KEPT", [])
    key = {"now": (CPU, 1, 7)}
    monkeypatch.setattr(capture_counters, "_capture_key", lambda device: key["now"])
    return key


def _span(t: torch.Tensor) -> range:
    return range(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())


def _disjoint(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, sb = _span(a), _span(b)
    return sa.stop <= sb.start or sb.stop <= sa.start


def test_arenas_are_zero_shared_within_a_capture_and_disjoint_across(counters, monkeypatch):
    monkeypatch.setattr(capture_counters, "RESERVE_COUNTERS", 64)
    assert capture_counters.arena(CPU, 8) is None  # no reserve yet
    capture_counters.top_up(CPU, 8)
    first = capture_counters.arena(CPU, 8)
    assert first.numel() == 8 and first.dtype == torch.int32 and not first.any()
    assert capture_counters.arena(CPU, 5) is first  # a later call of the same capture
    wider = capture_counters.arena(CPU, 12)  # a call that needs more: a new arena
    assert wider.numel() == 12 and _disjoint(wider, first)
    assert capture_counters.arena(CPU, 12) is wider
    counters["now"] = (CPU, 1, 9)  # another stream of the same capture
    other_stream = capture_counters.arena(CPU, 8)
    counters["now"] = (CPU, 2, 7)  # another capture on the first stream
    other_capture = capture_counters.arena(CPU, 8)
    taken = [first, wider, other_stream, other_capture]
    assert all(_disjoint(a, b) for i, a in enumerate(taken) for b in taken[i + 1:])
    assert not any(t.any() for t in taken)


def test_a_short_reserve_or_an_unknown_capture_hands_out_nothing(counters, monkeypatch):
    monkeypatch.setattr(capture_counters, "RESERVE_COUNTERS", 16)
    capture_counters.top_up(CPU, 2)  # 16 counters
    assert capture_counters.arena(CPU, 10) is not None
    counters["now"] = (CPU, 2, 7)
    assert capture_counters.arena(CPU, 10) is None  # 6 left
    assert capture_counters.arena(CPU, 6) is not None
    counters["now"] = (CPU, 3, 7)
    assert capture_counters.arena(CPU, 1) is None  # none left
    capture_counters.top_up(CPU, 2)  # a call outside capture: a new chunk
    assert capture_counters.arena(CPU, 1) is not None
    counters["now"] = None  # the driver named no capture
    assert capture_counters.arena(CPU, 1) is None


def test_top_up_keeps_four_calls_worth_and_every_chunk(counters, monkeypatch):
    monkeypatch.setattr(capture_counters, "RESERVE_COUNTERS", 16)
    capture_counters.top_up(CPU, 100)
    chunk, start = capture_counters._RESERVES[CPU]
    assert chunk.numel() == 400 and start == 0
    capture_counters.top_up(CPU, 100)  # enough left: nothing made
    assert capture_counters._RESERVES[CPU][0] is chunk
    assert capture_counters.arena(CPU, 350) is not None
    capture_counters.top_up(CPU, 100)  # 50 left: a new chunk; the old one is kept
    assert capture_counters._RESERVES[CPU][0] is not chunk
    assert [c.numel() for c in capture_counters._KEPT] == [400, 400]
