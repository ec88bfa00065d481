"""The timing model against the public figures measured on Atlas A2 hardware.

Two comparisons (``pasa-npu-model --calibrate`` prints both; the figures compared with are
those of ``../shared/npu-params.md`` sections 4-5):

* **Per tile.** PTO-ISA's hand-written FlashAttention kernel (head dim 128, 128 query rows,
  256 keys per tile) has a published cycle model whose stage constants are fitted to
  simulator traces: QK 2487, softmax 2489, PV 1617, update 834 cycles per tile; its
  correction fitted to board runs adds 1000 cycles of cube-vector synchronisation per tile.
  The cube runs QK and PV of a tile one after the other, the vector cores softmax and
  update, so a tile costs at least max(QK + PV, softmax + update). The model's figures per
  256 keys are one 256-key block of the one-core calibration fit at the same head dim and
  query rows, or two 128-key blocks where an allocation's kernels refuse the 256-key block
  (its buffers do not fit the AI Core).
* **Per call.** torch_npu's fused FA and PTO's FA on a 910B2 (24 AI Cores, 1800 MHz),
  B = N = 1, d = 128, S = 1k-32k without a mask, against our kernels modelled on that chip,
  each allocation at the tiling where it is faster (``npu_extrapolate.tilings``).

Every figure of the model side comes from emulated runs checked against the fp64 golden
(``npu_extrapolate.calibrate``).
"""
from __future__ import annotations

from pasa_npu import npu_params
from pasa_npu.tools.npu_extrapolate import Shape, cached_calibration, calibrate, fastest, tiling_choices

#: PTO FA stage constants per 256-key tile (head dim 128, 128 query rows): npu-params.md §4
PTO_STAGE_CYCLES = dict(qk=2487, softmax=2489, pv=1617, update=834)
PTO_BOARD_SYNC_CYCLES = 1000   # cube-vector synchronisation per tile, fitted to board runs
PTO_LAUNCH_CYCLES = 10905      # fitted launch overhead
TILE_KEYS = 256

#: 910B2, B = N = 1, d = 128, no mask: TFLOP/s measured (npu-params.md §5, PTO-ISA README)
MEASURED_910B2 = {1024: (9.2, 25.6), 2048: (30.3, 66.2), 4096: (72.6, 96.6), 8192: (97.3, 117.4),
                  16384: (122.9, 151.2), 32768: (150.8, 168.5)}
B2 = dict(clock_mhz=1800, core_num=24)
#: PTO FA's GM bytes per 256-key tile, estimated from its tile structure: S (fp32), P (fp16) and
#: the P.V product (fp32, 128 x 128) written and read once each, K and V (fp16) read
PTO_TILE_GM_BYTES = 2 * (128 * 256 * 4 + 128 * 256 * 2 + 128 * 128 * 4) + 2 * 256 * 128 * 2


def implied_l2_bytes_per_cycle(tflops: float, tile_bytes: float = PTO_TILE_GM_BYTES) -> float:
    """Aggregate GM bytes per cycle a 910B2 moves when every AI Core does 256-key tiles of
    ``tile_bytes`` at ``tflops``: the L2 rate that a measured speed needs at least."""
    tile_flops = 4.0 * 128 * TILE_KEYS * 128
    cycles_per_tile = tile_flops * B2["core_num"] / (tflops * 1e12) * B2["clock_mhz"] * 1e6
    return tile_bytes * B2["core_num"] / cycles_per_tile


def per_tile(params: dict, algorithms=("fa-fp32", "pasa")) -> dict:
    """Per 256 keys on one AI Core (d = 128, 128 query rows): the model's cube (M) and vector
    (V, per vector core) busy cycles, GM port bounds and cycles, from the calibration fit: one
    256-key block, or two 128-key blocks where the kernels refuse the larger one."""
    out = {}
    shape = Shape("tile", 1, 1, 1, 128, 1024, 128)
    for algorithm in algorithms:
        try:
            fit = calibrate(shape.config(algorithm, 128, TILE_KEYS), params)
        except NotImplementedError:
            fit = calibrate(shape.config(algorithm, 128, 128), params)
        blocks = TILE_KEYS // fit.config.kv_block
        cycles = fit.block_cycles() * blocks
        out[algorithm] = dict(cycles=cycles, m=fit.per_block("busy_M") * blocks,
                              v=fit.per_block("busy_V") * blocks, fix=fit.per_block("busy_FIX") * blocks,
                              rd=fit.per_block("busy_RD") * blocks, wr=fit.per_block("busy_WR") * blocks,
                              gm_kib=fit.per_block("gm_bytes") * blocks / 1024, kv_block=fit.config.kv_block,
                              golden_rmse=fit.golden_rmse)
    return out


def per_call(params: dict, algorithms=("fa-fp32", "pasa"), progress=None) -> dict:
    """Modelled TFLOP/s of (1, 1, S, S, 128) without a mask on a 910B2, per S and allocation,
    each at the tiling of tilings() where it is faster; ``fa-fp32 l2 high``: fa-fp32 with the
    aggregate L2 rate at the high end of its range."""
    b2 = dict(params, **B2)
    l2_high = dict(b2, l2_aggregate_bytes_per_cycle=npu_params.corner("fast")["l2_aggregate_bytes_per_cycle"])
    # one calibration per allocation and tiling, at b2: the L2 rate enters only the launch total
    fits = {}

    def faster(shape, a, at):
        return fastest(shape, a, at, lambda config, _: cached_calibration(fits, config, config, b2))[1]
    out = {}
    for i, s in enumerate(MEASURED_910B2):
        if progress:
            progress(i, len(MEASURED_910B2), f"S={s}")
        shape = Shape(f"S={s}", 1, 1, 1, s, s, 128)
        out[s] = {a: faster(shape, a, b2) for a in algorithms}
        out[s]["fa-fp32 l2 high"] = faster(shape, "fa-fp32", l2_high)
        out[s]["golden_rmse"] = max(f.golden_rmse for f in fits.values() if not isinstance(f, Exception))
    if progress:
        progress(len(MEASURED_910B2), len(MEASURED_910B2), "done")
    return out


def markdown(params: dict, progress=None) -> str:
    """Both comparisons as Markdown tables, labelled as model against measurement."""
    tile = per_tile(params)
    pto_cube = PTO_STAGE_CYCLES["qk"] + PTO_STAGE_CYCLES["pv"]
    pto_vec = PTO_STAGE_CYCLES["softmax"] + PTO_STAGE_CYCLES["update"]
    pto_tile = max(pto_cube, pto_vec)
    ideal = 2 * 128 * TILE_KEYS * 128 / params["cube_macs_per_cycle"]
    lines = [
        "**Per 256-key tile, one AI Core, d = 128, 128 query rows.** PTO FA: stage constants of its "
        "published cycle model (fitted to simulator traces; its correction fitted to board runs adds "
        f"{PTO_BOARD_SYNC_CYCLES} cycles of synchronisation per tile). Ours: **modelled** (this "
        "timing model, nominal parameters), from the calibration fit: "
        + ", ".join(f"{a} {'one 256-key block' if t['kv_block'] == TILE_KEYS else 'two 128-key blocks'}"
                    for a, t in tile.items()) + ".", "",
        "| per 256 keys | PTO FA (fit) | fa-fp32 (model) | pasa (model) |", "|---|---|---|---|",
        f"| cube: QK + PV (M busy in the model) | {pto_cube} | {tile['fa-fp32']['m']:.0f} | {tile['pasa']['m']:.0f} |",
        f"| vector: softmax + update (V busy per vector core) | {pto_vec} | {tile['fa-fp32']['v']:.0f} "
        f"| {tile['pasa']['v']:.0f} |",
        f"| Fixpipe busy | - | {tile['fa-fp32']['fix']:.0f} | {tile['pasa']['fix']:.0f} |",
        f"| AI Core GM read / write port bound | - | {tile['fa-fp32']['rd']:.0f} / {tile['fa-fp32']['wr']:.0f} "
        f"| {tile['pasa']['rd']:.0f} / {tile['pasa']['wr']:.0f} |",
        f"| GM KiB moved | - | {tile['fa-fp32']['gm_kib']:.0f} | {tile['pasa']['gm_kib']:.0f} |",
        f"| cycles per tile | {pto_tile} ({pto_tile + PTO_BOARD_SYNC_CYCLES} on the board) "
        f"| {tile['fa-fp32']['cycles']:.0f} | {tile['pasa']['cycles']:.0f} |",
        f"| cube efficiency (ideal {ideal:.0f} cycles) | {ideal / pto_tile:.0%} "
        f"({ideal / (pto_tile + PTO_BOARD_SYNC_CYCLES):.0%}) "
        f"| {ideal / tile['fa-fp32']['cycles']:.0%} | {ideal / tile['pasa']['cycles']:.0%} |",
        f"| model / PTO tile (board) | 1 | {tile['fa-fp32']['cycles'] / (pto_tile + PTO_BOARD_SYNC_CYCLES):.2f} "
        f"| {tile['pasa']['cycles'] / (pto_tile + PTO_BOARD_SYNC_CYCLES):.2f} |",
        "", f"Largest relative RMSE against the fp64 golden of the runs fitted: "
        f"{max(t['golden_rmse'] for t in tile.values()):.1e}.", ""]
    calls = per_call(params, progress=progress)
    lines += [
        "**Per call on a 910B2** (24 AI Cores, 1800 MHz), B = N = 1, d = 128, S_q = S_kv = S, no mask: "
        "TFLOP/s measured (torch_npu fused FA, PTO FA; PTO-ISA README) against **modelled** "
        "(our kernels under this timing model, nominal parameters, each allocation at its fastest tiling of "
        f"{tiling_choices()}; the last fa-fp32 column with "
        "`l2_aggregate_bytes_per_cycle` at the high end of its range). Errors: model / measured - 1. "
        "The L2 rate a measured figure needs: the aggregate bytes per cycle that PTO FA's estimated "
        f"{PTO_TILE_GM_BYTES // 1024} KiB of GM traffic per 256-key tile takes at that speed.", "",
        "| S | torch_npu FA (measured) | PTO FA (measured) | L2 rate PTO FA needs (B/cycle) "
        "| fa-fp32 (model, binding) | vs torch_npu | vs PTO | fa-fp32, L2 high (model) | vs PTO "
        "| pasa (model, binding) | pasa / fa-fp32 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s, (torch_npu, pto) in MEASURED_910B2.items():
        fa, pasa, fast = calls[s]["fa-fp32"], calls[s]["pasa"], calls[s]["fa-fp32 l2 high"]
        lines.append(f"| {s // 1024}k | {torch_npu} | {pto} | {implied_l2_bytes_per_cycle(pto):.0f} | "
                     f"{fa['tflops']:.1f} ({fa['binding']}) | {fa['tflops'] / torch_npu - 1:+.0%} | "
                     f"{fa['tflops'] / pto - 1:+.0%} | {fast['tflops']:.1f} ({fast['binding']}) | "
                     f"{fast['tflops'] / pto - 1:+.0%} | {pasa['tflops']:.1f} ({pasa['binding']}) | "
                     f"{pasa['tflops'] / fa['tflops']:.2f} |")
    lines += ["", f"Largest relative RMSE against the fp64 golden of the runs fitted: "
              f"{max(c['golden_rmse'] for c in calls.values()):.1e}."]
    return "\n".join(lines) + "\n"
