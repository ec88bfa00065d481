"""pasa-npu-model: the extrapolation from small emulated problems reproduces a direct
emulation, the parameter table in the docs is the one in pasa_npu/npu_params.py, and the
tool's report says it is a model."""
from __future__ import annotations

import pathlib

import pytest

pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")
from pasa_npu.tools import npu_extrapolate, npu_model  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("algorithm,causal", [("pasa", True), ("fa-fp32", False)])
def test_extrapolation_matches_a_direct_emulation(algorithm, causal):
    """(1, 4, 1024, 64) on 4 AI Cores: the fit from one-core calibrations, summed over the tasks
    the kernel deals, against the emulation of the whole problem."""
    got = npu_extrapolate.validate(algorithm, d=64, causal=causal, cores=4)
    assert abs(got["error"]) < 0.03, got


def test_report_is_labelled_a_model(tmp_path):
    shape = npu_extrapolate.Shape("tiny", 1, 2, 2, 512, 512, 64, causal=True)
    result = npu_model.run([shape], ("fa-fp32", "pasa"), band=True, progress=lambda *a: None)
    text = npu_model.markdown(result)
    assert text.startswith("**Modelled**") and "not measured on an NPU" in text
    cell = result["rows"][0]["pasa"]
    assert cell["band"][0] <= cell["tflops"] <= cell["band"][1]
    assert cell["binding"] in ("S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX", "L2", "HBM")


def test_timing_doc_carries_the_parameter_table():
    """ascend_kernels/TIMING_MODEL.md shows the table pasa-npu-model --params prints."""
    doc = (ROOT / "ascend_kernels" / "TIMING_MODEL.md").read_text()
    assert npu_model.params_markdown() in doc
