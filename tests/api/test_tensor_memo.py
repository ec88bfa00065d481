"""pasa_npu.tensor_memo: facts remembered per tensor and version, weakly."""
from __future__ import annotations

import gc

import torch

from pasa_npu.tensor_memo import TensorMemo


def test_a_fact_holds_for_its_tensor_and_version_only():
    memo = TensorMemo()
    t = torch.zeros(4, 4)
    memo.put(t, "fact", ("extra",))
    assert memo.get(t, ("extra",)) == "fact" and memo.get(t, ("other",)) is None
    assert memo.get(t[:], ("extra",)) == "fact"  # a fresh view of the same elements
    assert memo.get(t[1:], ("extra",)) is None  # other elements
    assert memo.get(t.clone(), ("extra",)) is None
    t[0].add_(1)  # a write through a view: a new version, the old facts forgotten
    assert memo.get(t, ("extra",)) is None
    for i in range(10):
        t.add_(1)
        memo.put(t, i)
    (_, _, values), = memo.entries.values()
    assert values == {next(iter(values)): 9}  # one version's facts kept, not ten


def test_nothing_is_kept_alive_and_inference_tensors_are_never_remembered():
    memo = TensorMemo()
    t = torch.zeros(3)
    memo.put(t, "fact")
    del t
    gc.collect()
    assert not memo.entries
    with torch.inference_mode():
        frozen = torch.zeros(3)
    memo.put(frozen, "fact")
    assert memo.get(frozen) is None and not memo.entries
