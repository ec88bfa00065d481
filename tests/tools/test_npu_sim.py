"""pasa-npu-model --sim: the instruction-level model of the simulator beside the emulation's, on
the calibration problems (here of one kv block, the smallest); and its refusal where the
simulator cannot be built."""
from __future__ import annotations

import pytest

pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")
from pasa_npu import npu_params, sim_build  # noqa: E402
from pasa_npu.tools import npu_model, npu_sim  # noqa: E402
from pasa_npu.tools.npu_extrapolate import Shape  # noqa: E402

REASON = sim_build.why_not()


@pytest.mark.skipif(REASON is not None, reason=f"ascendc-sim: {REASON}")
def test_sim_model_times_the_calibration_runs_sanely():
    shape = Shape("tiny", 1, 2, 2, 512, 512, 64)
    result = npu_sim.compare([shape], ["fa-fp32"], npu_params.values(), blocks=1)
    row = result["rows"][0]
    assert row["golden_rmse"] < 1e-2  # the runs' outputs on the simulator met the golden (emulate checks)
    for model in ("emu", "sim"):
        got = row[model]
        assert got["cycles"] > 0 and got["tflops"] > 0, (model, got)
        for pipe in npu_sim.PIPES:
            assert 0 <= got["busy"][pipe] <= got["cycles"] * (1 + 1e-9), (model, pipe, got)
    # the cube's work is the same instructions in both models
    assert row["sim"]["busy"]["M"] == pytest.approx(row["emu"]["busy"]["M"])
    text = npu_sim.markdown(result)
    assert row["tile"] in {f"{q}x{kv}" for q in (128, 256) for kv in (128, 256, 512)}  # fa-fp32 takes no 1024
    assert f"| tiny | fa-fp32 | {row['tile']} |" in text and "**Modelled**" in text


@pytest.mark.skipif(REASON is not None, reason=f"ascendc-sim: {REASON}")
def test_both_models_run_the_calibration_at_the_configs_tiling():
    """calibrate_both runs its problems at the tiling of its config."""
    from pasa_npu import ascendc_emu
    config = Shape("tiny", 1, 1, 1, 512, 512, 64).config("fa-fp32", 256, 256)
    npu_sim.calibrate_both(config, npu_params.values(), blocks=1)
    tiling = ascendc_emu.last_run_stats()["tiling"]
    assert (tiling["q_tile"], tiling["kv_block"]) == (256, 256), tiling


@pytest.mark.skipif(REASON is not None, reason=f"ascendc-sim: {REASON}")
def test_one_call_reports_per_core_cycles_busy_pipes_and_gm_bytes():
    config = Shape("tiny", 1, 1, 1, 128, 128, 64).config("pasa")
    params = npu_params.values()
    _, _, checks = npu_sim.calibrate_both(config, params, blocks=1)
    from pasa_npu.ascendc_sim import Both

    proxy = Both(npu_sim.ascendc_emu._ascendc_emu, npu_sim.program(), caller_gets="sim")
    saved, npu_sim.ascendc_emu._ascendc_emu = npu_sim.ascendc_emu._ascendc_emu, proxy
    try:  # the key preprocessing in a launch of its own, then inside the attention launch
        npu_sim.emulate("pasa", 1, 1, 1, 128, 128, 64, False, dict(params, core_num=1), prep_launch=1)
        npu_sim.emulate("pasa", 1, 1, 1, 128, 128, 64, False, dict(params, core_num=1))
    finally:
        npu_sim.ascendc_emu._ascendc_emu = saved
    launches = proxy.calls[-2]["launches"]
    kernels = [launch["kernel"] for launch in launches]
    assert kernels[:2] == ["shift_keys", "attention"], kernels
    assert [launch["kernel"] for launch in proxy.calls[-1]["launches"]][:1] == ["attention"]
    assert proxy.calls[-1]["emu"] == proxy.calls[-1]["sim"] == proxy.calls[-2]["sim"]
    for launch in launches:
        for core in launch["cores"]:
            assert core["cycles"] > 0
            assert all(0 <= core["busy"][p] <= core["cycles"] for p in npu_sim.PIPES), core
    attention = npu_sim.launch_stats(launches[1], dict(params, core_num=1))
    assert attention["gm_to_l1_bytes"] > 0 and attention["l0c_to_gm_bytes"] > 0
    assert attention["gm_to_ub_bytes"] > 0 and attention["ub_to_gm_bytes"] > 0
    assert attention["pipe_instructions"]["M"] > 0 and attention["vector_instructions"] > 0
    assert checks["identical"]


def test_sim_refuses_clearly_without_the_simulator(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sim_build, "why_not", lambda: "the asc-devkit headers are absent (for this test)")
    assert npu_model.main(["--sim", "--quiet", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--sim needs the instruction-level simulator" in err and "asc-devkit headers are absent" in err
