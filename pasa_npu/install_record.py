"""What the install recorded about the NPU part, for the ``npu`` backend. Standard library
only: setup.py loads this file by path in pip's build environment to write the record."""
from __future__ import annotations

import os

#: the file next to the extensions that records what the build did
STATUS_FILE = "_npu_build_status.txt"


def recorded_status(package_dir: str) -> str:
    """What the install recorded about the NPU part in ``package_dir`` (the directory of the
    pasa_npu package): ``built for <SoC>``, or ``skipped: <why>``."""
    try:
        with open(os.path.join(package_dir, STATUS_FILE)) as f:
            return f.read().strip()
    except FileNotFoundError:
        return "skipped: pasa_npu was built before its build recorded the NPU part's outcome"
