"""Build of pasa_npu. ``fallback/`` and ``tools/`` install as ``pasa_npu.fallback`` and
``pasa_npu.tools``; nothing else lands in site-packages, and of ``tools/`` not the
development tools (DEV_MODULES).

The extension ``pasa_npu._ascendc_emu`` compiles the AscendC kernel sources of
``ascend_kernels/`` against the project's CPU emulation of the AscendC API (g++ and pybind11,
any machine). When ``ASCEND_HOME_PATH`` points at a CANN toolkit, the same sources are also
built for the NPU through ``ascend_kernels/CMakeLists.txt``."""
import glob
import os
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

#: modules of tools/ that are run from a checkout and never installed (the mutation check)
DEV_MODULES = {("pasa_npu.tools", "mutation_check"), ("pasa_npu.tools", "mutation_list")}


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
        # no FMA contraction: the emulated vector steps round exactly where the kernel rounds
        extra_compile_args=["-std=c++17", "-O2", "-ffp-contract=off", "-fvisibility=hidden"],
        extra_link_args=["-pthread"],
    )


class BuildExt(build_ext):
    """build_ext plus, with a CANN toolkit (ASCEND_HOME_PATH), the NPU kernels via CMake."""

    def run(self):
        super().run()
        cann = os.environ.get("ASCEND_HOME_PATH")
        if cann:
            self._build_npu(cann)

    def _build_npu(self, cann):
        build_dir = os.path.join(self.build_temp, "ascend_kernels")
        soc = os.environ.get("PASA_NPU_SOC_VERSION", "Ascend910B1")
        subprocess.check_call(["cmake", "-S", "ascend_kernels", "-B", build_dir,
                               f"-DASCEND_CANN_PACKAGE_PATH={cann}", f"-DSOC_VERSION={soc}",
                               "-DCMAKE_BUILD_TYPE=Release"])
        subprocess.check_call(["cmake", "--build", build_dir, "-j"])
        target = os.path.join(os.path.dirname(self.get_ext_fullpath("pasa_npu._ascendc_emu")))
        for lib in glob.glob(os.path.join(build_dir, "**", "libpasa_npu_*.so"), recursive=True):
            shutil.copy2(lib, target)


class BuildPy(build_py):
    """build_py without DEV_MODULES."""

    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir)
                if m[:2] not in DEV_MODULES]


# pasa-compare: plots, .safetensors inputs, capture from Hugging Face models
COMPARE = ["matplotlib>=3.7", "safetensors>=0.4", "transformers>=4.48"]

setup(
    name="pasa-npu",
    version="0.1.0",
    description="PASA: overflow-free fp16 flash attention for Ascend NPUs, with Triton and "
                "PyTorch fallbacks",
    python_requires=">=3.10",
    packages=["pasa_npu", "pasa_npu.fallback", "pasa_npu.tools", "pasa_npu.tools.compare"],
    package_dir={"pasa_npu": "pasa_npu", "pasa_npu.fallback": "fallback",
                 "pasa_npu.tools": "tools"},
    ext_modules=[_emulation_extension()],
    cmdclass={"build_ext": BuildExt, "build_py": BuildPy},
    install_requires=["torch>=2.4", "numpy"],
    extras_require={
        "compare": COMPARE,
        # the suite runs pasa-compare end to end (plots, .safetensors, Hugging Face capture)
        # and the Triton kernels under Triton's CPU interpreter: 3.6 matches the GPU image,
        # and its interpreter needs numpy < 2.4; pytest-xdist for the README's `-n auto`
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6",
                 "triton==3.6.0; platform_system == 'Linux'", "numpy<2.4"] + COMPARE,
        "gpu": ["triton>=3.0"],
    },
    entry_points={"console_scripts": ["pasa-beta=pasa_npu.tools.beta:main",
                                      "pasa-compare=pasa_npu.tools.compare.cli:main",
                                      "pasa-bench=pasa_npu.tools.bench:main"]},
)
