"""The install's decision about the NPU part (tools/npu_build.py, which setup.py runs): built
with a complete CANN toolkit and torch_npu, skipped with a one-line reason without them, and
a failure naming what is missing for an incomplete toolkit, before anything is compiled."""
from __future__ import annotations

import importlib
import os
import pathlib
import subprocess
import sys

import pytest

from pasa_npu import install_record
from pasa_npu.tools import npu_build

ROOT = pathlib.Path(__file__).resolve().parents[2]
PIECES = ("compiler/ccec_compiler/bin/bisheng", "compiler/tikcpp/ascendc_kernel_cmake/ascendc.cmake",
          "include/acl/acl.h", "lib64/libascendcl.so")


def _toolkit(root: pathlib.Path, *pieces: str) -> str:
    for piece in pieces:
        (root / piece).parent.mkdir(parents=True, exist_ok=True)
        (root / piece).touch()
    return str(root)


def _plan(env, torch_npu=True, cmake=True):
    return npu_build.plan(env, module_exists=lambda name: torch_npu and name == "torch_npu",
                          which=lambda exe: f"/usr/bin/{exe}" if cmake else None)


def test_without_a_toolkit_the_npu_part_is_skipped_with_the_reason():
    build, why = _plan({})
    assert build is None and "ASCEND_HOME_PATH is not set" in why and "\n" not in why
    build, why = _plan({"ASCEND_HOME_PATH": "  ", "PASA_NPU_BUILD": "auto"})
    assert build is None and "ASCEND_HOME_PATH" in why


def test_a_toolkit_and_torch_npu_build_it(tmp_path):
    cann = _toolkit(tmp_path, *PIECES)
    build, why = _plan({"ASCEND_HOME_PATH": cann})
    assert build == npu_build.NpuBuild(cann=cann, soc="Ascend910B1") and cann in why
    build, _ = _plan({"ASCEND_HOME_PATH": cann, "PASA_NPU_SOC_VERSION": "Ascend910B3"})
    assert build.soc == "Ascend910B3"


def test_a_toolkit_without_torch_npu_skips_and_says_how_to_get_it(tmp_path):
    build, why = _plan({"ASCEND_HOME_PATH": _toolkit(tmp_path, *PIECES)}, torch_npu=False)
    assert build is None and "torch_npu is not importable" in why and "--no-build-isolation" in why


def test_an_empty_toolkit_fails_naming_every_missing_piece(tmp_path):
    with pytest.raises(npu_build.NpuBuildError) as err:
        _plan({"ASCEND_HOME_PATH": str(tmp_path)})
    message = str(err.value)
    for what in ("AscendC compiler", "ascendc_kernel_cmake", "include/acl/acl.h", "libascendcl.so"):
        assert what in message
    assert "PASA_NPU_BUILD=0" in message


def test_a_toolkit_without_its_compiler_fails_naming_only_the_compiler(tmp_path):
    with pytest.raises(npu_build.NpuBuildError, match="AscendC compiler") as err:
        _plan({"ASCEND_HOME_PATH": _toolkit(tmp_path, *PIECES[1:])})
    assert "libascendcl" not in str(err.value)
    with pytest.raises(npu_build.NpuBuildError, match="cmake on PATH"):
        _plan({"ASCEND_HOME_PATH": _toolkit(tmp_path, *PIECES)}, cmake=False)
    with pytest.raises(npu_build.NpuBuildError, match="is not a directory"):
        _plan({"ASCEND_HOME_PATH": str(tmp_path / "missing")})


def test_pasa_npu_build_switch(tmp_path):
    build, why = _plan({"ASCEND_HOME_PATH": str(tmp_path), "PASA_NPU_BUILD": "0"})
    assert build is None and why == "PASA_NPU_BUILD=0"
    with pytest.raises(npu_build.NpuBuildError, match="PASA_NPU_BUILD=1 but .* ASCEND_HOME_PATH"):
        _plan({"PASA_NPU_BUILD": "1"})
    with pytest.raises(npu_build.NpuBuildError, match="PASA_NPU_BUILD=1 but .* torch_npu"):
        _plan({"PASA_NPU_BUILD": "1", "ASCEND_HOME_PATH": _toolkit(tmp_path, *PIECES)}, torch_npu=False)
    with pytest.raises(npu_build.NpuBuildError, match="auto, 0 or 1"):
        _plan({"PASA_NPU_BUILD": "yes"})


def test_setup_fails_on_a_fake_toolkit_before_compiling(tmp_path):
    """setup.py's build with ASCEND_HOME_PATH pointing at an empty directory: exit status
    non-zero, the message names the missing compiler, nothing was built."""
    fake = tmp_path / "cann"
    fake.mkdir()
    env = dict(os.environ, ASCEND_HOME_PATH=str(fake))
    env.pop("PASA_NPU_BUILD", None)
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
                           "--build-temp", str(tmp_path / "tmp")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    assert "is not a complete CANN toolkit" in proc.stderr and "AscendC compiler" in proc.stderr
    assert not list(tmp_path.rglob("*.so")) and not list(tmp_path.rglob("*.o"))


def test_npu_backend_reports_why_it_is_not_built(monkeypatch):
    import pasa_npu
    status = pathlib.Path(pasa_npu.__file__).with_name(install_record.STATUS_FILE)
    if status.exists() and status.read_text().startswith("built"):
        pytest.skip("the NPU part is built here")
    monkeypatch.delitem(sys.modules, "pasa_npu.npu", raising=False)
    with pytest.raises(ImportError, match="backend 'npu' is not built"):
        importlib.import_module("pasa_npu.npu")
