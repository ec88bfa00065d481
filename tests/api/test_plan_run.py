"""``pasa_npu.plan``: a call validated once, then run on new tensors. Each run computes
what ``fused_attention`` computes on those tensors, bit for bit, for every argument form;
tensors of another layout are validated in full again; bad arguments fail at plan time;
a run traces under torch.compile as the eager call's operator."""
from __future__ import annotations

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
