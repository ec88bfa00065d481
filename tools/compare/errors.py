"""The one error type the CLI turns into a one-line message and a non-zero exit (a message
names a value it did not expect with :func:`pasa_npu.arguments.describe`)."""
from __future__ import annotations


class CompareError(Exception):
    """A bad input or option: the message names the argument, what was expected and
    what was given."""
