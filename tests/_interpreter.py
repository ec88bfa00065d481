"""Triton's interpreter, made cheaper for the suite: it patches ``triton.language`` for a
kernel's run and again at every device-function call inside it (``inspect.getmembers``
over the language's modules: about a quarter of an interpreted decode's time), though the
kernel's own patch already covers what the call's module sees. :func:`install` skips a
device function's patch where every language module of its globals is patched by the
kernel running; the kernel's patch is made and undone as before, so nothing runs
differently. Where this Triton's interpreter is not laid out as expected, nothing is
changed."""
from __future__ import annotations

import functools
import inspect


def install() -> bool:
    """Install the skip; False where this Triton's interpreter lacks what it relies on."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch = getattr(interpreter, "_patch_lang", None)
    grid = getattr(interpreter, "GridExecutor", None)
    if patch is None or grid is None or getattr(patch, "skips_nested", False):
        return False
    running = []  # the language modules the running kernel's patch covers (None: not yet)

    @functools.lru_cache(maxsize=None)
    def languages(fn) -> frozenset:
        return frozenset(value for value in fn.__globals__.values()
                         if inspect.ismodule(value) and value in (tl, tl.core))

    class _Nothing:
        def restore(self):
            pass

    def patch_lang(fn):
        if running and running[-1] is None:  # the kernel's own patch
            running[-1] = languages(fn)
        elif running and languages(fn) <= running[-1]:
            return _Nothing()
        return patch(fn)
    patch_lang.skips_nested = True

    run_grid = grid.__call__

    def grid_call(self, *args, **kwargs):
        running.append(None)
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            running.pop()

    interpreter._patch_lang = patch_lang
    grid.__call__ = grid_call
    return True
