"""``pasa_npu.plan``: a call validated once, then run on new tensors. Each run computes
what ``fused_attention`` computes on those tensors, bit for bit, for every argument form;
tensors of another layout are validated in full again; bad arguments fail at plan time;
a run traces under torch.compile as the eager call's operator."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

import pasa_npu
from pasa_npu.tools import bench_host


def _fresh(call):
    """The form's call on new tensors of the same layout (seeded apart from the planned)."""
    version, q, k, v, keywords = call
    gen = torch.Generator().manual_seed(99)
    new = [torch.randn(t.shape, generator=gen).half() for t in (q, k, v)]
    return version, *new, keywords


@pytest.mark.parametrize("form", list(bench_host.forms()))
@pytest.mark.parametrize("algorithm", ["pasa", "fa-fp32"])
def test_a_run_computes_the_eager_call_on_its_tensors(form, algorithm):
    call, _ = bench_host.forms()[form]
    version, q, k, v, keywords = call
    keywords = dict(keywords, algorithm=algorithm)
    eager, plan = bench_host.entries(version)
    planned = plan(q, k, v, **keywords)
    _, q2, k2, v2, _ = _fresh(call)
    for tensors in ((q, k, v), (q2, k2, v2)):
        got, want = planned.run(*tensors), eager(*tensors, **keywords)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), form
    assert not torch.equal(planned(q, k, v)[0], planned(q2, k2, v2)[0])


def test_tensors_of_another_layout_are_validated_again():
    q, k, v = (torch.randn(2, n, 64, 32).half() for n in (4, 2, 2))
    planned = pasa_npu.plan(q, k, v, num_heads=4, num_key_value_heads=2, input_layout="BNSD")
    longer = torch.randn(2, 2, 80, 32).half()
    got = planned.run(q, longer, longer)  # another key length: a new, valid call
    want = pasa_npu.fused_attention(q, longer, longer, num_heads=4, num_key_value_heads=2,
                                    input_layout="BNSD")
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(ValueError, match="key batch 3 differs from query batch 2"):
        planned.run(q, torch.randn(3, 2, 64, 32).half(), torch.randn(3, 2, 64, 32).half())
    with pytest.raises(TypeError, match="query"):
        planned.run(q.numpy(), k, v)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.uint8])
def test_a_run_reads_the_masks_contents_as_they_are_then(dtype):
    """A mask edited in place between runs: every run computes the eager call with the mask
    as it is then, whatever its dtype (a bool mask the plan holds, another it converts)."""
    q, k, v = (torch.randn(1, 2, 16, 32, generator=torch.Generator().manual_seed(n)).half()
               for n in range(3))
    mask = torch.zeros(16, 16, dtype=dtype)
    keywords = dict(num_heads=2, input_layout="BNSD", atten_mask=mask, backend="torch")
    planned = pasa_npu.plan(q, k, v, **keywords)
    before = planned.run(q, k, v)[0]
    mask[:, :8] = 1
    after = planned.run(q, k, v)[0]
    assert not torch.equal(before, after)
    assert torch.equal(after, pasa_npu.fused_attention(q, k, v, **keywords)[0])


def test_bad_arguments_fail_when_planned():
    q, k, v = (torch.randn(1, 4, 16, 32).half() for _ in range(3))
    with pytest.raises(ValueError, match="input_layout"):
        pasa_npu.plan(q, k, v, num_heads=4, input_layout="BXYZ")
    with pytest.raises(TypeError, match="unexpected keyword argument 'heads'"):
        pasa_npu.plan(q, k, v, heads=4)


def test_a_run_traces_as_the_eager_calls_operator():
    q, k, v = (torch.randn(1, 4, 16, 32).half() for _ in range(3))
    planned = pasa_npu.plan(q, k, v, num_heads=4, input_layout="BNSD", algorithm="pasa")
    compiled = torch.compile(lambda a, b, c: planned.run(a, b, c)[0], backend="eager",
                             fullgraph=True)
    q2 = torch.randn(1, 4, 16, 32).half()
    assert torch.equal(compiled(q2, k, v), pasa_npu.fused_attention(
        q2, k, v, num_heads=4, input_layout="BNSD", algorithm="pasa")[0])


def _masked_case():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 12, 16, generator=gen).half() for _ in range(3))
    return q, k, v, dict(num_heads=2, input_layout="BNSD", backend="torch",
                         softmax_lse_flag=True)


def _assert_golden(got, q, k, v, keywords):
    keywords = {n: x for n, x in keywords.items() if n not in pasa_npu.arguments.OWN_KEYWORDS}
    want = pasa_npu.reference_attention(q, k, v, **keywords)
    torch.testing.assert_close(got[0].double(), want[0], atol=2e-3, rtol=0)
    torch.testing.assert_close(got[1].double(), want[1], atol=2e-3, rtol=0)


def test_masks_made_under_inference_mode():
    """Inference tensors have no version counter: calls with an explicit mask made so read
    its contents on every call (a serving loop's tensors are often made so); an optimized
    mask made so is checked once (tests/api/test_host_reads.py)."""
    q, k, v, keywords = _masked_case()
    with torch.inference_mode():
        full = torch.zeros(12, 12, dtype=torch.bool)
        full[3] = True
        causal = pasa_npu.compressed_causal_mask()
        frozen = torch.ones(2048, 2048, dtype=torch.bool).triu(1)  # checked once
        for kw in (dict(keywords, atten_mask=full),
                   dict(keywords, atten_mask=causal, sparse_mode=3),
                   dict(keywords, atten_mask=frozen, sparse_mode=2)):
            for _ in range(2):
                _assert_golden(pasa_npu.fused_attention(q, k, v, **kw), q, k, v, kw)
                _assert_golden(pasa_npu.plan(q, k, v, **kw).run(q, k, v), q, k, v, kw)
        full[3] = False  # written where no version counts it: read again
        _assert_golden(pasa_npu.fused_attention(q, k, v, atten_mask=full, **keywords), q, k, v,
                       dict(keywords, atten_mask=full.clone()))
    assert not causal.is_inference()  # the optimized mask is a normal tensor: remembered


def test_a_new_mask_over_the_same_memory_is_read_again():
    """Masks made anew over one buffer each call (``torch.from_numpy``): each has its own
    version counter, so the rows it empties are read from it, not from the last one."""
    q, k, v, keywords = _masked_case()
    buffer = np.zeros((12, 12), dtype=bool)
    buffer[3] = True
    for _ in range(2):
        for row_empty in (True, False):
            buffer[3] = row_empty
            mask = torch.from_numpy(buffer)
            got = pasa_npu.fused_attention(q, k, v, atten_mask=mask, **keywords)
            _assert_golden(got, q, k, v, dict(keywords, atten_mask=mask.clone()))


def test_a_run_keeps_the_planned_lengths():
    """Lengths given as a list or a host tensor are copied when planned: a run validated
    in full again (other strides) takes them as planned, as every run does."""
    q, k, v, keywords = _masked_case()
    for lengths in ([12, 7], torch.tensor([12, 7])):
        planned = pasa_npu.plan(q, k, v, actual_seq_lengths_kv=lengths, **keywords)
        want = pasa_npu.fused_attention(q, k, v, actual_seq_lengths_kv=[12, 7], **keywords)
        lengths[1] = 3
        strided = q.transpose(2, 3).contiguous().transpose(2, 3)
        for tensors in ((q, k, v), (strided, k, v)):
            assert all(torch.equal(a, b) for a, b in zip(planned.run(*tensors), want))


def test_a_plan_holds_neither_its_tensors_nor_an_optimized_mask():
    """A plan per decode step must not pin that step's activations, and a cached plan of
    sparse modes 2-4 holds no mask (a caller that makes one per call would pin 4 MiB a
    plan); each call checks its optimized mask, remembered per tensor."""
    q, k, v, keywords = _masked_case()
    planning = [t.clone() for t in (q, k, v)]
    planned = pasa_npu.plan(*planning, **keywords)
    refs = [weakref.ref(t) for t in planning]
    for _ in range(3):
        fresh = pasa_npu.compressed_causal_mask()
        pasa_npu.fused_attention(q, k, v, atten_mask=fresh, sparse_mode=3, **keywords)
        refs.append(weakref.ref(fresh))
    del planning, fresh
    gc.collect()
    assert planned.run(q, k, v) is not None and all(ref() is None for ref in refs)
    bad = pasa_npu.compressed_causal_mask()
    bad[0, 1] = False
    with pytest.raises(ValueError, match="strict upper triangle"):
        pasa_npu.fused_attention(q, k, v, atten_mask=bad, sparse_mode=3, **keywords)


def test_a_run_follows_a_mask_moved_to_other_storage_or_view():
    """set_() gives the mask other memory, t_() another view of its own: a run reads the
    mask as it is, and leaves nothing stale for the calls after it."""
    q, k, v, keywords = _masked_case()
    mask = torch.zeros(12, 12, dtype=torch.bool)
    planned = pasa_npu.plan(q, k, v, atten_mask=mask, **keywords)
    moved = torch.zeros(12, 12, dtype=torch.bool)
    moved[:, 4:] = True
    mask.set_(moved.untyped_storage(), 0, (12, 12), (12, 1))
    _assert_golden(planned.run(q, k, v), q, k, v, dict(keywords, atten_mask=moved))
    hidden = torch.zeros(12, 12, dtype=torch.bool)
    hidden[:, 7:] = True
    hidden[2] = True  # row 2 sees no key; after t_(), no row is empty
    planned = pasa_npu.plan(q, k, v, atten_mask=hidden, **keywords)
    planned.run(q, k, v)
    hidden.t_()
    for run in (planned.run, lambda q, k, v: pasa_npu.fused_attention(q, k, v, atten_mask=hidden,
                                                                      **keywords)):
        _assert_golden(run(q, k, v), q, k, v, dict(keywords, atten_mask=hidden.clone()))
