"""Build of pasa_npu. ``fallback/`` and ``tools/`` install as ``pasa_npu.fallback`` and
``pasa_npu.tools``; nothing else lands in site-packages, and of ``tools/`` not the
development tools (``tools/dev/``).

The extension ``pasa_npu._ascendc_emu`` compiles the AscendC kernel sources of
``ascend_kernels/`` against the project's CPU emulation of the AscendC API (g++ and pybind11,
any machine); the emulation's self-tests are no part of it (the tests build them:
tests/_emu_selftest.py). The NPU part (the kernels built by CANN's CMake, and the torch_npu
binding ``pasa_npu._npu``) is built when ``tools/npu_build.py`` says the environment has what
it needs; otherwise the build says in one line why it skipped it."""
import glob
import importlib.util
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

#: the development tools, run from a checkout and never installed: the package tools/dev
#: (pasa_npu.tools.dev, with everything under it)
DEV_PACKAGE = "pasa_npu.tools.dev"

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_by_path(name, *path):
    """A module of the source tree, loaded by path: pip's build environment has no torch to
    import the package with."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, *path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _npu_build_module():
    return _load_by_path("_pasa_npu_build", "tools", "npu_build.py")


def _emulation_extension():
    try:
        import pybind11
    except ImportError as exc:  # only without build isolation (pyproject.toml lists it)
        raise RuntimeError("building pasa_npu._ascendc_emu needs pybind11: pip install pybind11, "
                           "or install without --no-build-isolation") from exc

    return Extension(
        "pasa_npu._ascendc_emu",
        sources=["ascend_kernels/emu/pasa_emu_module.cpp"],
        include_dirs=["ascend_kernels/emu", "ascend_kernels/kernels", pybind11.get_include()],
        depends=sorted(glob.glob("ascend_kernels/**/*.h", recursive=True)
                       + glob.glob("ascend_kernels/kernels/*.cpp")
                       + glob.glob("ascend_kernels/host/*.cpp")),
        language="c++",
        # the emulation's flags, shared with the tests' build of its self-tests
        extra_compile_args=_load_by_path("_pasa_npu_sim_build", "pasa_npu", "sim_build.py").EMU_FLAGS,
        extra_link_args=["-pthread"],
    )


class BuildExt(build_ext):
    """build_ext plus, where tools/npu_build.py's plan says so, the NPU kernels (CANN's CMake)
    and the torch_npu binding; the plan's outcome is recorded next to the extensions."""

    def finalize_options(self):
        # decided before build_ext prepares its extensions, so that the binding is one of them
        self.npu_build_module = _npu_build_module()
        try:
            self.npu_build, self.npu_why = self.npu_build_module.plan(os.environ)
        except self.npu_build_module.NpuBuildError as exc:
            raise SystemExit(f"pasa_npu: {exc}") from None
        modules = self.distribution.ext_modules
        if self.npu_build is not None and not any(e.name == "pasa_npu._npu" for e in modules):
            modules.append(_binding_extension(self.npu_build))
        super().finalize_options()

    def run(self):
        if self.npu_build is None:
            print(f"pasa_npu: NPU part skipped, CPU emulation only: {self.npu_why}", file=sys.stderr)
        else:
            print(f"pasa_npu: {self.npu_why}", file=sys.stderr)
            self._build_kernels()
        super().run()
        status = os.path.join(os.path.dirname(self.get_ext_fullpath("pasa_npu._ascendc_emu")),
                              _load_by_path("_pasa_npu_install_record", "pasa_npu",
                                            "install_record.py").STATUS_FILE)
        with open(status, "w") as f:
            f.write(f"built for {self.npu_build.soc}\n" if self.npu_build else f"skipped: {self.npu_why}\n")

    def _build_kernels(self):
        """CANN's CMake on ascend_kernels/: the kernel library (copied next to the extensions)
        and its aclrtlaunch_* headers, which the binding compiles and links against."""
        build = self.npu_build
        cmake_dir = os.path.join(os.path.abspath(self.build_temp), "ascend_kernels")
        subprocess.check_call(["cmake", "-S", os.path.join(HERE, "ascend_kernels"), "-B", cmake_dir,
                               f"-DASCEND_CANN_PACKAGE_PATH={build.cann}", f"-DSOC_VERSION={build.soc}",
                               "-DCMAKE_BUILD_TYPE=Release"])
        subprocess.check_call(["cmake", "--build", cmake_dir, "-j"])
        libs = glob.glob(os.path.join(cmake_dir, "**", "libpasa_npu_kernels.so"), recursive=True)
        headers = glob.glob(os.path.join(cmake_dir, "**", "aclrtlaunch_pasa_attention.h"), recursive=True)
        if not libs or not headers:
            raise SystemExit(f"pasa_npu: CANN's CMake build in {cmake_dir} produced no "
                             f"libpasa_npu_kernels.so or no aclrtlaunch_pasa_attention.h")
        binding = next(e for e in self.extensions if e.name == "pasa_npu._npu")
        binding.include_dirs.insert(0, os.path.dirname(headers[0]))
        binding.library_dirs.insert(0, os.path.dirname(libs[0]))
        target = os.path.dirname(self.get_ext_fullpath("pasa_npu._npu"))
        os.makedirs(target, exist_ok=True)
        shutil.copy2(libs[0], target)


class BuildPy(build_py):
    """build_py without DEV_PACKAGE (nor its subpackages)."""

    def find_package_modules(self, package, package_dir):
        if package == DEV_PACKAGE or package.startswith(DEV_PACKAGE + "."):
            return []
        return super().find_package_modules(package, package_dir)


def _binding_extension(build):
    """pasa_npu._npu, the torch_npu binding, through torch_npu's NpuExtension; the directories
    of the kernel library and its launch headers are added once CMake has built them."""
    try:
        import torch
        from torch_npu.utils.cpp_extension import NpuExtension
    except ImportError as exc:
        raise SystemExit(f"pasa_npu: torch_npu is installed but does not import: {exc}") from None
    return NpuExtension(
        "pasa_npu._npu",
        sources=["ascend_kernels/binding/pasa_torch_npu.cpp", "ascend_kernels/host/pasa_launcher.cpp",
                 "ascend_kernels/host/pasa_tiling.cpp", "ascend_kernels/host/pasa_acl_runtime.cpp"],
        include_dirs=["ascend_kernels/host", "ascend_kernels/kernels", os.path.join(build.cann, "include")],
        library_dirs=[os.path.join(build.cann, "lib64")],
        libraries=["pasa_npu_kernels", "ascendcl"],
        extra_compile_args=["-std=c++20", "-O2",
                            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"],
        extra_link_args=["-Wl,-rpath,$ORIGIN"],
    )


# pasa_npu.integrations: the versions tested (the diffusers backend uses its dispatcher's
# registry, which diffusers does not offer as an API)
TRANSFORMERS = "transformers>=5.17,<6"
HF = [TRANSFORMERS, "diffusers>=0.42,<0.43"]
# pasa-compare: plots, .safetensors inputs, capture from Hugging Face models
COMPARE = ["matplotlib>=3.7", "safetensors>=0.4", TRANSFORMERS]

setup(
    name="pasa-npu",
    version="0.1.0",
    description="PASA: overflow-free fp16 flash attention for Ascend NPUs, with Triton and "
                "PyTorch fallbacks",
    python_requires=">=3.10",
    packages=["pasa_npu", "pasa_npu.fallback", "pasa_npu.fallback.torch", "pasa_npu.fallback.triton",
              "pasa_npu.fallback.gluon", "pasa_npu.integrations", "pasa_npu.tools",
              "pasa_npu.tools.compare"],
    package_dir={"pasa_npu": "pasa_npu", "pasa_npu.fallback": "fallback",
                 "pasa_npu.tools": "tools"},
    ext_modules=[_emulation_extension()],
    cmdclass={"build_ext": BuildExt, "build_py": BuildPy},
    install_requires=["torch>=2.4", "numpy"],
    extras_require={
        "compare": COMPARE,
        # the suite runs pasa-compare end to end (plots, .safetensors, Hugging Face capture),
        # the Hugging Face integrations and the Triton kernels under Triton's CPU interpreter:
        # 3.6 matches the GPU image, and its interpreter needs numpy < 2.4; pytest-xdist for
        # the README's `-n auto`; pybind11 for the tests that run setup.py's NPU decision
        # without build isolation; yunchang for PASA inside its sequence-parallel attention
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6", "pybind11>=2.10",
                 "triton==3.6.0; platform_system == 'Linux'", "numpy<2.4", "yunchang==0.6.4"]
                + COMPARE + HF,
        "sequence-parallel": ["yunchang==0.6.4"],
        "gpu": ["triton>=3.0"],
        "hf": HF,
    },
    entry_points={"console_scripts": ["pasa-beta=pasa_npu.tools.beta:main",
                                      "pasa-compare=pasa_npu.tools.compare.cli:main",
                                      "pasa-bench=pasa_npu.tools.bench:main",
                                      "pasa-npu-model=pasa_npu.tools.npu_model:main"]},
)
