"""pasa-npu-model: the extrapolation from small emulated problems reproduces a direct
emulation, the parameter table in the docs is the one in pasa_npu/npu_params.py, the tool's
report says it is a model, the calibration against measured figures runs, and the sensitivity
search finds the worst corner."""
from __future__ import annotations

import functools
import itertools
import json
import pathlib
import re

import pytest

emu = pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")
from pasa_npu import npu_params  # noqa: E402
from pasa_npu.tools import npu_calibrate, npu_extrapolate, npu_model  # noqa: E402

#: the model's parameters by name
PARAMS = {p.name: p for p in npu_params.ALL}

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("algorithm,causal,d,q_block,kv_block", [
    ("pasa", True, 64, 128, 128), ("fa-fp32", False, 64, 128, 128), ("fa-fp32", False, 128, 256, 128),
    ("pasa", True, 128, 256, 128), ("fa-fp32", False, 128, 256, 256), ("pasa", False, 128, 256, 256)])
def test_extrapolation_matches_a_direct_emulation(algorithm, causal, d, q_block, kv_block):
    """(1, 4, 1024, d) on 4 AI Cores: the fit from one-core calibrations, summed over the tasks
    the kernel deals, against the emulation of the whole problem; also at q_block 256, whose
    tiles the cube multiplies in pieces and the vector cores work on in chunks, and with 256-key
    blocks (pasa's shift matrix then multiplied in pieces of its rows)."""
    got = npu_extrapolate.validate(algorithm, d=d, causal=causal, cores=4, q_block=q_block, kv_block=kv_block)
    assert abs(got["error"]) < 0.03, got


def test_pasa_takes_its_row_sums_of_p_where_they_are_faster():
    """pasa is modelled at each tiling with its row sums of P' on the cube and on the vector
    cores (``vsums`` in the reports) and takes the faster: at 128 x 256 tiles, d = 128, the
    vector cores where their instructions start up fast and the cube's Mmads slowly, the cube
    the other way round. The other allocations have no such choice."""
    shape = npu_extrapolate.Shape("24 heads", 1, 24, 24, 256, 1024, 128)
    tiling = ((128, 256),)
    assert [c.vector_prob_sums for c in npu_extrapolate.candidates(shape, "pasa", tiling)] == [False, True]
    assert [c.vector_prob_sums for c in npu_extrapolate.candidates(shape, "fa-fp32", tiling)] == [False]
    fits = {}

    def fit(config, params, only=None):
        if only is not None and config.vector_prob_sums != only:
            raise NotImplementedError("the other place of the row sums")
        return npu_extrapolate.cached_calibration(fits, (config, tuple(sorted(params.items()))), config, params)

    for vector, cube in (("low", "high"), ("high", "low")):
        params = npu_params.values(vec_head_cycles=getattr(PARAMS["vec_head_cycles"], vector),
                                   mmad_head_cycles=getattr(PARAMS["mmad_head_cycles"], cube))
        config, result = npu_extrapolate.fastest(shape, "pasa", params, fit, tiling)
        alone = {v: npu_extrapolate.fastest(shape, "pasa", params, lambda c, p, v=v: fit(c, p, v), tiling)[1]["tflops"]
                 for v in (False, True)}
        assert config.vector_prob_sums == (vector == "low"), (vector, alone)
        assert result["tflops"] == max(alone.values()) > min(alone.values()), (vector, alone)
        assert config.tile == ("128x256 vsums" if vector == "low" else "128x256")


@pytest.mark.parametrize("algorithm", ["pasa", "pasa-exact", "fa-fp32"])
def test_extrapolation_of_a_gqa_prefill_matches_a_direct_emulation(algorithm):
    """(1, 4, 1024, 128) with one kv head on 4 AI Cores: a query longer than a tile is dealt in
    tiles of one head (Q in L1 as Zz), calibrated as a group of one."""
    shape = npu_extrapolate.Shape("gqa", 1, 4, 1, 1024, 1024, 128, True)
    assert shape.config(algorithm, 256, 256).group == 1
    assert npu_extrapolate.Shape("short", 1, 4, 1, 64, 1024, 128).config(algorithm, 256, 256).group == 4
    got = npu_extrapolate.validate(algorithm, d=128, causal=True, cores=4, q_block=256, kv_block=256, hkv=1)
    assert abs(got["error"]) < 0.03, got


@pytest.mark.parametrize("cores", [3, 4])
def test_extrapolation_of_short_tasks_matches_a_direct_emulation(cores):
    """(1, 4, 1280, 128) at 256 x 256 on 3 and 4 AI Cores: tasks of five kv blocks, five to seven
    a core, as at the paper's shape. A task of few blocks costs more than a long task's blocks
    say (the next task's start is not hidden behind its pipeline), so it is calibrated on a
    stream of tasks of its own length."""
    got = npu_extrapolate.validate("pasa", d=128, causal=False, cores=cores, q_block=256, kv_block=256, seq=1280)
    assert abs(got["error"]) < 0.005, got


@pytest.mark.parametrize("algorithm,kv_block", [("pasa", 128), ("pasa", 256), ("pasa-exact", 256)])
def test_preprocessing_costs_what_it_adds_to_the_attention_launch(algorithm, kv_block):
    """The key preprocessing runs at the start of the attention launch; calibrated in a launch
    of its own, it also pays that launch's start and tiling read, which the attention launch
    makes once. With slow scalar GM reads, on 4 AI Cores: the model's preprocessing share
    (constant, blocks per core, the barrier's hops) is what the emulated preprocessing adds to
    the attention launch's timeline."""
    params = dict(npu_params.values(scalar_gm_access_cycles=40), core_num=4)
    problem = (1, 4, 4, 512, 1024, 128, False, params, 128, kv_block)  # b, h, hkv, sq, skv, d, ...
    fused = npu_extrapolate.emulate(algorithm, *problem)
    apart = npu_extrapolate.emulate(algorithm, *problem, prep_launch=1)
    added = fused["attention"]["timeline_cycles"] - apart["attention"]["timeline_cycles"]
    fit = npu_extrapolate.calibrate(npu_extrapolate.Config(algorithm, 128, 1, False, False, 128, kv_block), params)
    c0, per_block = fit.prep["timeline_cycles"]
    blocks_per_core = -(-4 * (1024 // kv_block) // 4)
    modelled = c0 + per_block * blocks_per_core + 3 * params["cross_core_latency_cycles"]
    assert abs(modelled / added - 1) < 0.02, (modelled, added)
    # A launch of its own reads the tiling again: its first preload's fill (the others issued
    # while it lands), then a hit per 8-byte load; the batch records' line, which the fused
    # launch's attention finds cached, misses once more; it skips the barrier's three hops.
    own_launch = apart["preprocess"]["timeline_cycles"]
    hit, miss = params["scalar_gm_access_cycles"], params["gm_read_latency_cycles"]
    tiling_read = params["scalar_issue_cycles"] + miss + emu.tiling_data_bytes // 8 * hit
    expected = tiling_read + (miss - hit) - 3 * params["cross_core_latency_cycles"]
    assert own_launch - added == pytest.approx(expected, abs=1), (own_launch, added, expected)


@pytest.mark.parametrize("algorithm,causal,d,q_block,kv_block", [
    ("pasa", False, 128, 256, 256), ("pasa", True, 64, 128, 128), ("fa-fp32", False, 128, 256, 256)])
def test_extrapolation_of_tail_pieces_matches_a_direct_emulation(algorithm, causal, d, q_block, kv_block):
    """(1, 4, 1024, d) on 5 AI Cores, whose last round the kernel deals in pieces of query rows:
    the pieces' costs from fits of their own row count, against the emulation of the whole
    problem."""
    params = dict(npu_params.values(), core_num=5)
    shape = npu_extrapolate.Shape("validate", 1, 4, 4, 1024, 1024, d, causal)
    parts = npu_extrapolate.part_configs(shape, shape.config(algorithm, q_block, kv_block), params)
    assert parts and all(0 < c.rows < q_block for c in parts), parts
    got = npu_extrapolate.validate(algorithm, d=d, causal=causal, cores=5, q_block=q_block, kv_block=kv_block)
    assert abs(got["error"]) < 0.03, got


def test_each_allocation_is_reported_at_its_fastest_tiling():
    """Each figure is the allocation's at the tiling of npu_extrapolate.tilings (q_block x kv_block)
    where the model finds it fastest (nominal parameters) among those the kernels take, and says
    which; decode has one q_block."""
    params = npu_params.values()
    prefill = npu_extrapolate.Shape("tiny", 1, 4, 4, 512, 512, 128)
    decode = npu_extrapolate.Shape("tiny decode", 4, 8, 2, 1, 1024, 128)
    result = npu_model.run([prefill, decode], ("fa-fp32",), band=False, progress=lambda *a: None)
    speed, refused = {}, []
    for tile in npu_extrapolate.tilings(prefill):
        try:
            fit = npu_extrapolate.calibrate(prefill.config("fa-fp32", *tile), params)
        except NotImplementedError as exc:
            assert "attention UB" in str(exc)  # fa-fp32's fp32 score rows of 1024 keys
            refused.append(tile)
            continue
        speed[tile] = npu_extrapolate.extrapolate(prefill, fit, params)["tflops"]
    assert sorted([*speed, *refused]) == [(q, kv) for q in (128, 256) for kv in (128, 256, 512, 1024)]
    assert refused == [(128, 1024), (256, 1024)]
    cell = result["rows"][0]["fa-fp32"]
    assert (cell["q_block"], cell["kv_block"]) == max(speed, key=speed.get)
    assert cell["tflops"] == pytest.approx(max(speed.values()))
    assert f"{cell['q_block']}x{cell['kv_block']})" in npu_model.markdown(result)
    assert result["rows"][1]["fa-fp32"]["q_block"] == npu_extrapolate.Q_BLOCKS[0]


def test_a_tiling_the_kernels_refuse_is_not_a_candidate():
    """pasa-exact at d = 256 does not fit L1 with 256-key blocks (K and V, two buffers each, take
    512 KiB): the host refuses those tilings, and the model takes the fastest of the others."""
    params = npu_params.values()
    shape = npu_extrapolate.Shape("tiny", 1, 2, 2, 512, 512, 256)
    with pytest.raises(NotImplementedError, match="attention L1 needs"):
        npu_extrapolate.calibrate(shape.config("pasa-exact", 256, 256), params)
    config, result = npu_extrapolate.fastest(shape, "pasa-exact", params, npu_extrapolate.calibrate)
    assert config.kv_block == 128 and result["tflops"] > 0


@functools.lru_cache(maxsize=None)
def _tiny_report(jobs: int) -> str:
    """npu_model.run's result (as JSON, so that no test changes another's) for a small causal
    shape, fa-fp32 and pasa with their band, its calibrations made by ``jobs`` processes."""
    shape = npu_extrapolate.Shape("tiny", 1, 2, 2, 512, 512, 64, causal=True)
    return json.dumps(npu_model.run([shape], ("fa-fp32", "pasa"), band=True, progress=lambda *a: None, jobs=jobs))


@pytest.mark.xdist_group("npu_model_tiny_report")
def test_report_is_labelled_a_model():
    result = json.loads(_tiny_report(1))
    text = npu_model.markdown(result)
    assert text.startswith("**Modelled**") and "not measured on an NPU" in text
    cell = result["rows"][0]["pasa"]
    assert cell["band"][0] <= cell["tflops"] <= cell["band"][1]
    assert cell["binding"] in ("S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX", "RD", "WR", "L2", "HBM", "path")


@pytest.mark.xdist_group("npu_model_tiny_report")
def test_report_from_several_processes_is_the_same():
    """The calibrations made by two processes give the figures one process gives, band
    included."""
    one, two = (json.loads(_tiny_report(jobs)) for jobs in (1, 2))
    assert npu_model.markdown(one) == npu_model.markdown(two)


def test_every_timed_run_is_checked_against_the_golden(monkeypatch, tmp_path):
    """Each emulated run carries its error against the fp64 golden into the figure fitted from
    it; a run whose output is wrong is refused, naming the run, and no figure is reported (nor
    the output folder left)."""
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
    out = tmp_path / "never" / "written"
    assert npu_model.main(["--sets", "paper", "--algorithms", "pasa", "--no-band", "--quiet", "--out", str(out)]) == 1
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("factor,counts", [(1.3, True), (1.8, False)])
def test_the_golden_check_takes_rounding_order_and_refuses_more(monkeypatch, factor, counts):
    """A run counts while its error against the fp64 golden is within GOLDEN_FACTOR (1.5) x the
    torch backend's, as the golden matrix's bounds: here the emulated output is the golden plus
    ``factor`` x the torch backend's error."""
    assert npu_extrapolate.GOLDEN_FACTOR == 1.5
    real_run = npu_extrapolate.pasa_npu.fused_attention

    def scaled_error(q, k, v, backend, **kw):
        out, lse = real_run(q, k, v, backend=backend, **kw)
        if backend != "ascendc-emu":
            return out, lse
        ref, _ = real_run(q, k, v, backend="torch", **{a: b for a, b in kw.items() if a != "q_block"})
        gold, _ = npu_extrapolate.pasa_npu.reference_attention(
            q, k, v, **{a: b for a, b in kw.items() if a not in ("q_block", "kv_block", "algorithm")})
        return (gold + factor * (ref.double() - gold)).to(out.dtype), lse

    monkeypatch.setattr(npu_extrapolate.pasa_npu, "fused_attention", scaled_error)
    args = ("pasa", 1, 2, 2, 256, 512, 64, False, npu_params.values())
    if counts:
        stats = npu_extrapolate.emulate(*args)
        assert 1.2 < stats["golden_rmse"] / stats["torch_rmse"] < 1.4
    else:
        with pytest.raises(npu_extrapolate.WrongRunError, match="timing is not reported"):
            npu_extrapolate.emulate(*args)


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


def test_calibration_compares_with_the_measured_figures(tmp_path, monkeypatch):
    """--calibrate writes both comparisons: PTO FA's stage fit per 256-key tile (QK + PV =
    2487 + 1617 = 4104 on the cube, softmax + update = 2489 + 834 = 3323 on the vector cores)
    and the 910B2 timings (torch_npu 150.8 and PTO 168.5 TFLOP/s at 32k), next to the model's
    figures, labelled as such."""
    sizes = (1024, 32768)  # the first and last of the measured figures; the others only repeat the rows
    monkeypatch.setattr(npu_calibrate, "MEASURED_910B2", {s: npu_calibrate.MEASURED_910B2[s] for s in sizes})
    # the report's modelled figures at the two smallest tilings, the per-tile one's among them:
    # which tiling is the fastest is test_each_allocation_is_reported_at_its_fastest_tiling's
    monkeypatch.setattr(npu_extrapolate, "Q_BLOCKS", (128,))
    monkeypatch.setattr(npu_extrapolate, "KV_BLOCKS", (128, npu_calibrate.TILE_KEYS))
    assert npu_model.main(["--calibrate", "--quiet", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "npu_calibrate.md").read_text()
    assert "| 4104 |" in text and "| 3323 |" in text and "(5104 on the board)" in text
    assert "| 32k | 150.8 | 168.5 |" in text and "| 1k | 9.2 | 25.6 |" in text
    assert text.count("**modelled**") == 2 and "measured" in text
    # 640 KiB per tile (S fp32, P fp16, P.V fp32 out and back; K, V in) at 168.5 TFLOP/s on
    # 24 cores at 1800 MHz: a tile is 4 * 128 * 256 * 128 = 16 777 216 FLOP on one core, and
    # 24 such tiles take 16 777 216 * 24 / 168.5e12 s = 4301 cycles
    assert npu_calibrate.PTO_TILE_GM_BYTES == 640 * 1024
    assert npu_calibrate.implied_l2_bytes_per_cycle(168.5) == pytest.approx(640 * 1024 * 24 / 4301, rel=1e-3)


#: the grids' calibrations, kept for the tests of this module in one process by the search's
#: own key, which leaves out the parameters that enter only the launch total
#: (test_launch_only_parameters_leave_the_calibration_alone)
_GRID_FITS = {}


def _grid_fit(config, params):
    return npu_extrapolate.cached_calibration(_GRID_FITS, npu_model.calibration_key(config, params), config, params)


def _ratio(shape, params, pasa_tilings=None):
    """pasa / fa-fp32 modelled TFLOP/s of ``shape`` under ``params``: fa-fp32 at its fastest
    tiling, pasa at its fastest among the (q_block, kv_block) ``pasa_tilings`` or among all."""
    fa = npu_extrapolate.fastest(shape, "fa-fp32", params, _grid_fit)[1]
    pasa = npu_extrapolate.fastest(shape, "pasa", params, _grid_fit, pasa_tilings)[1]
    return pasa["tflops"] / fa["tflops"]


def test_launch_only_parameters_leave_the_calibration_alone():
    """The search calibrates once for every value of the parameters that enter only the launch
    total (the aggregate L2 and HBM rates, the launch overhead): at the other end of each one's
    range an emulated run's launch figure moves, and a calibration's fit is the nominal one."""
    shape = npu_extrapolate.Shape("tiny", 1, 2, 2, 512, 512, 64)
    config = shape.config("pasa", 128, 256)
    nominal = npu_extrapolate.calibrate(config, npu_params.values())

    def launch(params):
        att = npu_extrapolate.emulate("pasa", 1, 2, 2, 512, 512, 64, False, dict(params, core_num=2), 128, 256)
        return att["attention"]

    moves = dict(l2_aggregate_bytes_per_cycle="l2_bound_cycles", hbm_aggregate_bytes_per_cycle="hbm_bound_cycles",
                 launch_overhead_cycles="cycles")
    assert set(moves) == set(npu_model._LAUNCH_ONLY)
    base = launch(npu_params.values())
    for name, figure in moves.items():
        p = PARAMS[name]
        params = npu_params.values(**{name: p.high if p.value != p.high else p.low})
        assert launch(params)[figure] != base[figure], name
        got = npu_extrapolate.calibrate(config, params)
        assert (got.coef, got.prep, got.golden_rmse) == (nominal.coef, nominal.prep, nominal.golden_rmse), name


def _nominal_tiling(shape, algorithm):
    config, _ = npu_extrapolate.fastest(shape, algorithm, npu_params.values(), npu_extrapolate.calibrate)
    return config.q_block, config.kv_block


def test_sensitivity_moves_one_parameter_at_a_time_to_a_corner_no_parameter_alone_shows(monkeypatch):
    """The search on a made-up ratio of two parameters (no calibration): it starts where each
    parameter alone lowered the ratio (vec_head_cycles low, mmad_head_cycles nominal), then
    moves one parameter at a time to its low, nominal or high value while the ratio falls, so in
    one pass it ends at mmad_head_cycles' high end, which raised the ratio alone (from the
    nominal point one pass would end at vec_head_cycles' low end only)."""
    vec, mmad = PARAMS["vec_head_cycles"], PARAMS["mmad_head_cycles"]
    made_up = {(vec.value, mmad.value): 1.10, (vec.low, mmad.value): 1.00, (vec.high, mmad.value): 1.05,
               (vec.value, mmad.low): 1.12, (vec.value, mmad.high): 1.15, (vec.low, mmad.high): 0.90}
    evaluated = []

    def cell(shape, params, fit, algorithms, only=None):
        point = (params[vec.name], params[mmad.name])
        evaluated.append(point)
        one = dict(q_block=128, kv_block=128, vector_prob_sums=False, golden_rmse=0.0)
        return {"pasa": dict(one, tflops=made_up.get(point, 1.20)), "fa-fp32": dict(one, tflops=1.0),
                "ratio": made_up.get(point, 1.20)}

    monkeypatch.setattr(npu_model, "_ratio_cell", cell)
    monkeypatch.setattr(npu_model, "WORST_CORNER_PASSES", 1)
    shape = npu_extrapolate.Shape("tiny", 1, 2, 2, 512, 512, 64)
    got = npu_model.sensitivity([shape], lambda *a: None, names=(vec.name, mmad.name), seeds=())
    assert got["worst"]["tiny"]["corner"] == {mmad.name: mmad.high, vec.name: vec.low}
    assert got["worst"]["tiny"]["result"]["ratio"] == 0.90
    assert (vec.low, mmad.low) in evaluated  # the pass tried mmad_head_cycles' other end too
    assert got["alone"][mmad.name]["high"]["tiny"]["ratio"] == 1.15


@pytest.mark.xdist_group("npu_model_grid")  # one process: they share the grid's calibrations
def test_sensitivity_finds_the_worst_corner():
    """With two parameters varied, the search's worst corner is the lowest ratio of the 3 x 3
    grid of their low, nominal and high values, each corner evaluated on its own; the one-at-a-
    time rows are the grid's edges through the nominal point. fa-fp32 is tuned again at each
    corner, pasa among its nominal tiling (here of 512 keys) and those of at most 256 keys, so
    no corner's ratio is above the one with both tuned again among every tiling. The search's
    calibrations are made by two processes, the grid's by this one."""
    shape = npu_extrapolate.Shape("tiny", 1, 24, 24, 512, 2048, 64)
    names = ("vec_head_cycles", "l2_aggregate_bytes_per_cycle")
    got = npu_model.sensitivity([shape], lambda *a: None, names=names, jobs=2)
    nominal_tiling = _nominal_tiling(shape, "pasa")
    assert nominal_tiling[1] > 256
    searched = (nominal_tiling, (128, 128), (128, 256), (256, 128), (256, 256))
    assert set(npu_model.search_tilings(shape, nominal_tiling)) == set(searched)
    grid = {}
    for a, b in itertools.product(*[(PARAMS[n].low, PARAMS[n].value, PARAMS[n].high) for n in names]):
        grid[(a, b)] = _ratio(shape, npu_params.values(**dict(zip(names, (a, b)))), searched)
    worst = got["worst"]["tiny"]
    assert (worst["result"]["pasa"]["q_block"], worst["result"]["pasa"]["kv_block"]) in searched
    both_tuned = _ratio(shape, npu_params.values(**worst["corner"]))
    assert worst["tuned"]["ratio"] == pytest.approx(both_tuned, rel=1e-9)
    assert worst["result"]["ratio"] <= both_tuned + 1e-12
    assert worst["result"]["ratio"] == pytest.approx(min(grid.values()), rel=1e-9)
    assert grid[tuple(worst["corner"][n] for n in names)] == pytest.approx(min(grid.values()), rel=1e-9)
    nominal = (PARAMS[names[0]].value, PARAMS[names[1]].value)
    assert got["nominal"]["tiny"]["ratio"] == pytest.approx(grid[nominal], rel=1e-9)
    vec_high = got["alone"][names[0]]["high"]["tiny"]["ratio"]
    assert vec_high == pytest.approx(grid[(PARAMS[names[0]].high, nominal[1])], rel=1e-9)
    text = npu_model.sensitivity_markdown(got)
    assert text.startswith("**Modelled**") and "Worst independent corner" in text
    assert f"| tiny | {got['nominal']['tiny']['ratio']:.2f} | {min(grid.values()):.2f} |" in text
    assert "those of at most 256 keys" in text
    assert f"| {both_tuned:.2f} ({worst['tuned']['pasa']['tflops']:.1f}, " in text


@pytest.mark.xdist_group("npu_model_grid")  # one process: they share the grid's calibrations
def test_sensitivity_starts_from_a_known_corner_below_its_own_start(monkeypatch, tmp_path):
    """A seed (a corner found by an earlier search) lower than the search's own start is where
    the search starts: with no passes, its worst corner is the seed's, at the ratio the seed's
    parameters give evaluated on their own; without the seed it is the one-at-a-time start. A
    seed's parameter off its range's ends is refused, naming it. The seeded search takes the
    calibrations of the first from its cache file."""
    shape = npu_extrapolate.Shape("tiny", 1, 24, 24, 512, 2048, 64)
    names = ("mte2_bytes_per_cycle", "l2_aggregate_bytes_per_cycle")
    monkeypatch.setattr(npu_model, "WORST_CORNER_PASSES", 0)
    cache = str(tmp_path / "fits.pkl")
    own = npu_model.sensitivity([shape], lambda *a: None, names=names, jobs=2, seeds=(), cache=cache)
    searched = npu_model.search_tilings(shape, _nominal_tiling(shape, "pasa"))
    grid = {}
    for a, b in itertools.product(*[(PARAMS[n].low, PARAMS[n].value, PARAMS[n].high) for n in names]):
        grid[(a, b)] = _ratio(shape, npu_params.values(**dict(zip(names, (a, b)))), searched)
    own_corner = tuple(own["worst"]["tiny"]["corner"][n] for n in names)
    lower = [c for c in grid if grid[c] < grid[own_corner] - 1e-9]
    assert lower, "the test needs a grid point below the one-at-a-time start"
    seed = dict(zip(names, min(lower, key=grid.get)))
    seeded = npu_model.sensitivity([shape], lambda *a: None, names=names, jobs=2, cache=cache,
                                   seeds=(dict(seed, mte1_head_cycles=PARAMS["mte1_head_cycles"].high),))
    assert seeded["worst"]["tiny"]["corner"] == seed  # parameters not varied are left nominal
    assert seeded["worst"]["tiny"]["result"]["ratio"] == pytest.approx(grid[tuple(seed.values())], rel=1e-9)
    assert "1 corner found by earlier searches" in npu_model.sensitivity_markdown(seeded)
    with pytest.raises(ValueError, match="vec_head_cycles=7"):
        npu_model.sensitivity([shape], lambda *a: None, names=names, seeds=(dict(vec_head_cycles=7),))


def test_sensitivity_cache_resumes_a_cut_search_with_the_same_figures(monkeypatch, tmp_path):
    """A search cut short keeps the calibrations it made in its cache file; a later search of the
    same build takes them, makes only those it lacks and reports what an uncut search reports. A
    file of another build is refused, naming the file."""
    shape = npu_extrapolate.Shape("tiny", 1, 2, 2, 512, 512, 64)
    names = ("vec_head_cycles", "l2_aggregate_bytes_per_cycle")
    monkeypatch.setattr(npu_model, "WORST_CORNER_PASSES", 1)
    made = []
    calibrate = npu_extrapolate.calibration_or_refusal
    monkeypatch.setattr(npu_extrapolate, "calibration_or_refusal", lambda *a: made.append(a) or calibrate(*a))
    whole = npu_model.sensitivity([shape], lambda *a: None, names=names, seeds=())
    all_made = len(made)
    cache = str(tmp_path / "fits.pkl")

    class Cut(Exception):
        pass

    def cut_after_two_steps(done, total, what):
        if done >= 2:  # the nominal point and vec_head_cycles' low end evaluated
            raise Cut

    made.clear()
    with pytest.raises(Cut):
        npu_model.sensitivity([shape], cut_after_two_steps, names=names, seeds=(), cache=cache)
    kept = len(npu_model.load_calibrations(cache, npu_model.calibration_fingerprint()))
    assert 0 < kept == len(made) < all_made
    made.clear()
    resumed = npu_model.sensitivity([shape], lambda *a: None, names=names, seeds=(), cache=cache)
    assert resumed == whole and len(made) == all_made - kept
    with pytest.raises(npu_model.StaleCacheError, match="fits.pkl"):
        npu_model.load_calibrations(cache, "another build")


def test_known_corners_are_corners_of_the_parameters_ranges():
    """Every corner the sensitivity search is seeded with names parameters that have a range, each
    at one of its three values, and not at the nominal point: a range changed in npu_params
    without its corners is caught here, not an hour into a --sensitivity run."""
    npu_model.check_seeds(npu_model.KNOWN_CORNERS)
    nominal = npu_params.values()
    assert all(any(v != nominal[k] for k, v in c.items()) for c in npu_model.KNOWN_CORNERS)
    with pytest.raises(ValueError, match="clock_mhz=1"):
        npu_model.check_seeds((dict(clock_mhz=1),))


def test_sensitivity_searches_shapes_side_by_side_as_one_by_one(tmp_path):
    """The shapes' worst-corner searches run side by side (one pool batch per step for every
    shape still moving): each shape ends at the corner, and ratio, that its search alone finds.
    The searches alone take the calibrations the first made from its cache file (the same
    figures: test_sensitivity_cache_resumes_a_cut_search_with_the_same_figures)."""
    shapes = [npu_extrapolate.Shape("tiny", 1, 2, 2, 512, 512, 64),
              npu_extrapolate.Shape("tiny d=128", 1, 2, 2, 512, 512, 128)]
    names = ("vec_head_cycles", "l2_aggregate_bytes_per_cycle")  # the L2 rate needs no calibration
    cache = str(tmp_path / "fits.pkl")
    both = npu_model.sensitivity(shapes, lambda *a: None, names=names, jobs=2, cache=cache)
    for shape in shapes:
        alone = npu_model.sensitivity([shape], lambda *a: None, names=names, jobs=2, cache=cache)
        assert both["worst"][shape.name]["corner"] == alone["worst"][shape.name]["corner"]
        assert both["worst"][shape.name]["result"]["ratio"] == alone["worst"][shape.name]["result"]["ratio"]


def test_docs_show_calibration_sensitivity_and_worst_corner():
    """TIMING_MODEL.md carries the output of --calibrate and --sensitivity; the README's NPU
    table gives each row's pasa / fa-fp32 ratio at nominal and at its worst corner (one figure
    where the search's and the one with pasa tuned among every tiling there agree, else both), and quotes
    the paper's claim as it is (1.2-1.65x CANN's FlashAttention, up to 170 TFLOP/s)."""
    doc = (ROOT / "ascend_kernels" / "TIMING_MODEL.md").read_text()
    assert "`pasa-npu-model --calibrate`" in doc and "**Per call on a 910B2**" in doc
    assert "`pasa-npu-model --sensitivity`" in doc and "Worst independent corner per shape" in doc
    readme = (ROOT / "README.md").read_text()
    npu = readme[readme.index("**Atlas A2: a model, not a measurement**"):readme.index("**NVIDIA H100")]
    rows = [line for line in npu.splitlines() if line.startswith("| ") and not line.startswith("| shape")]
    assert len(rows) >= 5
    for row in rows:
        assert re.search(r"\| \d\.\d\d \(\d\.\d\d(-\d\.\d\d)?\) \|", row), row  # nominal (worst corner)
    assert "causal" in next(r for r in rows if "Qwen2" in r)
    assert "HBM" in next(r for r in rows if r.startswith("| decode")).split("|")[3]  # pasa reads K, V once
    assert "1.2-1.65×" in npu and "170 TFLOP/s" in npu


def test_corner_budget_adds_up_to_the_modelled_call():
    """``tools/dev/corner_budget.py``'s terms of the busiest AI Core (launch, constant, key
    preprocessing, tasks, blocks) add up to the call's cycles where its timeline binds: pasa at
    the paper's shape with slow start-ups and flags and a fast L2, in 128 x 256 tiles."""
    from pasa_npu.tools.dev import corner_budget
    shape = npu_extrapolate.Shape("paper", 1, 16, 16, 1280, 1280, 128)
    params = npu_params.values(mmad_head_cycles=64, mte1_head_cycles=48, mte2_head_cycles=64, fix_head_cycles=64,
                               scalar_issue_cycles=4, scalar_gm_access_cycles=40, cross_core_latency_cycles=1000,
                               l2_aggregate_bytes_per_cycle=4324)
    b = corner_budget.budget(shape, "pasa", 128, 256, params)
    assert b["binding"] == "path" and b["tasks"] == 7 and b["blocks"] == 35 and b["prep_blocks"] == 4
    total = (b["launch"] + b["constant"] + b["tasks"] * b["per_task"] + b["blocks"] * b["per_block"]
             + b["prep_constant"] + b["prep_blocks"] * b["prep_per_block"] + b["barrier"])
    assert total == pytest.approx(b["call"], rel=1e-9) and b["timeline"] == pytest.approx(total, rel=1e-12)
    assert b["cube_per_block"] < b["per_block"]
    assert b["coef"]["timeline_cycles"][:3] == (b["constant"], b["per_task"], b["per_block"])
    assert b["coef"]["busy_M"][2] == b["cube_per_block"]
    # the shift's cube work a key block: at least M^T K_j's and the column sums' multiplies (a
    # 16-row fractal of 16 x 16 x 16 a cycle), within the block's timeline
    assert (256 * 256 * 128 + 16 * 256 * 128) / 4096 <= b["prep_cube_per_block"] <= b["prep_per_block"]
    assert b["cube_idle_per_task"] == b["per_task"] - b["coef"]["busy_M"][1] > 0


def test_corner_budget_without_the_preprocessing_is_the_model_without_it():
    """The budget's first what-if (no key preprocessing on the path) is what the model gives
    with the preprocessing's fit taken out, and each later what-if changes the terms it names:
    a task at fa-fp32's cost lowers pasa's call by the tasks' difference where its timeline binds."""
    import dataclasses
    from pasa_npu.tools.dev import corner_budget
    shape = npu_extrapolate.Shape("paper", 1, 16, 16, 1280, 1280, 128)
    params = npu_params.values(mmad_head_cycles=64, mte1_head_cycles=48, mte2_head_cycles=64, fix_head_cycles=64,
                               scalar_issue_cycles=4, scalar_gm_access_cycles=40, cross_core_latency_cycles=1000,
                               l2_aggregate_bytes_per_cycle=4324)
    pasa = corner_budget.budget(shape, "pasa", 128, 256, params)
    fa = corner_budget.budget(shape, "fa-fp32", 128, 256, params)
    what_ifs = dict(corner_budget.what_ifs(pasa, fa))
    fit = npu_extrapolate.calibrate(shape.config("pasa", 128, 256, False), params)
    without = min((npu_extrapolate.extrapolate(shape, dataclasses.replace(fit, prep={}), params, tail_pieces=t)
                   for t in npu_extrapolate.TAIL_CHOICES), key=lambda r: r["cycles"])
    assert pasa["binding"] == without["binding"] == "path"
    assert what_ifs["no key preprocessing on the path"] == pytest.approx(without["cycles"], rel=1e-9)
    assert pasa["call"] - what_ifs["a task at fa-fp32's cost"] == pytest.approx(
        pasa["tasks"] * (pasa["per_task"] - fa["per_task"]), rel=1e-9)
    shifted = what_ifs["key blocks shifted at task boundaries"]
    assert what_ifs["no key preprocessing on the path"] < shifted < pasa["call"]
