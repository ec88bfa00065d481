"""Build of pasa_npu. ``fallback/`` and ``tools/`` install as ``pasa_npu.fallback`` and
``pasa_npu.tools``; nothing else lands in site-packages."""
from setuptools import setup

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
    install_requires=["torch>=2.4", "numpy"],
    extras_require={
        "compare": COMPARE,
        # the suite runs pasa-compare end to end (plots, .safetensors, Hugging Face capture)
        # and the Triton kernels under Triton's CPU interpreter: 3.6 matches the GPU image,
        # and its interpreter needs numpy < 2.4
        "test": ["pytest>=7", "hypothesis>=6", "triton==3.6.0; platform_system == 'Linux'",
                 "numpy<2.4"] + COMPARE,
        "gpu": ["triton>=3.0"],
    },
    entry_points={"console_scripts": ["pasa-beta=pasa_npu.tools.beta:main",
                                      "pasa-compare=pasa_npu.tools.compare.cli:main",
                                      "pasa-bench=pasa_npu.tools.bench:main"]},
)
