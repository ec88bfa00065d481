"""``pasa-npu-model``: modelled Atlas A2 speed of the AscendC kernels (a model, not a measurement).

For fa-fp32, pasa and pasa-exact at the paper's shapes, a d x S x mask sweep and decode, it
reports modelled TFLOP/s, the share of the cube's peak, the binding pipe and the bytes that
cross between the cube and the vector cores per kv block. Every number comes from the
emulation's timing model (``ascend_kernels/TIMING_MODEL.md``) with the parameter table of
``pasa_npu/npu_params.py``, extrapolated from small emulated problems
(``tools/npu_extrapolate.py`` says how); the band is the same model with every assumption at
the fast and at the slow end of its range. Every emulated run is checked against the fp64 golden
and no figure is reported from a wrong one. Nothing here was timed on an NPU.

Writes ``npu_model.md`` and ``npu_model.json`` into ``--out``; ``--params`` prints the
parameter table as Markdown.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

from pasa_npu import npu_params
from pasa_npu.tools.compare.progress import ProgressBar
from pasa_npu.tools.npu_extrapolate import Shape, WrongRunError, calibrate, extrapolate

ALGORITHMS = ("fa-fp32", "pasa", "pasa-exact")
TOKENS, HIDDEN = 16384, 2048  # the sweep keeps B * S and H * d fixed, as pasa-bench does


def shapes(sets) -> list:
    out = []
    if "paper" in sets:
        out += [Shape("paper 1x16x1280x128", 1, 16, 16, 1280, 1280, 128),
                Shape("Qwen2-7B-like 1x28x5676x128 GQA 28:4", 1, 28, 4, 5676, 5676, 128, causal=True),
                Shape("SVD-like 50x5x9216x64", 50, 5, 5, 9216, 9216, 64)]
    if "sweep" in sets:
        for d in (64, 128):
            for s in (1024, 4096, 16384):
                for causal in (False, True):
                    out.append(Shape(f"d={d} S={s} {'causal' if causal else 'none'}",
                                     max(1, TOKENS // s), HIDDEN // d, HIDDEN // d, s, s, d, causal))
    if "decode" in sets:
        for skv in (4096, 16384):
            out.append(Shape(f"decode 16x28(4)x1x{skv}x128", 16, 28, 4, 1, skv, 128))
    return out


def params_markdown() -> str:
    lines = ["| parameter | value | unit | range (assumptions) | source |", "|---|---|---|---|---|"]
    for p in npu_params.ALL:
        rng = f"{p.low:g} - {p.high:g}" if p.assumption else "-"
        lines.append(f"| `{p.name}` | {p.value:g} | {p.unit} | {rng} | {p.source} |")
    return "\n".join(lines) + "\n"


def run(shape_list, algorithms, band: bool, progress) -> dict:
    corners = {"nominal": npu_params.values()}
    if band:
        corners.update(fast=npu_params.corner("fast"), slow=npu_params.corner("slow"))
    fits, rows = {}, []
    configs = sorted({s.config(a) for s in shape_list for a in algorithms}, key=str)
    total = len(configs) * len(corners) + len(shape_list) * len(algorithms)
    done = 0
    for config in configs:
        for name, params in corners.items():
            progress(done, total, f"calibrate {config.algorithm} d={config.d} g={config.group}")
            fits[(config, name)] = calibrate(config, params)
            done += 1
    for shape in shape_list:
        row = dict(shape=shape.name, b=shape.b, h=shape.h, hkv=shape.hkv, sq=shape.sq,
                   skv=shape.skv, d=shape.d, causal=shape.causal)
        for algorithm in algorithms:
            progress(done, total, f"{shape.name[:20]} {algorithm}")
            config = shape.config(algorithm)
            cell = {name: extrapolate(shape, fits[(config, name)], params)
                    for name, params in corners.items()}
            nominal = cell["nominal"]
            fit = fits[(config, "nominal")]
            row[algorithm] = dict(
                tflops=nominal["tflops"], time_us=nominal["time_us"], binding=nominal["binding"],
                cube_share=nominal["tflops"] / npu_params.cube_peak_tflops(corners["nominal"]),
                kv_gbs=nominal["kv_gbs"],
                band=[cell[c]["tflops"] for c in ("slow", "fast") if c in cell],
                exchange_kib_per_block=fit.per_block("exchange_bytes") / 1024,
                vector_instructions_per_block=round(fit.per_block("vector_instructions") / 2, 1) + 0.0,
                scalar_ub_accesses_per_block=round(fit.per_block("scalar_ub_accesses") / 2, 1) + 0.0,
                block=_per_block(fit, shape, corners["nominal"]), busy=nominal["busy"],
                golden_rmse=max(fits[(config, name)].golden_rmse for name in corners))
            done += 1
        rows.append(row)
    progress(total, total, "done")
    return dict(algorithms=list(algorithms), rows=rows, params=corners["nominal"],
                cube_peak_tflops=npu_params.cube_peak_tflops(corners["nominal"]))


def _per_block(fit, shape: Shape, params: dict) -> dict:
    """One kv block on one AI Core, from the fit: modelled cycles, V and M busy cycles, and the
    ceiling the chip's L2 bandwidth puts on the cube (every core moving this block's GM bytes)."""
    rows = 128 if not shape.decode else shape.h // shape.hkv
    ideal = 2 * rows * 128 * shape.d / params["cube_macs_per_cycle"]  # QK^T and PV on a perfect cube
    l2 = fit.per_block("gm_bytes") * params["core_num"] / params["l2_aggregate_bytes_per_cycle"]
    return dict(cycles=fit.per_block("core_cycles"), v=fit.per_block("busy_V"), m=fit.per_block("busy_M"),
                l2=l2, l2_ceiling=ideal / l2)


def markdown(result) -> str:
    algos = result["algorithms"]
    lines = ["**Modelled** (pipe-level timing model of an Atlas A2 / 910B1, parameters in "
             "`pasa_npu/npu_params.py`; not measured on an NPU). TFLOP/s with the band over the "
             f"assumed parameters in brackets; cube peak {result['cube_peak_tflops']:.0f} TFLOP/s. "
             "Each figure is fitted from emulated runs whose outputs were checked against the fp64 "
             "golden; `rmse` is the largest relative RMSE among them.", "",
             "| shape | " + " | ".join(f"{a} TFLOP/s [band] (binding, % peak, rmse)" for a in algos)
             + (" | pasa / fa-fp32 | pasa-exact / fa-fp32 |" if "fa-fp32" in algos else " |"),
             "|---|" + "---|" * len(algos) + ("---|---|" if "fa-fp32" in algos else "")]
    for row in result["rows"]:
        cells = []
        for a in algos:
            e = row[a]
            band = f" [{e['band'][0]:.0f}-{e['band'][1]:.0f}]" if e["band"] else ""
            cells.append(f"{e['tflops']:.1f}{band} ({e['binding']}, {e['cube_share']:.0%}, {e['golden_rmse']:.1e})")
        ratios = []
        if "fa-fp32" in algos:
            for a in ("pasa", "pasa-exact"):
                ratios.append(f"{row[a]['tflops'] / row['fa-fp32']['tflops']:.2f}" if a in algos else "-")
        lines.append(f"| {row['shape']} | " + " | ".join(cells + ratios) + " |")
    lines += ["", "Per kv block (128 x 128 tile) at each shape's head dim, from the calibration "
              "fits: KiB handed between cube and vector through the workspace (S' or S and P'V "
              "out of the cube, P' back; each is also read once); per vector core the vector "
              "instructions and scalar UB accesses; on one AI Core the modelled cycles (V and M "
              "busy); and the share of the cube's peak the chip's L2 bandwidth allows when every "
              "core moves this block's GM bytes:", "",
              "| shape | " + " | ".join(f"{a}: KiB / instr / scalar / cycles (V, M) / L2 ceiling" for a in algos)
              + " |", "|---|" + "---|" * len(algos)]
    seen = set()
    for row in result["rows"]:
        key = (row["d"], row["h"] // row["hkv"], row["sq"] == 1)
        if key in seen:
            continue
        seen.add(key)
        cells = [f"{row[a]['exchange_kib_per_block']:.1f} / {row[a]['vector_instructions_per_block']:g} / "
                 f"{abs(row[a]['scalar_ub_accesses_per_block']):g} / {row[a]['block']['cycles']:.0f} "
                 f"({row[a]['block']['v']:.0f}, {row[a]['block']['m']:.0f}) / {row[a]['block']['l2_ceiling']:.0%}"
                 for a in algos]
        lines.append(f"| d={row['d']}, group {key[1]}{', decode' if key[2] else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="pasa-npu-model", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", default="npu-model-out", help="folder for npu_model.md/.json")
    parser.add_argument("--sets", nargs="+", default=["paper", "sweep", "decode"],
                        choices=["paper", "sweep", "decode"], help="shape sets to model")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS,
                        help="allocations to model")
    parser.add_argument("--no-band", action="store_true", help="nominal parameters only")
    parser.add_argument("--params", action="store_true", help="print the parameter table and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.params:
        print(params_markdown(), end="")
        return 0
    try:
        result = run(shapes(args.sets), args.algorithms, not args.no_band, ProgressBar(not args.quiet))
    except WrongRunError as exc:
        print(f"pasa-npu-model: {exc}", file=sys.stderr)
        return 1
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(result)
    (out / "npu_model.md").write_text(text)
    (out / "npu_model.json").write_text(json.dumps(result, indent=1, default=str))
    print(text, end="")
    print(f"\nwrote npu_model.md, npu_model.json to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
