"""A checker for host reads of device tensors, on a machine without a device.

:class:`HostReadChecker` is a torch function mode. The tensors a test marks play the
device's memory; every tensor computed from a marked one, written from one, made with an
explicit ``device=`` or moved by ``.to(device)`` is marked too. A host read of a marked
tensor raises :class:`HostRead`, naming the operation and the package line that asked for
it: ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``.to("cpu")``, ``bool()``,
``int()``, ``float()``, indexing a list with it, formatting it, ``torch.equal`` and the other
comparisons that return a Python value, and the operations whose output shape depends on
the data (``nonzero``, ``unique``, a boolean mask as an index, ...). Each of these waits for
the device on a GPU or an NPU.

:meth:`HostReadChecker.device_side` runs the kernels: inside it nothing is checked, and the
tensors passed in are marked afterwards (the device wrote them).
"""
from __future__ import annotations

import contextlib
import traceback
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

#: Tensor methods and torch functions that hand a tensor's values to the host
READS = frozenset({
    "item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__",
    "__complex__", "__format__", "__repr__", "__array__", "equal", "allclose", "is_nonzero",
})
#: operations whose output shape depends on the values (the host must learn it)
DATA_SHAPED = frozenset({
    "nonzero", "argwhere", "unique", "unique_consecutive", "masked_select", "bincount",
})
#: in-place writes: the first argument takes the others' marks
_WRITES = frozenset({"__setitem__", "copy_", "index_put_", "masked_fill_", "masked_scatter_",
                     "scatter_", "index_copy_", "fill_"})


class HostRead(AssertionError):
    """A device tensor was read on the host."""


class HostReadChecker(TorchFunctionMode):
    """Marks device tensors and raises :class:`HostRead` on a host read of one; ``allowed``:
    qualified names (``module.function``) of the package functions whose host reads are the
    documented ones (they run unchecked)."""

    def __init__(self, allowed=()):
        super().__init__()
        self._marked: dict = {}  # id -> weak reference (tensors compare by value)
        self._active = True
        self.allowed = frozenset(allowed)
        self.allowed_hits: list[str] = []

    def mark(self, *values) -> None:
        for t in tree_flatten(values)[0]:
            if isinstance(t, torch.Tensor) and not self.marked(t):
                ident = id(t)
                self._marked[ident] = weakref.ref(t, lambda _, i=ident: self._marked.pop(i, None))

    def marked(self, t) -> bool:
        ref = self._marked.get(id(t))
        return ref is not None and ref() is t

    @contextlib.contextmanager
    def device_side(self, *written):
        """The device's own work (a kernel launch): unchecked; ``written`` marked after."""
        active, self._active = self._active, False
        try:
            yield
        finally:
            self._active = active
            self.mark(written)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self._active:
            return func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        tainted = any(self.marked(t) for t in inputs)
        if tainted and self._reads(name, args, kwargs):
            site = self._site()
            if site is None:
                raise HostRead(f"{name} of a device tensor (no package frame on the stack)")
            where, allowed = site
            if not allowed:
                raise HostRead(f"host read of a device tensor: {name} at {where}")
            self.allowed_hits.append(f"{name} at {where}")
        result = func(*args, **kwargs)
        moved = self._to_device(name, args, kwargs)
        if moved and not tainted and result is args[0]:
            # a host tensor "moved" to the CPU is itself: the device's copy is a new alias
            with torch._C.DisableTorchFunction():
                result = result.view_as(result)
        if tainted or moved:
            self.mark(result)
            if tainted and (name in _WRITES or name.endswith("_")) and args:
                self.mark(args[0])
            if tainted and isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
                self.mark(inputs)  # an operator may write any of its tensor arguments
        return result

    @staticmethod
    def _reads(name: str, args, kwargs) -> bool:
        if name in READS or name in DATA_SHAPED:
            return True
        if name == "to":
            target = kwargs.get("device", args[1] if len(args) > 1 else None)
            return target == "cpu" or (isinstance(target, str) and target.startswith("cpu"))
        if name == "__getitem__" and len(args) > 1:
            index = tree_flatten(args[1])[0]
            return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
        if name == "where" and len(args) == 1 and not kwargs:
            return True  # torch.where(condition): nonzero
        if name in ("repeat_interleave", "tensor_split"):  # by the values of a tensor argument
            given = args[1] if len(args) > 1 else kwargs.get("repeats",
                                                             kwargs.get("indices_or_sections"))
            return (len(args) == 1 and not kwargs) or (
                isinstance(given, torch.Tensor) and kwargs.get("output_size") is None)
        return False

    @staticmethod
    def _to_device(name: str, args, kwargs) -> bool:
        """Made on, or moved to, a device named explicitly."""
        if kwargs.get("device") is not None:
            return True
        return name == "to" and len(args) > 1 and isinstance(args[1], (torch.device, str))

    def _site(self):
        """(the innermost package frame as "file:line in function", whether one of the
        package frames on the stack is allowed), or None."""
        frames = [f for f in traceback.extract_stack()[:-2]
                  if "/pasa_npu/" in f.filename or "/fallback/" in f.filename]
        if not frames:
            return None
        inner = frames[-1]
        names = {f"{_module(f.filename)}.{f.name}" for f in frames}
        return f"{inner.filename}:{inner.lineno} in {inner.name}", bool(names & self.allowed)


def _module(filename: str) -> str:
    """The module's dotted name under the package for a source path."""
    parts = filename.replace("\\", "/").rsplit("/", 2)
    return f"{parts[-2]}.{parts[-1][:-3]}"
