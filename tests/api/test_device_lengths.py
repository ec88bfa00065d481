"""Lengths given on the device stay there (docs/design.md, "No host synchronisation"): on the
Triton backend, a padded call whose length arguments are device tensors plans at the
capacities and makes its lengths and band on the device, never reading them on the host
(tests/api/test_host_reads.py holds that). Here, under Triton's interpreter with the package
told that no memory is the host's: its results are those of the same lengths given as host
lists, which the golden matrix checks; a length out of its range, or past the block table's
valid entries, gives NaN rows of its batch alone, and no read out of bounds."""
from __future__ import annotations

import warnings

import pytest
import torch

import pasa_npu
from _paged import PAGED_CASES, paged_case
from _support import BACKENDS, interpreted
from test_golden import CASES, MASK_LENGTHS, make_case, shrink
from test_host_reads import _with_tensor_lengths, no_host_memory  # noqa: F401 (the fixture)

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or not interpreted("triton"),
                                reason="needs Triton's interpreter on the CPU")

#: forms with lengths and no explicit mask: decode, causal and band prefill (bottom-right,
#: whose band follows the lengths), ragged dense prefill, packed (TND, NTD) with and without
#: a band, paged decode and prefill, paged packed
FORMS = ("decode-ragged", "right-down-ragged", "band-negative-next", "ragged-dense", "tnd",
         "ntd_tnd", "tnd-mixed-band", "paged decode-bsh-3d", "paged prefill-bnsd-4d-causal",
         "paged tnd-mixed-3d-causal", "paged tnd-mixed-4d-band", "decode-mask",
         "mask4d-empty-rows", "mask4d-mean-rows", "mask-band-mode0")


def _form(name: str):
    if name.startswith("paged "):
        q, k, v, kw, _ = paged_case(PAGED_CASES[name[len("paged "):]], torch.float16)
        if q.shape[2 if kw["input_layout"] == "BNSD" else 1] == 1:
            kw.pop("actual_seq_lengths", None)  # decode ignores them
        return q, k, v, kw
    case = shrink(CASES[name])
    q, k, v, kw = make_case(case, torch.float16)
    if name in MASK_LENGTHS:
        kw.update(MASK_LENGTHS[name](case["S1"], case["S2"]))
    return q, k, v, kw


def _same(got, want):
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
@pytest.mark.parametrize("form", FORMS)
def test_lengths_on_the_device_give_the_host_lengths_results(no_host_memory, form, algorithm):
    q, k, v, kw = _form(form)
    kw = dict(kw, algorithm=algorithm, backend="triton")
    on_device, names = _with_tensor_lengths(kw)
    call = pasa_npu.arguments.bind("fused_attention", q, k, v, on_device)
    assert set(pasa_npu.plans.plan_for(call, False).device_lengths) <= set(names) != set()
    want = pasa_npu.fused_attention(q, k, v, **kw)
    _same(pasa_npu.fused_attention(q, k, v, **on_device), want)
    _same(pasa_npu.plan(q, k, v, **on_device).run(q, k, v), want)


@pytest.mark.parametrize("form,name,bad", [
    ("decode-ragged", "actual_seq_lengths_kv", "past the kv axis"),
    ("decode-ragged", "actual_seq_lengths_kv", "negative"),
    ("right-down-ragged", "actual_seq_lengths", "past the query"),
    ("paged decode-bsh-3d", "actual_seq_lengths_kv", "past the table's entries"),
    ("tnd", "actual_seq_lengths", "past the tokens"),
    ("tnd", "actual_seq_lengths_kv", "before the previous end"),
])
def test_a_length_out_of_range_gives_nan_rows_of_its_batch_alone(no_host_memory, form, name,
                                                                 bad):
    q, k, v, kw = _form(form)
    kw = dict(kw, algorithm="pasa", backend="triton", softmax_lse_flag=True)
    lengths = list(kw[name])
    last = len(lengths) - 1
    if bad == "negative":
        lengths[last] = -1
    elif bad == "past the table's entries":  # the entry after the last batch's blocks is -1
        lengths[last] = lengths[last] + kw["block_size"]
    elif bad == "before the previous end":
        lengths[last] = lengths[last - 1] - 1
    elif bad == "past the tokens":
        lengths[last] = q.shape[0] + 1
    else:
        lengths[last] = (q.shape[2] if name == "actual_seq_lengths" else k.shape[2]) + 1
    on_device, _ = _with_tensor_lengths(dict(kw, **{name: lengths}))
    out, lse = pasa_npu.fused_attention(q, k, v, **on_device)
    want, want_lse = pasa_npu.fused_attention(q, k, v, **kw)
    if kw["input_layout"] == "TND":  # the last sequence's rows, to the end of the tokens
        start = kw["actual_seq_lengths"][last - 1]
        rows, others = slice(start, None), slice(0, start)
    else:
        rows = others = None
    if rows is None:
        assert out[last].isnan().all() and lse[last].isnan().all()
        others = slice(0, last)
    else:
        assert out[rows].isnan().all() and lse[rows].isnan().all()
    _same((out[others], lse[others]), (want[others], want_lse[others]))


@pytest.mark.parametrize("form", ["tnd", "ragged-dense"])
def test_the_overflow_report_of_device_lengths_counts_the_host_lengths_rows(no_host_memory,
                                                                            form):
    """A call whose scores overflow fp16 (a query scaled up) and are repaired: the report of
    the call with device lengths, read when asked for, counts what the host lists' does."""
    q, k, v, kw = _form(form)
    q = q * 300
    kw = dict(kw, algorithm="pasa", backend="triton")
    on_device, _ = _with_tensor_lengths(kw)
    counts = []
    for keywords in (kw, on_device):
        with warnings.catch_warnings():  # the repair's warning: shown once per process
            warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
            pasa_npu.fused_attention(q, k, v, **keywords)
            report = pasa_npu.overflow_report()
            counts.append((report.rows, report.tiles, report.nonfinite_rows))
    assert counts[0][0] > 0 and counts[1] == counts[0], counts


@pytest.mark.parametrize("form", ["decode-ragged", "tnd"])
def test_a_plan_reads_device_lengths_written_after_it_was_made(no_host_memory, form):
    """The lengths tensors a plan (or a repeated call) holds are read at every run: values
    written into them in place give that run the new lengths' results."""
    q, k, v, kw = _form(form)
    kw = dict(kw, algorithm="pasa", backend="triton")
    on_device, names = _with_tensor_lengths(kw)
    plan = pasa_npu.plan(q, k, v, **on_device)
    plan.run(q, k, v)
    name = names[-1]
    new = list(kw[name])
    new[0] = new[0] // 2 if form != "tnd" else new[0] - 3
    on_device[name].copy_(torch.tensor(new))
    want = pasa_npu.fused_attention(q, k, v, **dict(kw, **{name: new}))
    _same(plan.run(q, k, v), want)
    _same(pasa_npu.fused_attention(q, k, v, **on_device), want)


@pytest.mark.parametrize("given", ["int32", "one entry", "more than B", "B over a program"])
def test_the_forms_of_length_tensors(no_host_memory, given):
    """Lengths as int32, one entry for every batch, more entries than batches (the first B
    count), and more batches than one program of the lengths kernel takes."""
    batch = 130 if given == "B over a program" else 3
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(batch, 2, 1, 16, generator=gen).half()
    k, v = (torch.randn(batch, 1, 40, 16, generator=gen).half() for _ in range(2))
    lengths = {"int32": [40, 7, 0], "one entry": [23], "more than B": [9, 40, 1, 33, 2],
               "B over a program": [(7 * b) % 41 for b in range(batch)]}[given]
    kw = dict(num_heads=2, num_key_value_heads=1, input_layout="BNSD", scale=0.25,
              softmax_lse_flag=True, algorithm="pasa", backend="triton",
              actual_seq_lengths_kv=lengths)
    dtype = torch.int32 if given == "int32" else torch.int64
    on_device = dict(kw, actual_seq_lengths_kv=torch.tensor(lengths, dtype=dtype))
    _same(pasa_npu.fused_attention(q, k, v, **on_device), pasa_npu.fused_attention(q, k, v, **kw))


def test_device_lengths_are_checked_as_host_lengths_are(no_host_memory):
    """What the host can check without reading the values, it checks with the host
    lengths' messages: a block table without kv lengths, too few entries, a packed call's
    kv lengths not one per sequence."""
    q, k, v, kw = _form("paged decode-bsh-3d")
    q = q.expand(q.shape[0], 2, q.shape[2]).contiguous()  # a prefill query (S1 = 2)
    kw = dict(kw, algorithm="pasa", backend="triton", actual_seq_lengths=torch.tensor([2]))
    kw.pop("actual_seq_lengths_kv")
    with pytest.raises(ValueError, match="actual_seq_lengths_kv is required with block_table"):
        pasa_npu.fused_attention(q, k, v, **kw)
    q, k, v, kw = _form("decode-ragged")
    kw = dict(kw, algorithm="pasa", backend="triton",
              actual_seq_lengths_kv=torch.tensor([5, 6, 7])[:0])
    with pytest.raises(ValueError, match="must have 1 or at least batch=2 entries, got 0"):
        pasa_npu.fused_attention(q, k, v, **kw)
    q, k, v, kw = _form("tnd")
    kw, _ = _with_tensor_lengths(dict(kw, algorithm="pasa", backend="triton"))
    kw["actual_seq_lengths_kv"] = kw["actual_seq_lengths_kv"][:-1]
    with pytest.raises(ValueError, match="actual_seq_lengths_kv has 2 entries but "
                                         "actual_seq_lengths has 3"):
        pasa_npu.fused_attention(q, k, v, **kw)
