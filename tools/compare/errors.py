"""The one error type the CLI turns into a one-line message and a non-zero exit, and how
an error message names a value it did not expect."""
from __future__ import annotations

#: a value's repr longer than this is cut in an error message
MAX_REPR = 60


class CompareError(Exception):
    """A bad input or option: the message names the argument, what was expected and
    what was given."""


def describe(value) -> str:
    """A short description of ``value`` for an error message: an array or tensor by its
    type, shape and dtype (never its contents), anything else by its type and a repr cut
    to :data:`MAX_REPR` characters."""
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{name} of shape {tuple(shape)}, dtype {dtype}"
    text = repr(value)
    if len(text) > MAX_REPR:
        text = text[:MAX_REPR - 3] + "..."
    return f"{name} {text}"
