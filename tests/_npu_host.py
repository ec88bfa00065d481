"""Support for the tests of the NPU host code, which run without CANN or an NPU: the headers
of the torch_npu wheel matching the installed torch (fetched once with ``pip download``,
cached), stand-ins for the launch headers CANN generates (``aclrtlaunch_<kernel>.h``, written
from the kernels' signatures) and the compiler invocations."""
from __future__ import annotations

import fcntl
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERNELS = ROOT / "ascend_kernels" / "kernels"
HOST = ROOT / "ascend_kernels" / "host"
BINDING = ROOT / "ascend_kernels" / "binding" / "pasa_torch_npu.cpp"
#: where fetched headers are kept between runs (override with PASA_NPU_TEST_CACHE)
CACHE = pathlib.Path(os.environ.get("PASA_NPU_TEST_CACHE",
                                    pathlib.Path.home() / ".cache" / "pasa_npu_tests"))
#: the AscendC header check, ../shared/ascendc-check next to the repository (or PASA_ASCENDC_CHECK)
ASCENDC_CHECK = pathlib.Path(os.environ.get("PASA_ASCENDC_CHECK",
                                            ROOT.parent / "shared" / "ascendc-check" / "check.py"))

_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+__aicore__\s+void\s+(\w+)\s*\(([^)]*)\)')


def torch_npu_version() -> str:
    """The torch_npu release that matches the installed torch (its version without a local
    part such as ``+cpu``)."""
    return torch.__version__.split("+")[0]


#: what the checks use of the torch_npu wheel, besides torch_npu/include/
_WHEEL_FILES = ("torch_npu/lib/libtorch_npu.so", "torch_npu/utils/cpp_extension.py")


def torch_npu_wheel() -> pathlib.Path:
    """The parts of the torch_npu wheel matching the installed torch that the checks use
    (``torch_npu/include``, ``libtorch_npu.so``, the extension helper ``cpp_extension.py``),
    extracted into the cache on first use from ``pip download --no-deps
    torch_npu==<torch version>``. Returns the directory holding ``torch_npu/``."""
    version = torch_npu_version()
    target = CACHE / f"torch_npu-{version}"
    if _complete(target):
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:  # pytest-xdist workers fetch once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(target):
            return target
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp,
                   f"torch_npu=={version}"]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            wheels = list(pathlib.Path(tmp).glob("torch_npu-*.whl"))
            if proc.returncode != 0 or not wheels:
                raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n"
                                   f"{proc.stdout}{proc.stderr}")
            staging = pathlib.Path(tmp) / "extract"
            with zipfile.ZipFile(wheels[0]) as wheel:
                for name in wheel.namelist():
                    if name.startswith("torch_npu/include/") or name in _WHEEL_FILES:
                        wheel.extract(name, staging)
            (staging / ".complete").touch()
            shutil.rmtree(target, ignore_errors=True)
            shutil.move(str(staging), str(target))
    return target


def _complete(target: pathlib.Path) -> bool:
    return (target / ".complete").exists() and all((target / f).exists() for f in _WHEEL_FILES)


def torch_npu_include() -> pathlib.Path:
    """``torch_npu/include`` of the wheel (see :func:`torch_npu_wheel`)."""
    return torch_npu_wheel() / "torch_npu" / "include"


def kernel_signatures() -> dict[str, list[tuple[str, str]]]:
    """Kernel name -> [(parameter type, name)] of every ``extern "C" __global__ __aicore__``
    function in ascend_kernels/kernels/."""
    found = {}
    for src in sorted(KERNELS.glob("*.cpp")):
        for name, params in _KERNEL.findall(src.read_text()):
            found[name] = [tuple(p.split()[-2:]) for p in params.split(",")]
    return found


def write_launch_headers(directory: pathlib.Path) -> list[str]:
    """Stand-ins for the ``aclrtlaunch_<kernel>.h`` headers CANN's ascendc_library generates:
    one extern "C" launch function per kernel, taking the block count, the stream and the
    kernel's parameters (GM_ADDR as ``void*``). Returns the kernel names."""
    directory.mkdir(parents=True, exist_ok=True)
    names = []
    for name, params in kernel_signatures().items():
        args = ", ".join(f"{'void*' if kind == 'GM_ADDR' else kind} {arg}" for kind, arg in params)
        guard = f"HEADER_ACLRTLAUNCH_{name.upper()}_H"
        (directory / f"aclrtlaunch_{name}.h").write_text(
            f"#ifndef {guard}\n#define {guard}\n#include \"acl/acl_base.h\"\n\n"
            f"#ifndef ACLRT_LAUNCH_KERNEL\n"
            f"#define ACLRT_LAUNCH_KERNEL(kernel_func) aclrtlaunch_##kernel_func\n#endif\n\n"
            f"extern \"C\" uint32_t aclrtlaunch_{name}(uint32_t blockDim, aclrtStream stream, "
            f"{args});\n#endif\n")
        names.append(name)
    return names


def acl_includes(include: pathlib.Path) -> list[str]:
    """-I flags of the ACL headers the wheel ships."""
    return [f"-I{include / 'third_party' / 'acl' / 'inc'}"]


def binding_includes(include: pathlib.Path) -> list[str]:
    """-I flags torch_npu's NpuExtension uses (torch, torch_npu, its ACL and HCCL headers) and
    Python's."""
    from torch.utils.cpp_extension import include_paths
    return ([f"-I{p}" for p in include_paths()]
            + [f"-I{include}", f"-I{include / 'third_party' / 'hccl' / 'inc'}"]
            + acl_includes(include) + [f"-I{sysconfig.get_paths()['include']}"])


def torch_npu_link_flags() -> list[str]:
    """Linker flags for torch's libraries and the wheel's libtorch_npu.so."""
    from torch.utils.cpp_extension import library_paths
    lib = torch_npu_wheel() / "torch_npu" / "lib"
    return ([f"-L{p}" for p in library_paths()] + ["-ltorch", "-ltorch_cpu", "-lc10", f"-L{lib}",
                                                   "-ltorch_npu"])


def gxx(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    """g++ with ``args``; the result, output captured."""
    return subprocess.run(["g++", *args], capture_output=True, text=True, timeout=timeout)


def torch_abi_flag() -> str:
    return f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
