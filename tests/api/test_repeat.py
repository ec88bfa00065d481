"""``plans.repeat``: a plan's later calls go straight to the launches its backend recorded,
with no problem built. Here the torch backend stands in for a recording one: its first
call of a plan keeps the problem, and its ``repeat`` computes a later call's tensors on a
copy of it. Every repeated call must return what the full path returns, bit for bit, in
the caller's layouts, with the call's own overflow report and its block table checked; a call the backend
declines runs the full path."""
from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

import pasa_npu
from pasa_npu import overflow, plans
from pasa_npu.fallback.torch import blockwise
from pasa_npu.problem import OverflowCheck, keeping_nothing
from pasa_npu.tools import bench_host


@contextlib.contextmanager
def recording_torch_backend(accept: bool = True):
    """The torch backend, recording: yields the list of the role sets it was asked to
    repeat on (``accept`` False: it declines every repeat)."""
    run = blockwise.run
    asked = []

    def recording_run(problem):
        run(problem)
        if problem.plan_state is not None:
            problem.plan_state["problem"] = problem

    def repeat(plan_state, tensors):
        asked.append(tuple(sorted(tensors)))
        if not accept:
            return False
        flags = tensors.get("row_flags")
        run(dataclasses.replace(
            plan_state["problem"], query=tensors["query"], key=tensors["key"],
            value=tensors["value"], out=tensors["out"], lse=tensors.get("lse"),
            overflow=None if flags is None else OverflowCheck(flags), sink=tensors.get("sink"),
            block_table=tensors.get("block_table"), plan_state=None))
        return True

    plans.clear()
    blockwise.run, blockwise.repeat = recording_run, repeat
    try:
        yield asked
    finally:
        blockwise.run = run
        del blockwise.repeat
        plans.clear()


def _calls(form: str, algorithm: str, count: int = 3):
    """``count`` calls of a host-bench form on tensors of the same layout, seeded apart."""
    version, q, k, v, keywords = bench_host.forms()[form][0]
    entry = bench_host.entries(version)[0]
    gen = torch.Generator().manual_seed(5)
    lse_flag = "softmax_lse_flag" if version == "v1" else "return_softmax_lse"
    keywords = dict(keywords, algorithm=algorithm, **{lse_flag: True})
    return [(entry, [torch.randn(t.shape, generator=gen).to(t.dtype) for t in (q, k, v)],
             keywords) for _ in range(count)]


@pytest.mark.parametrize("algorithm", ["pasa", "fa-fp32"])
@pytest.mark.parametrize("form", list(bench_host.forms()))
def test_repeated_calls_return_the_full_paths_results(form, algorithm):
    calls = _calls(form, algorithm)
    want = [entry(*tensors, **keywords) for entry, tensors, keywords in calls]
    with recording_torch_backend() as asked:
        got = [entry(*tensors, **keywords) for entry, tensors, keywords in calls]
    assert len(asked) == len(calls) - 1, form  # the first call records; the later repeat
    for (out, lse), (out_want, lse_want) in zip(got, want):
        assert out.shape == out_want.shape and out.stride() == out_want.stride()
        assert torch.equal(out, out_want) and torch.equal(lse, lse_want), form
    roles = set(asked[0])
    assert {"query", "key", "value", "out"} <= roles
    assert ("row_flags" in roles) == (algorithm == "pasa")
    assert ("sink" in roles) == ("learnable_sink" in calls[0][2])
    assert ("block_table" in roles) == ("block_table" in calls[0][2])


def test_a_repeated_paged_call_checks_its_table():
    (entry, tensors, keywords), *_ = _calls("paged decode BSH", "pasa")
    table = keywords["block_table"]
    bad = table.clone()
    bad[0, 1] = 9  # the cache holds 4 blocks, and batch 0's keys reach into its second
    with recording_torch_backend() as asked:
        entry(*tensors, **keywords)
        entry(*tensors, **keywords)
        with pytest.raises(ValueError, match="block_table"):
            entry(*tensors, **dict(keywords, block_table=bad))
    assert len(asked) == 1


def test_a_repeated_call_reports_its_own_overflow():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 64, generator=gen).half() for _ in range(3))
    big = (torch.randn(1, 2, 64, 64, generator=gen) * 100).half()
    kw = dict(num_heads=2, input_layout="BNSD", scale=1.0, algorithm="pasa")
    with recording_torch_backend() as asked:
        pasa_npu.fused_attention(q, k, v, **kw)
        pasa_npu.fused_attention(q, k, v, **kw)
        assert pasa_npu.overflow_report().checked and pasa_npu.overflow_report().rows == 0
        with pytest.warns(overflow.OverflowRepairWarning) if not overflow._WARNED[0] \
                else contextlib.nullcontext():
            out, _ = pasa_npu.fused_attention(big, big, v, **kw)
        assert len(asked) == 2
        assert pasa_npu.overflow_report().rows > 0
    want, _ = pasa_npu.fused_attention(big, big, v, **kw)
    assert torch.equal(out, want) and bool(torch.isfinite(out).all())


def test_declined_and_keep_nothing_calls_take_the_full_path():
    calls = _calls("prefill BNSD", "pasa")
    want = [entry(*tensors, **keywords)[0] for entry, tensors, keywords in calls]
    with recording_torch_backend(accept=False) as asked:
        got = [entry(*tensors, **keywords)[0] for entry, tensors, keywords in calls]
    assert len(asked) == 2 and all(torch.equal(a, b) for a, b in zip(got, want))
    with recording_torch_backend() as asked:
        entry, tensors, keywords = calls[0]
        entry(*tensors, **keywords)
        with keeping_nothing():
            got = entry(*calls[1][1], **keywords)[0]
        assert not asked and torch.equal(got, want[1])


def test_plans_of_other_lengths_repeat_with_their_own_rows():
    """A plan for other query lengths of the same arguments is a copy of the first one's;
    what a plan's first repeat makes for its later ones is its own. So a copy whose rows
    past the lengths no kernel writes hands its repeats a zero-filled output (the stand-in
    backend writes every row, so the test reads the output as the backend receives it,
    NaN where memory freed just before was reused and not zeroed)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 64, 32, generator=gen).half() for _ in range(3))
    kw = dict(num_heads=2, input_layout="BNSD", algorithm="pasa")
    received = []
    with recording_torch_backend() as asked:
        repeat = blockwise.repeat

        def receiving(plan_state, tensors):
            received.append(tensors["out"].clone())
            return repeat(plan_state, tensors)
        blockwise.repeat = receiving
        plans.clear()
        for lengths in ([64], [64], [64], [40], [40], [40]):
            torch.full((1, 2, 64, 32), float("nan"), dtype=torch.half).add_(1)
            out, _ = pasa_npu.fused_attention(q, k, v, actual_seq_lengths=lengths, **kw)
            assert torch.equal(out[:, :, lengths[0]:], torch.zeros_like(out[:, :, lengths[0]:]))
        assert len(asked) == 4  # each plan's first call records, its later ones repeat
    assert len(received) == 4
    for out in received[2:]:  # the 40-row plan's repeats
        assert torch.equal(out[:, :, 40:], torch.zeros_like(out[:, :, 40:]))
