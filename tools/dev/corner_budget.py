"""The busiest AI Core's modelled cycles of one shape, term by term (a development tool; not
installed with the package).

    python tools/dev/corner_budget.py npu_sensitivity.json "paper 1x16x1280x128" --tile 128 256 [--vsums] [--pipes]

Takes a shape's worst corner from a ``pasa-npu-model --sensitivity`` JSON, calibrates fa-fp32
and pasa at the tile given under those parameters (runs checked against the fp64 golden, as
every calibration is) and prints what the extrapolation adds up on the busiest AI Core: the
launch, the fit's constant (and the scalar unit's share of it), the key preprocessing (its
constant, its key blocks with the cube's busy cycles of each, the barrier's hops), the tasks'
starts and ends with the cube's idle cycles there, and the blocks, with the cube's busy cycles
a block; then the call's cycles as ``extrapolate`` gives them. This is
the budget ``ascend_kernels/TIMING_MODEL.md`` quotes at the paper's worst corner. ``--pipes``
adds each fitted quantity's terms (constant, a task, a block: each pipe's busy cycles, the
read and write ports', the bytes and the instructions), where a task's or a block's cycles go.
"""
from __future__ import annotations

import argparse
import json

from pasa_npu import npu_params
from pasa_npu.tools import npu_extrapolate as X
from pasa_npu.tools.npu_model import shapes


def budget(shape: X.Shape, algorithm: str, q_block: int, kv_block: int, params: dict,
           vector_prob_sums: bool = False) -> dict:
    """The busiest AI Core's terms of ``algorithm`` on ``shape`` at that tile under ``params``
    (every task a full tile: a shape whose tasks are cut into pieces is refused); pasa with its
    row sums of P' on the vector cores where ``vector_prob_sums``."""
    config = shape.config(algorithm, q_block, kv_block, vector_prob_sums and algorithm == "pasa")
    fit = X.calibrate(config, params)
    result = min((X.extrapolate(shape, fit, params, tail_pieces=t) for t in X.TAIL_CHOICES),
                 key=lambda r: r["cycles"])
    per_core = X.tasks(algorithm, shape.b, shape.h, shape.hkv, shape.sq, shape.skv, shape.d, shape.causal,
                       params, q_block, kv_block, result["tail_pieces"])
    if any(t[0] < q_block for core in per_core for t in core):
        raise SystemExit(f"{shape.name} at {q_block}x{kv_block}: tasks of fewer rows than a tile; "
                         "this tool charges full tiles only")
    busiest = max(per_core, key=lambda core: (sum(t[1] for t in core), len(core)))
    c0, per_task, per_block, _ = fit.coef["timeline_cycles"]
    out = dict(tile=config.tile, launch=params["launch_overhead_cycles"], constant=c0, scalar_constant=fit.coef["busy_S"][0],
               tasks=len(busiest), per_task=per_task, blocks=sum(t[1] for t in busiest), per_block=per_block,
               cube_per_block=fit.per_block("busy_M"), call=result["cycles"], binding=result["binding"])
    out["coef"] = {q: tuple(float(x) for x in c) for q, c in fit.coef.items()}
    out["cube_idle_per_task"] = per_task - fit.coef["busy_M"][1]
    out["prep"] = 0
    if fit.prep:
        key_blocks = shape.b * shape.hkv * -(-shape.skv // kv_block)
        out.update(prep_constant=fit.prep["timeline_cycles"][0],
                   prep_blocks=-(-key_blocks // min(int(params["core_num"]), key_blocks)),
                   prep_per_block=fit.prep["timeline_cycles"][1],
                   prep_cube_per_block=fit.prep["busy_M"][1],
                   barrier=3 * params["cross_core_latency_cycles"])
        out["prep"] = out["prep_constant"] + out["prep_blocks"] * out["prep_per_block"] + out["barrier"]
    # the call's cycles where the busiest AI Core's timeline binds
    out["timeline"] = out["launch"] + c0 + out["tasks"] * per_task + out["blocks"] * per_block + out["prep"]
    out["bounds"] = max(result["busy"]["L2"], result["busy"]["HBM"])  # the chip's shared bounds
    return out


def what_ifs(pasa: dict, fa: dict) -> list:
    """pasa's call with some of its terms changed, as (what, cycles): arithmetic on the budget's
    terms, not modelled runs. The key preprocessing off the path; a task at fa-fp32's cost; and
    the key blocks shifted at task boundaries (each task waiting for its own keys, no barrier):
    the preprocessing's constant and one key block before the first task, then each later key
    block on the path for the cycles its cube work exceeds the cube's idle cycles of a task."""
    def call(prep=pasa["prep"], per_task=pasa["per_task"], constant=pasa["constant"]) -> float:
        core = constant + pasa["tasks"] * per_task + pasa["blocks"] * pasa["per_block"] + prep
        return pasa["launch"] + max(core, pasa["bounds"])
    at_boundaries = (pasa["prep_constant"] + pasa["prep_per_block"] + (pasa["prep_blocks"] - 1)
                     * max(0.0, pasa["prep_cube_per_block"] - pasa["cube_idle_per_task"]))
    return [("no key preprocessing on the path", call(prep=0)),
            ("a task at fa-fp32's cost", call(per_task=fa["per_task"])),
            ("both", call(prep=0, per_task=fa["per_task"])),
            ("key blocks shifted at task boundaries", call(prep=at_boundaries)),
            ("  and a task at fa-fp32's cost", call(prep=at_boundaries, per_task=fa["per_task"])),
            ("  and fa-fp32's constant as well", call(prep=at_boundaries, per_task=fa["per_task"], constant=fa["constant"]))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sensitivity_json", help="npu_sensitivity.json of pasa-npu-model --sensitivity")
    parser.add_argument("shape", help="a shape's name as that JSON gives it")
    parser.add_argument("--tile", nargs=2, type=int, default=(128, 256), metavar=("Q_BLOCK", "KV_BLOCK"))
    parser.add_argument("--vsums", action="store_true", help="pasa's row sums of P' on the vector cores")
    parser.add_argument("--pipes", action="store_true",
                        help="each fitted quantity's constant, per-task and per-block terms")
    args = parser.parse_args(argv)
    worst = json.load(open(args.sensitivity_json))["worst"][args.shape]
    nominal = npu_params.values()
    params = npu_params.values(**{k: v for k, v in worst["corner"].items() if v != nominal[k]})
    shape = next(s for s in shapes(["readme"]) if s.name == args.shape)
    budgets = {}
    for algorithm in ("fa-fp32", "pasa"):
        b = budgets[algorithm] = budget(shape, algorithm, *args.tile, params, args.vsums)
        print(f"{algorithm} {b['tile']}: call {b['call']:.0f} cycles ({b['binding']})")
        print(f"  launch {b['launch']:.0f}; constant {b['constant']:.0f} (scalar {b['scalar_constant']:.0f}); "
              f"{b['tasks']} tasks x {b['per_task']:.0f}; {b['blocks']} blocks x {b['per_block']:.0f} "
              f"(cube {b['cube_per_block']:.0f} a block)")
        if b["prep"]:
            print(f"  key preprocessing {b['prep']:.0f}: constant {b['prep_constant']:.0f}, {b['prep_blocks']} key "
                  f"blocks x {b['prep_per_block']:.0f} (cube {b['prep_cube_per_block']:.0f} a key block), "
                  f"barrier {b['barrier']:.0f}")
        print(f"  the cube idle at a task's start and end: {b['cube_idle_per_task']:.0f} cycles, "
              f"{b['tasks'] * b['cube_idle_per_task']:.0f} over the busiest AI Core's {b['tasks']} tasks")
        print(f"  the busiest AI Core's timeline, launch included: {b['timeline']:.0f}")
        if args.pipes:
            print(f"  {'quantity':22s} {'constant':>10s} {'a task':>9s} {'a block':>9s}")
            for quantity, (c0, per_task, per_block, *_) in sorted(b["coef"].items()):
                print(f"  {quantity:22s} {round(c0):10d} {round(per_task):9d} {round(per_block):9d}")
    fa, pasa = budgets["fa-fp32"], budgets["pasa"]
    if pasa["prep"]:
        print("pasa with some terms changed (arithmetic on the terms above, not modelled runs): cycles, fa-fp32 / pasa")
        for what, cycles in what_ifs(pasa, fa):
            print(f"  {what:40s} {cycles:9.0f}  {fa['call'] / cycles:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
