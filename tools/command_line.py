"""What the commands (``pasa-compare``, ``pasa-bench``, ``pasa-npu-model``) share on their
command lines: argparse types that name their option, and the output folder, checked
before a run's work and created only once the run has results to write."""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import pathlib


class OutputFolderError(Exception):
    """``--out`` names a path where no folder can be: the message says why."""


def positive_int(name: str):
    """An argparse type: an int >= 1, the error naming ``--name``."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be an integer, got {text!r}")
        if value < 1:
            raise argparse.ArgumentTypeError(f"--{name} must be >= 1, got {value}")
        return value
    return parse


def positive_float(name: str):
    """An argparse type: a finite number > 0, the error naming ``--name``."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be a number, got {text!r}")
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"--{name} must be finite and > 0, got {text}")
        return value
    return parse


def checked_folder(folder: str) -> str:
    """``folder``, an existing folder or a path where one can be made; nothing is created.
    :class:`OutputFolderError` naming ``--out`` otherwise."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise OutputFolderError(f"--out {folder}: expected a folder, got an existing file")
    parent = os.path.dirname(os.path.abspath(folder))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise OutputFolderError(f"--out {folder}: cannot create it: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputFolderError(f"--out {folder}: cannot create it: {parent} is not writable")
    return folder


def out_folder(text: str) -> pathlib.Path:
    """``--out`` as an argparse type: :func:`checked_folder`."""
    try:
        return pathlib.Path(checked_folder(text))
    except OutputFolderError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--out {text}: ")) from None


@contextlib.contextmanager
def created_folder(folder: str):
    """Create ``folder`` for the writes in the block; if the block fails, the folders
    created here are removed again where they are still empty."""
    created = []
    path = os.path.abspath(folder)
    while not os.path.exists(path):
        created.append(path)
        path = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise OutputFolderError(f"--out {folder}: cannot create it: {err.strerror}") from err
    try:
        yield folder
    except BaseException:
        for path in created:  # innermost first
            try:
                os.rmdir(path)
            except OSError:  # not empty: keep what was written
                break
        raise
