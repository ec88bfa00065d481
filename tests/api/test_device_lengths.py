"""Lengths given on the device stay there (docs/design.md, "No host synchronisation"): on the
Triton backend, a padded call whose length arguments are device tensors plans at the
capacities and makes its lengths and band on the device, never reading them on the host
(tests/api/test_host_reads.py holds that). Here, under Triton's interpreter with the package
told that no memory is the host's: its results are those of the same lengths given as host
lists, which the golden matrix checks; a length out of its range, or past the block table's
valid entries, gives NaN rows of its batch alone, and no read out of bounds."""
from __future__ import annotations

import pytest
import torch

import pasa_npu
from _paged import PAGED_CASES, paged_case
from _support import BACKENDS, interpreted
from test_golden import CASES, make_case, shrink
from test_host_reads import _with_tensor_lengths, no_host_memory  # noqa: F401 (the fixture)

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or not interpreted("triton"),
                                reason="needs Triton's interpreter on the CPU")

#: padded forms with lengths: decode, causal and band prefill (bottom-right, whose band
#: follows the lengths), ragged dense prefill, paged decode and paged causal prefill
FORMS = ("decode-ragged", "right-down-ragged", "band-negative-next", "ragged-dense",
         "paged decode-bsh-3d", "paged prefill-bnsd-4d-causal")


def _form(name: str):
    if name.startswith("paged "):
        q, k, v, kw, _ = paged_case(PAGED_CASES[name[len("paged "):]], torch.float16)
        if q.shape[2 if kw["input_layout"] == "BNSD" else 1] == 1:
            kw.pop("actual_seq_lengths", None)  # decode ignores them
        return q, k, v, kw
    return make_case(shrink(CASES[name]), torch.float16)


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
    _same(pasa_npu.fused_attention(q, k, v, **on_device), pasa_npu.fused_attention(q, k, v, **kw))
    plan = pasa_npu.plan(q, k, v, **on_device)
    _same(plan.run(q, k, v), pasa_npu.fused_attention(q, k, v, **kw))


@pytest.mark.parametrize("form,name,bad", [
    ("decode-ragged", "actual_seq_lengths_kv", "past the kv axis"),
    ("decode-ragged", "actual_seq_lengths_kv", "negative"),
    ("right-down-ragged", "actual_seq_lengths", "past the query"),
    ("paged decode-bsh-3d", "actual_seq_lengths_kv", "past the table's entries"),
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
    else:
        lengths[last] = (q.shape[2] if name == "actual_seq_lengths" else k.shape[2]) + 1
    on_device, _ = _with_tensor_lengths(dict(kw, **{name: lengths}))
    out, lse = pasa_npu.fused_attention(q, k, v, **on_device)
    want, want_lse = pasa_npu.fused_attention(q, k, v, **kw)
    layout = kw["input_layout"]
    batch_axis = 0
    assert layout in ("BNSD", "BSH", "BSND"), layout
    assert out.select(batch_axis, last).isnan().all() and lse[last].isnan().all()
    others = slice(0, last)
    _same((out[others], lse[others]), (want[others], want_lse[others]))
