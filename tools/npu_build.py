"""Whether ``pip install`` builds the NPU part of pasa_npu, decided from the environment.

setup.py loads this file by path (standard library only: it runs in pip's build
environment) and tests call :func:`plan` with a made-up environment. The NPU part is the
AscendC kernels, built with CANN's CMake, and the torch_npu binding ``pasa_npu._npu``, built
with torch_npu's extension machinery. It needs a complete CANN toolkit
(``ASCEND_HOME_PATH``, which CANN's ``set_env.sh`` sets) and torch_npu importable where the
build runs. Without a toolkit, or without torch_npu, the NPU part is skipped with a one-line
reason and the CPU emulation is installed. A toolkit that lacks a piece fails the build,
naming the piece: the build never produces half of the NPU part.

``PASA_NPU_BUILD``: ``auto`` (default) as above; ``0`` never builds the NPU part; ``1``
fails where ``auto`` would skip.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

DEFAULT_SOC = "Ascend910B1"


class NpuBuildError(RuntimeError):
    """The environment asks for the NPU part but cannot build all of it."""


@dataclass(frozen=True)
class NpuBuild:
    """What the NPU build uses: the toolkit root and the SoC the kernels are built for."""

    cann: str
    soc: str


# (what it is, paths relative to the toolkit root: any one will do)
_TOOLKIT_PIECES = (
    ("the AscendC compiler (bisheng or ccec)",
     ("compiler/ccec_compiler/bin/bisheng", "compiler/ccec_compiler/bin/ccec",
      "tools/ccec_compiler/bin/bisheng", "tools/ccec_compiler/bin/ccec")),
    ("CANN's AscendC CMake modules (ascendc_kernel_cmake)",
     ("compiler/tikcpp/ascendc_kernel_cmake", "tools/tikcpp/ascendc_kernel_cmake")),
    ("the ACL headers (include/acl/acl.h)", ("include/acl/acl.h",)),
    ("the ACL runtime library (lib64/libascendcl.so)", ("lib64/libascendcl.so",)),
)


def plan(environ: Mapping[str, str],
         module_exists: Callable[[str], bool] = lambda name: importlib.util.find_spec(name) is not None,
         which: Callable[[str], Optional[str]] = shutil.which) -> tuple[Optional[NpuBuild], str]:
    """``(build, why)``: ``build`` is None when the NPU part is skipped and ``why`` says why in
    one line; otherwise ``why`` says what will be built. Raises :class:`NpuBuildError` naming
    what is missing when a toolkit is given but incomplete, or when ``PASA_NPU_BUILD=1`` and
    the part would be skipped."""
    mode = environ.get("PASA_NPU_BUILD", "auto").strip().lower() or "auto"
    if mode not in ("auto", "0", "1"):
        raise NpuBuildError(f"PASA_NPU_BUILD must be auto, 0 or 1, got {mode!r}")
    if mode == "0":
        return None, "PASA_NPU_BUILD=0"
    cann = environ.get("ASCEND_HOME_PATH", "").strip()
    if not cann:
        return _skip(mode, "ASCEND_HOME_PATH is not set (source the CANN toolkit's set_env.sh "
                           "to build the NPU kernels)")
    _check_toolkit(cann, which)
    if not module_exists("torch_npu"):
        return _skip(mode, "torch_npu is not importable where the build runs (install torch_npu, "
                           "then pip install --no-build-isolation -e .)")
    soc = environ.get("PASA_NPU_SOC_VERSION", "").strip() or DEFAULT_SOC
    return (NpuBuild(cann=cann, soc=soc),
            f"building the NPU kernels for {soc} with the CANN toolkit at {cann}")


def _skip(mode: str, why: str) -> tuple[None, str]:
    if mode == "1":
        raise NpuBuildError(f"PASA_NPU_BUILD=1 but the NPU part cannot be built: {why}")
    return None, why


def _check_toolkit(cann: str, which: Callable[[str], Optional[str]]) -> None:
    """NpuBuildError listing every piece the build needs that the toolkit lacks."""
    if not os.path.isdir(cann):
        raise NpuBuildError(f"ASCEND_HOME_PATH={cann} is not a directory; source a CANN "
                            f"toolkit's set_env.sh, or set PASA_NPU_BUILD=0 to install the CPU "
                            f"emulation only")
    missing = [f"{what}: none of {', '.join(candidates)}" for what, candidates in _TOOLKIT_PIECES
               if not any(os.path.exists(os.path.join(cann, p)) for p in candidates)]
    if which("cmake") is None:
        missing.append("cmake on PATH")
    if missing:
        raise NpuBuildError(f"ASCEND_HOME_PATH={cann} is not a complete CANN toolkit; missing "
                            + "; ".join(missing) + ". Fix the toolkit, or set PASA_NPU_BUILD=0 "
                            "to install the CPU emulation only")
