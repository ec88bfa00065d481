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


def test_every_timed_run_is_checked_against_the_golden(monkeypatch):
    """Each emulated run carries its error against the fp64 golden into the figure fitted from
    it; a run whose output is wrong is refused, naming the run, and no figure is reported."""
    shape = npu_extrapolate.Shape("tiny", 1, 2, 2, 512, 512, 64, causal=True)
    result = npu_model.run([shape], ("pasa",), band=False, progress=lambda *a: None)
    cell = result["rows"][0]["pasa"]
    assert 0 < cell["golden_rmse"] < 1e-2
    assert f"{cell['golden_rmse']:.1e}" in npu_model.markdown(result)
    real_run = npu_extrapolate.pasa_npu.fused_attention

    def garbage_from_the_kernels(q, k, v, backend, **kw):
        out, lse = real_run(q, k, v, backend=backend, **kw)
        return (out.flip(-2) if backend == "ascendc-emu" else out), lse

    monkeypatch.setattr(npu_extrapolate.pasa_npu, "fused_attention", garbage_from_the_kernels)
    with pytest.raises(npu_extrapolate.WrongRunError, match="timing is not reported"):
        npu_model.run([shape], ("pasa",), band=False, progress=lambda *a: None)
    assert npu_model.main(["--sets", "paper", "--algorithms", "pasa", "--no-band", "--quiet",
                           "--out", "/nonexistent/never-written"]) == 1


def test_timing_doc_carries_the_parameter_table():
    """ascend_kernels/TIMING_MODEL.md shows the table pasa-npu-model --params prints."""
    doc = (ROOT / "ascend_kernels" / "TIMING_MODEL.md").read_text()
    assert npu_model.params_markdown() in doc


def test_cli_shows_defaults_and_says_where_it_wrote(tmp_path, monkeypatch, capsys):
    """--help gives the output folder's default; a run names the folder it wrote into."""
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        npu_model.main(["--help"])
    assert "(default: npu-model-out)" in capsys.readouterr().out
    monkeypatch.setattr(npu_model, "run", lambda *args, **kwargs: {"rows": []})
    monkeypatch.setattr(npu_model, "markdown", lambda result: "table\n")
    out = tmp_path / "model"
    assert npu_model.main(["--out", str(out), "--quiet"]) == 0
    assert capsys.readouterr().out.endswith(f"wrote npu_model.md, npu_model.json to {out}\n")
    assert sorted(p.name for p in out.iterdir()) == ["npu_model.json", "npu_model.md"]
