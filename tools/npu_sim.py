"""``pasa-npu-model --sim``: the instruction-level timing model beside the emulation's.

The simulator (``ascend_kernels/sim``) runs the kernels compiled against Huawei's asc-devkit
headers, so it executes the instructions Huawei's implementation of each AscendC API issues;
its timing model (``sim_timing.h``) charges each of them on its pipe with the parameters of
``pasa_npu/npu_params.py``, by the rules of the emulation's model, which charges the API calls
instead (``ascend_kernels/TIMING_MODEL.md``, "The instruction-level model"). Both time the
same calibration problems of ``tools/npu_extrapolate.py``: each call runs on the emulation and
on the simulator, the simulator's output is checked against the fp64 golden (``emulate``), and
each model's quantities are fitted and extrapolated alike. A model, not a measurement.

Needs a checkout, the asc-devkit headers and g++ (``pasa_npu.sim_build.why_not``).
"""
from __future__ import annotations

import os


from pasa_npu import ascendc_emu
from pasa_npu.tools.npu_extrapolate import (CALIBRATION_BLOCKS, CALIBRATION_TILING, Config, Shape,
                                            cached_calibration, calibration_runs, emulate, extrapolate,
                                            fastest, fit_runs, tile_name)

PIPES = ascendc_emu.PIPES


class SimUnavailable(RuntimeError):
    """The simulator cannot be built here (no checkout, headers or compiler)."""


def program() -> str:
    """The simulator's attention program for the sources as they are
    (:func:`pasa_npu.ascendc_sim.program`); SimUnavailable where it cannot be built here."""
    from pasa_npu import ascendc_sim, sim_build

    reason = sim_build.why_not()
    if reason:
        raise SimUnavailable(f"--sim needs the instruction-level simulator: {reason}")
    return ascendc_sim.program()


def launch_stats(launch: dict, params: dict) -> dict:
    """One simulated launch in the shape of the emulation's per-launch stats (the keys the
    calibration fits read): per AI Core its cores' latest completion and its GM read and write
    port bounds, the busiest core's busy cycles per pipe, bytes per path, V instructions."""
    cores = launch["cores"]
    blocks = sorted({c["slot"] // 3 for c in cores})
    timeline = read_bound = write_bound = core = 0.0
    for b in blocks:
        mine = [c for c in cores if c["slot"] // 3 == b]
        t = max(c["cycles"] for c in mine)
        rd = sum(sum(c["gm_read"].values()) for c in mine) / params["mte2_bytes_per_cycle"]
        wr = sum(sum(c["gm_write"].values()) for c in mine) / params["core_write_bytes_per_cycle"]
        timeline, read_bound, write_bound = max(timeline, t), max(read_bound, rd), max(write_bound, wr)
        core = max(core, t, rd, wr)
    aic = [c for c in cores if c["slot"] % 3 == 0]
    aiv = [c for c in cores if c["slot"] % 3 != 0]
    return dict(
        core_cycles=core, timeline_cycles=timeline, core_read_bound_cycles=read_bound,
        core_write_bound_cycles=write_bound,
        pipe_busy_cycles={p: max(c["busy"][p] for c in cores) for p in PIPES},
        pipe_instructions={p: sum(c["instructions"][p] for c in cores) for p in PIPES},
        gm_to_l1_bytes=sum(c["gm_read"]["MTE2"] for c in aic),
        gm_to_ub_bytes=sum(c["gm_read"]["MTE2"] for c in aiv),
        ub_to_gm_bytes=sum(c["gm_write"]["MTE3"] for c in aiv),
        l0c_to_gm_bytes=sum(c["gm_write"]["FIX"] + c["gm_write"]["MTE3"] for c in aic),
        vector_instructions=sum(c["instructions"]["V"] for c in aiv),
        scalar_ub_accesses=0,  # the scalar unit's loads and stores are not seen by the simulator
        hazards=sum(c.get("hazards", 0) for c in cores),
        first_hazard=next((c["first_hazard"] for c in cores if c.get("first_hazard")), ""))


def sim_run_stats(launches: list, params: dict) -> dict:
    """A call's simulated launches named as the emulation names them: the key preprocessing
    (shift_keys / center_keys), the attention launch, a split call's merge, and a second
    attention launch (a checked call's repair, after split kv's merge)."""
    out = dict(preprocess=None, attention=None, merge=None, repair=None)
    for launch in launches:
        kernel = launch["kernel"]
        name = ("preprocess" if kernel in ("shift_keys", "center_keys") else "merge" if kernel == "merge"
                else "attention" if out["attention"] is None else "repair")
        out[name] = launch_stats(launch, params)
    return out


def calibrate_both(c: Config, params: dict, blocks: int = 0, progress=None):
    """The calibration problems of ``c`` (``calibration_runs(c, blocks)``) run once each on the
    emulation and the simulator; returns (the emulation's fit, the instruction-level model's
    fit, a dict: ``identical`` whether every run wrote the same bytes on both, ``hazards`` the
    pipe hazards the simulator found and ``first_hazard`` the first one's message). The
    simulator reports hazards and goes on (PASA_SIM_HAZARDS=report), so that a kernel's missing
    synchronisation shows in the table rather than stopping it. Raises WrongRunError when the
    simulator's output misses the golden."""
    one = dict(params, core_num=1)
    from pasa_npu.ascendc_sim import Both

    proxy = Both(ascendc_emu._ascendc_emu, program(), caller_gets="sim")
    runs = calibration_runs(c, blocks)
    emu_stats, sim_stats = [], []
    checks = dict(identical=True, hazards=0, first_hazard="")
    saved, ascendc_emu._ascendc_emu = ascendc_emu._ascendc_emu, proxy
    saved_env = os.environ.get("PASA_SIM_HAZARDS")
    os.environ["PASA_SIM_HAZARDS"] = "report"
    def both(run, tiling):
        b, h, hkv, sq, skv, causal = run
        st = emulate(c.algorithm, b, h, hkv, sq, skv, c.d, causal, one, c.q_block, c.kv_block, **tiling)
        call = proxy.calls[-1]
        sim = sim_run_stats(call["launches"], one)
        sim.update(golden_rmse=st["golden_rmse"], torch_rmse=st["torch_rmse"])
        checks["identical"] = checks["identical"] and call["emu"] == call["sim"]
        for launch in (x for x in sim.values() if isinstance(x, dict)):
            checks["hazards"] += launch["hazards"]
            checks["first_hazard"] = checks["first_hazard"] or launch["first_hazard"]
        return st, sim

    fused = (None, None)
    try:
        for i, run in enumerate(runs):
            if progress:
                progress(i)
            st, sim = both(run, dict(CALIBRATION_TILING, **c.forced))
            emu_stats.append(st)
            sim_stats.append(sim)
        if emu_stats[0]["preprocess"] is not None:  # as calibrate(): the first run as the kernels run it
            fused = both(runs[0], c.forced)
    finally:
        ascendc_emu._ascendc_emu = saved
        if saved_env is None:
            os.environ.pop("PASA_SIM_HAZARDS", None)
        else:
            os.environ["PASA_SIM_HAZARDS"] = saved_env
    return fit_runs(c, runs, emu_stats, one, fused[0]), fit_runs(c, runs, sim_stats, one, fused[1]), checks


#: shapes of ``--sim``: one per calibration configuration the README's figures rest on
SHAPES = (Shape("paper 1x16x1280x128", 1, 16, 16, 1280, 1280, 128),
          Shape("d=64 S=4096 none", 4, 32, 32, 4096, 4096, 64),
          Shape("decode 16x28(4)x1x16384x128", 16, 28, 4, 1, 16384, 128))


def _block(fit) -> dict:
    cycles = fit.block_cycles()
    busy = {p: fit.per_block(f"busy_{p}") for p in PIPES + ("RD", "WR")}
    binding = max(busy, key=busy.get)
    return dict(cycles=cycles, busy=busy, binding=binding if busy[binding] >= 0.9 * cycles else "path",
                vector_instructions=fit.per_block("vector_instructions") / 2)


def compare(shapes, algorithms, params: dict, blocks: int = 0, progress=None) -> dict:
    """Per shape and allocation, at the tiling where the emulation's model finds the allocation
    fastest (as ``pasa-npu-model`` reports it): both models' per-block cycles, busy pipes,
    binding resource and extrapolated TFLOP/s."""
    rows, fits, emu_fits = [], {}, {}
    total, done = len(shapes) * len(algorithms), 0

    def both(config):
        """Both models' fits of ``config`` (and the simulator's checks), made once."""
        if config not in fits:
            fits[config] = calibrate_both(config, params, blocks)
        return fits[config]

    for shape in shapes:
        for algorithm in algorithms:
            if progress:
                progress(done, total, f"--sim {shape.name[:20]} {algorithm}")
            config, chosen = fastest(shape, algorithm, params,
                                     lambda c, p: cached_calibration(emu_fits, c, c, p))
            emu_fit, sim_fit, checks = both(config)
            row = dict(shape=shape.name, algorithm=algorithm,
                       tile=tile_name(config.q_block, config.kv_block, chosen["tail_pieces"], config.vector_prob_sums),
                       golden_rmse=max(emu_fit.golden_rmse, sim_fit.golden_rmse), **checks)
            for i, (name, fit) in enumerate((("emu", emu_fit), ("sim", sim_fit))):
                result = extrapolate(shape, fit, params, lambda c, p, i=i: both(c)[i], chosen["tail_pieces"])
                row[name] = dict(_block(fit), tflops=result["tflops"], call_binding=result["binding"])
            rows.append(row)
            done += 1
    if progress:
        progress(total, total, "done")
    return dict(rows=rows, blocks=blocks)


def markdown(result) -> str:
    n = result["blocks"] or f"the shape's kv blocks a task, at most {CALIBRATION_BLOCKS}"
    lines = ["**Modelled** (not measured on an NPU). Per kv block on one AI Core, from the calibration fits "
             f"(tasks of N kv blocks, N = {n}): the emulation's model, which "
             "charges the AscendC API calls (`emu`), and the instruction-level model, which charges the "
             "instructions Huawei's implementation issues on the simulator (`sim`), with the same parameters. "
             "Each allocation at the tiling (`q_block` x `kv_block`) where the emulation's model finds it "
             "fastest, as `pasa-npu-model` reports it. Cycles per kv block of that tile (binding), V / M / FIX / "
             "MTE2 busy per block, V instructions per block and vector core, and the extrapolated call's "
             "TFLOP/s. The runs' outputs on the simulator were "
             "checked against the fp64 golden (largest relative RMSE in the last column; `same` where both "
             "wrote the same bytes).", "",
             "| shape | allocation | tile | emu cycles (binding) | sim cycles (binding) | V emu / sim | M emu / sim "
             "| FIX emu / sim | MTE2 emu / sim | V instr emu / sim | TFLOP/s emu / sim | rmse | hazards |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        e, s = r["emu"], r["sim"]
        pair = lambda p: f"{e['busy'][p]:.0f} / {s['busy'][p]:.0f}"  # noqa: E731
        lines.append(f"| {r['shape']} | {r['algorithm']} | {r['tile']} | {e['cycles']:.0f} ({e['binding']}) | "
                     f"{s['cycles']:.0f} ({s['binding']}) | {pair('V')} | {pair('M')} | {pair('FIX')} | "
                     f"{pair('MTE2')} | {e['vector_instructions']:.1f} / {s['vector_instructions']:.1f} | "
                     f"{e['tflops']:.1f} / {s['tflops']:.1f} | {r['golden_rmse']:.1e}"
                     f"{' same' if r['identical'] else ''} | {r['hazards']} |")
    first = next((r["first_hazard"] for r in result["rows"] if r["hazards"]), "")
    if first:
        lines += ["", f"The simulator found pipe hazards in these runs (timed as issued); the first: {first}"]
    lines += ["", "Why they differ: ascend_kernels/TIMING_MODEL.md, \"The instruction-level model\"."]
    return "\n".join(lines) + "\n"
