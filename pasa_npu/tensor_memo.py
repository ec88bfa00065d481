"""Facts read from a tensor's contents (a mask validated, the rows a mask leaves a key, a
block table's valid entries), remembered while those contents stay the same, so that a
loop that reuses one tensor reads it once: no wait for the device after its first call."""
from __future__ import annotations

import weakref
from typing import Optional

import torch


class TensorMemo:
    """Values computed from tensors' contents, each under its tensor and an ``extra`` key.

    An entry belongs to the tensor's root (the tensor a view was taken of: views share its
    version counter, so a fresh view of the same tensor finds the entry) and holds it
    weakly: it goes with the tensor and keeps no memory alive. It is valid while the
    root's version and the view's storage address, shape, strides, dtype and device stay
    those it was computed at; an in-place write through any view makes a new version.
    Writes that bypass PyTorch's version counter (a custom kernel, ``.data``, DLPack, a
    NumPy array sharing the buffer) are not seen. An inference tensor, which has no
    version counter, is never remembered: its facts are read on every call."""

    def __init__(self, size: int = 64):
        self.size = size  # tensors remembered at most; past it, all are forgotten
        self.entries: dict = {}  # id(root) -> (weakref to root, {key: value})

    def get(self, t: torch.Tensor, extra: tuple = ()):
        """The value remembered for ``t`` and ``extra``, or None."""
        root, key = _root_and_key(t, extra)
        if key is None:
            return None
        hit = self.entries.get(id(root))
        if hit is None or hit[0]() is not root:
            return None
        return hit[1].get(key)

    def put(self, t: torch.Tensor, value, extra: tuple = ()) -> None:
        """Remember ``value`` (not None) for ``t`` and ``extra``; an inference tensor's is not."""
        root, key = _root_and_key(t, extra)
        if key is None:
            return
        ident = id(root)
        hit = self.entries.get(ident)
        if hit is None or hit[0]() is not root:
            if len(self.entries) >= self.size:
                self.entries.clear()
            hit = self.entries[ident] = (weakref.ref(root, lambda dead: self._forget(ident, dead)),
                                         {})
        if len(hit[1]) >= self.size:
            hit[1].clear()
        hit[1][key] = value

    def clear(self) -> None:
        self.entries.clear()

    def _forget(self, ident: int, dead: weakref.ref) -> None:
        hit = self.entries.get(ident)
        if hit is not None and hit[0] is dead:
            del self.entries[ident]


def _root_and_key(t: torch.Tensor, extra: tuple) -> tuple[torch.Tensor, Optional[tuple]]:
    if t.is_inference():
        return t, None
    root = t._base if t._base is not None else t
    return root, (t._version, t.data_ptr(), t.shape, t.stride(), t.dtype, t.device, extra)
