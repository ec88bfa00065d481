"""Facts read from a tensor's contents (a mask validated, the rows a mask leaves a key, a
block table's valid entries), remembered while those contents stay the same, so that a
loop that reuses one tensor reads it once: no wait for the device after its first call."""
from __future__ import annotations

import weakref

import torch


class TensorMemo:
    """Values computed from tensors' contents, each under its tensor and an ``extra`` key.

    An entry belongs to the tensor's root (the tensor a view was taken of: views share its
    version counter, so a fresh view of the same tensor finds the entry) and holds it
    weakly: it goes with the tensor and keeps no memory alive. Its values are valid while
    the root's version stays the one they were computed at (an in-place write through any
    view, ``set_()`` and ``resize_()`` make a new one, which forgets them), each for the
    view's storage address, shape, strides, dtype and device it was computed for. Writes
    that bypass PyTorch's version counter (a custom kernel, ``.data``, DLPack, a NumPy
    array or another tensor sharing the memory) are not seen. An inference tensor has no
    version counter: it is remembered only by a memo made with ``inference_tensors=True``,
    whose values for it hold, for the same storage address, shape and strides, while that
    tensor object lives (its views do not share them), whatever is written to it; other
    memos read its facts on every call."""

    def __init__(self, size: int = 64, inference_tensors: bool = False):
        self.size = size  # tensors, and values per tensor, remembered at most
        self.inference_tensors = inference_tensors
        self.entries: dict = {}  # id(root) -> (weakref to root, version, {key: value})
        # the last value put or found: (weakref to the tensor, its version, extra, value, its
        # key). The same tensor at the same version has the same storage, shape and strides
        # (set_(), resize_() and the in-place view changes make a new version); an inference
        # tensor's version is None and its key is compared instead.
        self._last = None

    def get(self, t: torch.Tensor, extra: tuple = ()):
        """The value remembered for ``t`` and ``extra``, or None."""
        last = self._last
        if last is not None and last[0]() is t and last[2] == extra:
            if last[1] is not None:
                if last[1] == t._version:
                    return last[3]  # a loop's common case: the tensor of the previous call
            elif last[4] == _key(t, extra):
                return last[3]
        root, version = self._root(t)
        if root is None:
            return None
        hit = self.entries.get(id(root))
        if hit is None or hit[0]() is not root or hit[1] != version:
            return None
        key = _key(t, extra)
        value = hit[2].get(key)
        if value is not None:
            self._last = (weakref.ref(t), version, extra, value, key)
        return value

    def put(self, t: torch.Tensor, value, extra: tuple = ()) -> None:
        """Remember ``value`` (not None) for ``t`` and ``extra``; an inference tensor's only
        where the memo takes them."""
        root, version = self._root(t)
        if root is None:
            return
        ident = id(root)
        hit = self.entries.get(ident)
        if hit is None or hit[0]() is not root or hit[1] != version:
            if hit is None and len(self.entries) >= self.size:
                self.entries.clear()
            ref = hit[0] if hit is not None and hit[0]() is root else weakref.ref(
                root, lambda dead: self._forget(ident, dead))
            hit = self.entries[ident] = (ref, version, {})
        if len(hit[2]) >= self.size:
            hit[2].clear()
        key = _key(t, extra)
        hit[2][key] = value
        self._last = (weakref.ref(t), version, extra, value, key)

    def _root(self, t: torch.Tensor):
        """(the tensor whose version counter ``t`` shares, its version), or (None, None) for
        an inference tensor that this memo does not take."""
        if t.is_inference():
            return (t, None) if self.inference_tensors else (None, None)
        root = t._base if t._base is not None else t
        return root, root._version

    def clear(self) -> None:
        self.entries.clear()
        self._last = None

    def _forget(self, ident: int, dead: weakref.ref) -> None:
        hit = self.entries.get(ident)
        if hit is not None and hit[0] is dead:
            del self.entries[ident]


def _key(t: torch.Tensor, extra: tuple) -> tuple:
    return t.data_ptr(), t.shape, t.stride(), t.dtype, t.device, extra
