"""The emulation's self-tests (``ascend_kernels/emu/pasa_emu_selftest_module.cpp``) as the
development module ``_ascendc_emu_selftest``: never installed, built on first use by
:func:`pasa_npu.sim_build.compile_cached` with the shipped extension's flags into
``pasa-emu-selftest-<hash>`` of the temporary directory (the hash over the build's command and
sources), and loaded from there."""
from __future__ import annotations

import functools
import importlib.util
import os
import sysconfig
import tempfile

import pytest

from pasa_npu import sim_build

NAME = "_ascendc_emu_selftest"
SOURCE = os.path.join(sim_build.EMU, "pasa_emu_selftest_module.cpp")


@functools.cache
def selftest_module():
    """The module for the sources as they are; skips the calling test, saying why, where it cannot
    be built here (no checkout, no C++ compiler, no pybind11). A failing build fails the test."""
    if not os.path.isfile(SOURCE):
        pytest.skip(f"the emulation's self-test source is not at {SOURCE}: run from a checkout")
    reason = sim_build.compiler_missing()
    if reason:
        pytest.skip(f"the emulation's self-test module cannot be built: {reason}")
    pybind11 = pytest.importorskip("pybind11", reason="building the emulation's self-test module needs pybind11")
    # compiled as setuptools compiles the extension: Python's flags, then the emulation's
    python_flags = [*sysconfig.get_config_var("CFLAGS").split(), sysconfig.get_config_var("CCSHARED")]
    cmd = [sim_build.compiler(), *python_flags, *sim_build.EMU_FLAGS, "-shared", f"-I{sim_build.EMU}",
           f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}", SOURCE, "-pthread"]
    inputs = list(sim_build.sources(sim_build.EMU))
    folder = os.path.join(tempfile.gettempdir(), f"pasa-emu-selftest-{sim_build.digest(cmd, inputs)[:16]}")
    os.makedirs(folder, exist_ok=True)
    path = sim_build.compile_cached(cmd, inputs, os.path.join(folder, NAME + sysconfig.get_config_var("EXT_SUFFIX")))
    spec = importlib.util.spec_from_file_location(NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
