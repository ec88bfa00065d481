"""The one error type the CLI turns into a one-line message and a non-zero exit."""


class CompareError(Exception):
    """A bad input or option: the message names the argument, what was expected and
    what was given."""
