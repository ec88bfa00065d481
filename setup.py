"""Build of pasa_npu. ``fallback/`` and ``tools/`` install as ``pasa_npu.fallback`` and
``pasa_npu.tools``; nothing else lands in site-packages."""
from setuptools import setup

setup(
    name="pasa-npu",
    version="0.1.0",
    description="PASA: overflow-free fp16 flash attention for Ascend NPUs, with Triton and "
                "PyTorch fallbacks",
    python_requires=">=3.10",
    packages=["pasa_npu", "pasa_npu.fallback", "pasa_npu.tools"],
    package_dir={"pasa_npu": "pasa_npu", "pasa_npu.fallback": "fallback",
                 "pasa_npu.tools": "tools"},
    install_requires=["torch>=2.4", "numpy"],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6"],
        "gpu": ["triton>=3.0"],
    },
    entry_points={"console_scripts": ["pasa-beta=pasa_npu.tools.beta:main",
                                      "pasa-sweep=pasa_npu.tools.sweep:main"]},
)
