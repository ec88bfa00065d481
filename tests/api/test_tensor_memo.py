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


def test_inference_tensors_only_where_the_memo_takes_them():
    """An inference tensor has no version counter (nor a base that views share): a memo that
    takes them keeps a tensor's facts for its storage, shape and strides while it lives,
    whatever is written to it."""
    memo = TensorMemo(inference_tensors=True)
    with torch.inference_mode():
        frozen = torch.zeros(4, 4)
        memo.put(frozen, "fact")
        frozen.add_(1)  # no version counts it
    assert memo.get(frozen) == "fact"
    memo._last = None  # the entries, not the last-call shortcut
    assert memo.get(frozen) == "fact"
    assert memo.get(frozen[:]) is None and memo.get(frozen.clone()) is None
    with torch.inference_mode():
        frozen.resize_(2, 2)  # the same tensor, another shape: read again
    assert memo.get(frozen) is None
    memo._last = None
    assert memo.get(frozen) is None
    del frozen
    gc.collect()
    assert not memo.entries
