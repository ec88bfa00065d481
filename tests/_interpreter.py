"""Triton's interpreter, made cheaper for the suite: it patches ``triton.language`` for a
kernel's run and again at every device-function call inside it (``inspect.getmembers``
over the language's modules: about a quarter of an interpreted decode's time). :func:`install`
makes a kernel's patch cover both language modules, ``triton.language`` and
``triton.language.core`` (the one ``triton.language.standard``'s ``sum``, ``max`` and ``zeros``
see), and skips every device function's patch inside it: each would patch a module the
kernel's patch already covers. The kernel's patch is undone after its run as before, both
modules in reverse order. It also remembers the NumPy type of each Triton scalar type
(the interpreter rebuilds its table of them at every cast, splat and load). A reduction
with a combine function of the kernel's own (``tl.reduce``), which the interpreter applies
one element at a time, is applied to halves of the reduced axis, a tree of whole-tensor
calls (its sums round in the tree's order, as a GPU's need not in the element order);
over every axis it flattens each operand, where the interpreter's own flattens only the
first. Where this Triton's interpreter is not laid out as expected, nothing is changed."""
from __future__ import annotations

import functools

import numpy as np


def install() -> bool:
    """Install both; False where this Triton's interpreter lacks what it relies on."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch = getattr(interpreter, "_patch_lang", None)
    grid = getattr(interpreter, "GridExecutor", None)
    if patch is None or grid is None or getattr(patch, "skips_nested", False):
        return False
    running = []  # per kernel running: whether its own patch is made

    class _Nothing:
        def restore(self):
            pass

    class _BothLanguages:  # what the interpreter's patch reads of a function: its globals
        __globals__ = {"tl": tl, "core": tl.core}

    def patch_lang(fn):
        if running and running[-1]:  # a device function inside a patched kernel
            return _Nothing()
        if running:  # the kernel's own patch
            running[-1] = True
            return patch(_BothLanguages)
        return patch(fn)
    patch_lang.skips_nested = True

    run_grid = grid.__call__

    def grid_call(self, *args, **kwargs):
        running.append(False)
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            running.pop()

    interpreter._patch_lang = patch_lang
    grid.__call__ = grid_call
    numpy_type = getattr(interpreter, "_get_np_dtype", None)
    if numpy_type is not None:
        scalar_numpy_type = functools.lru_cache(maxsize=None)(numpy_type)

        def numpy_type_of(tt_dtype):  # a block's is its element's; pointers are unhashable
            if isinstance(tt_dtype, tl.block_type):
                tt_dtype = tt_dtype.element_ty
            if isinstance(tt_dtype, tl.pointer_type):
                return numpy_type(tt_dtype)
            return scalar_numpy_type(tt_dtype)
        interpreter._get_np_dtype = numpy_type_of
    reduce_ops = getattr(interpreter, "ReduceOps", None)
    if reduce_ops is not None and hasattr(reduce_ops, "generic_reduce"):
        reduce_ops.generic_reduce = _tree_reduce
    return True


def _tree_reduce(self, input):
    """The interpreter's ``ReduceOps.generic_reduce``, its combine function applied to the
    two halves of the axis (an odd last element carried) until one element is left."""
    original_axis = self.axis
    axis = 0 if original_axis is None else original_axis
    dtypes = [arg.dtype for arg in input]
    data = [arg.handle.data.reshape(-1) if original_axis is None else arg.handle.data
            for arg in input]
    while data[0].shape[axis] > 1:
        n = data[0].shape[axis]
        half = n // 2
        low = [self.to_tensor(np.take(d, np.arange(half), axis), t) for d, t in zip(data, dtypes)]
        high = [self.to_tensor(np.take(d, np.arange(half, 2 * half), axis), t)
                for d, t in zip(data, dtypes)]
        out = self.combine_fn.fn(*low, *high)
        out = out if isinstance(out, tuple) else (out,)
        shape = low[0].handle.data.shape
        merged = [np.broadcast_to(np.asarray(o.handle.data if hasattr(o, "handle") else o),
                                  shape).astype(d.dtype) for o, d in zip(out, data)]
        if n % 2:
            merged = [np.concatenate([m, np.take(d, [n - 1], axis)], axis)
                      for m, d in zip(merged, data)]
        data = merged
    ret = []
    for d, t in zip(data, dtypes):
        if not self.keep_dims:
            d = np.squeeze(d, axis)
            if original_axis is None:
                d = d.item()
        ret.append(self.to_tensor(d, t))
    return tuple(ret)
