"""Every Triton kernel variant compiles for the H100 (sm_90) and fits its shared memory,
checked without a GPU through Triton's own compiler and ptxas."""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed")
aot = pytest.importorskip("pasa_npu.tools.triton_aot")

VARIANTS = list(aot.variants(128))


@pytest.mark.parametrize("kernel,label,consts,warps,stages,fusion", VARIANTS,
                         ids=[v[1] for v in VARIANTS])
def test_compiles_for_sm90(kernel, label, consts, warps, stages, fusion):
    compiled = aot.compile_variant(kernel, consts, warps, stages, fusion)
    assert compiled.metadata.shared <= aot.SHARED_LIMIT, compiled.metadata.shared
