"""Each prefill shape of ``pasa-npu-model --sensitivity`` at every worst corner of one or more of
its JSON outputs (a development tool; not installed with the package).

    python tools/dev/cross_corners.py npu_sensitivity.json [more.json ...]

Prints the pasa / fa-fp32 ratio of every (shape, corner) pair as the search evaluates a point
(fa-fp32 at its fastest tiling, pasa among ``npu_model.search_tilings``), from runs checked
against the fp64 golden: whether a corner the search found for one shape, or in an earlier run,
lies below the worst corner reported for another.
"""
from __future__ import annotations

import argparse
import json

from pasa_npu import npu_params
from pasa_npu.tools import npu_model
from pasa_npu.tools.npu_extrapolate import cached_calibration


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sensitivity_json", nargs="+", help="npu_sensitivity.json of pasa-npu-model --sensitivity")
    args = parser.parse_args(argv)
    runs = [json.load(open(path)) for path in args.sensitivity_json]
    corners = [(f"{name} ({i})", w["corner"]) for i, run in enumerate(runs)
               for name, w in run["worst"].items() if run["nominal"][name]["ratio"] != w["result"]["ratio"]]
    shapes = [s for s in npu_model.shapes(["readme"]) if s.name in runs[0]["nominal"] and not s.name.startswith("decode")]
    fits = {}

    def fit(config, params):
        return cached_calibration(fits, (config, tuple(sorted(npu_params.timing_only(params).items()))), config, params)

    for shape in shapes:
        nominal = runs[0]["nominal"][shape.name]["pasa"]
        only = {"pasa": npu_model.search_tilings(shape, (nominal["q_block"], nominal["kv_block"]))}
        reported = runs[0]["worst"][shape.name]["result"]["ratio"]
        print(f"{shape.name}: reported worst corner {reported:.4f}", flush=True)
        for label, corner in corners:
            cell = npu_model._ratio_cell(shape, npu_params.values(**corner), fit, ("fa-fp32", "pasa"), only)
            print(f"  at {label}: {cell['ratio']:.4f}{'  (lower)' if cell['ratio'] < reported - 1e-9 else ''}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
