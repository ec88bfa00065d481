"""``pasa-npu-model``: modelled Atlas A2 speed of the AscendC kernels (a model, not a measurement).

For fa-fp32, pasa and pasa-exact at the paper's shapes, a d x S x mask sweep and decode, it
reports modelled TFLOP/s, the share of the cube's peak, the binding pipe and the bytes that
cross between the cube and the vector cores per kv block, each allocation at the tiling
(128 or 256 query rows by 128 to 1024 keys a tile) where it is faster among those its kernels take. Every number comes from the
emulation's timing model (``ascend_kernels/TIMING_MODEL.md``) with the parameter table of
``pasa_npu/npu_params.py``, extrapolated from small emulated problems
(``tools/npu_extrapolate.py`` says how); the band is the same model with every assumption at
the fast and at the slow end of its range. Every emulated run is checked against the fp64 golden
and no figure is reported from a wrong one. Nothing here was timed on an NPU.

Writes ``npu_model.md`` and ``npu_model.json`` into ``--out``; ``--params`` prints the
parameter table as Markdown; ``--calibrate`` compares the model with the public figures
measured on Atlas A2 hardware (``tools/npu_calibrate.py``); ``--sensitivity`` moves each
parameter with a range alone to both ends and reports the pasa / fa-fp32 ratio's worst
independent corner (``--cache FILE`` keeps its calibrations in FILE, so that a search cut short
resumes where it stopped); ``--sim`` reports the instruction-level model of the simulator
(``tools/npu_sim.py``) beside this one on the calibration problems of a few shapes.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import json
import multiprocessing
import os
import pathlib
import pickle
import signal
import sys
from typing import Optional

from pasa_npu import npu_params
from pasa_npu.tools.command_line import OutputFolderError, checked_folder, created_folder
from pasa_npu.tools.compare.progress import ProgressBar
from pasa_npu.tools import npu_calibrate, npu_sim
from pasa_npu.tools.npu_extrapolate import (Shape, WrongRunError, cached_calibration,
                                            calibration_or_refusal, calibrations, extrapolate, fastest,
                                            part_configs, tile_name, tiling_choices, tilings,
                                            VECTOR_SUMS_MARK)

ALGORITHMS = ("fa-fp32", "pasa", "pasa-exact")
TOKENS, HIDDEN = 16384, 2048  # the sweep keeps B * S and H * d fixed, as pasa-bench does


def shapes(sets) -> list:
    out = []
    if "paper" in sets:
        out += [Shape("paper 1x16x1280x128", 1, 16, 16, 1280, 1280, 128),
                Shape("Qwen2-7B-like 1x28x5676x128 GQA 28:4 causal", 1, 28, 4, 5676, 5676, 128, causal=True),
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
    if "readme" in sets:
        out += [Shape("paper 1x16x1280x128", 1, 16, 16, 1280, 1280, 128),
                Shape("Qwen2-7B-like 1x28x5676x128 GQA 28:4 causal", 1, 28, 4, 5676, 5676, 128, causal=True),
                Shape("d=128 S=4096 causal", 4, 16, 16, 4096, 4096, 128, causal=True),
                Shape("d=128 S=16384 none", 1, 16, 16, 16384, 16384, 128),
                Shape("decode 16x28(4)x1x16384x128", 16, 28, 4, 1, 16384, 128)]
    return out


def params_markdown() -> str:
    lines = ["| parameter | value | unit | range | source |", "|---|---|---|---|---|"]
    for p in npu_params.ALL:
        rng = f"{p.low:g} - {p.high:g}" if p.assumption else "-"
        lines.append(f"| `{p.name}` | {p.value:g} | {p.unit} | {rng} | {p.source} |")
    return "\n".join(lines) + "\n"


def _one_torch_thread():
    """A pool worker's torch runs on one thread: ``jobs`` workers of one thread each fill
    ``jobs`` cores, where workers of a thread per core would oversubscribe them many times.
    Ctrl-C stops the main process, which ends the workers: they ignore it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch
    torch.set_num_threads(1)


def _calibration_pool(jobs: int):
    """``jobs`` processes that make calibrations, or None (one: this process makes them)."""
    # spawned, not forked: a fork of a process whose torch thread pools have run can hang in
    # the child's first parallel torch call
    return multiprocessing.get_context("spawn").Pool(jobs, initializer=_one_torch_thread) if jobs > 1 else None


def _calibration_of(job):
    """A pool worker's calibration of one (config, params) job."""
    config, params = job
    return calibration_or_refusal(config, params)


def calibration_fingerprint() -> str:
    """What a calibration depends on besides its config and parameters: in a checkout the
    sources of the kernels, their host code and the emulation (``ascend_kernels/``), of the
    package and of the extrapolation, so that machines that build the same sources share
    calibrations; elsewhere the bytes of the emulation's extension module as built. Python
    sources count by their code alone (:func:`code_of`)."""
    from pasa_npu import _ascendc_emu
    from pasa_npu.tools import npu_extrapolate
    package = pathlib.Path(npu_params.__file__).parent
    kernels = package.parent / "ascend_kernels"
    files = [pathlib.Path(npu_extrapolate.__file__)] + sorted(package.glob("*.py"))
    if kernels.is_dir():
        files += sorted(f for part in ("kernels", "host", "emu") for f in (kernels / part).iterdir() if f.is_file())
    else:
        files.append(pathlib.Path(_ascendc_emu.__file__))
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + code_of(f))
    return digest.hexdigest()


def code_of(path: pathlib.Path) -> bytes:
    """What of a source file a calibration can depend on: a Python file's syntax tree without
    its docstrings, comments and layout (as this Python's ``ast.dump`` writes it), any other
    file's bytes."""
    if path.suffix != ".py":
        return path.read_bytes()
    tree = ast.parse(path.read_bytes())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


#: a cache file's first line; the second is the fingerprint of the build that made it
CACHE_MAGIC = b"pasa-npu-model calibrations\n"


class CacheError(ValueError):
    """A --cache file this build cannot take."""


class StaleCacheError(CacheError):
    """A cache file whose calibrations another build of the kernels or the model made."""


def check_cache(path: str, fingerprint: str) -> None:
    """CacheError naming ``path`` unless it is absent or a cache this build wrote: read from its
    header, so that a file that is not one is never unpickled."""
    if not os.path.exists(path):
        return
    try:
        with open(path, "rb") as f:
            magic, made_by = f.readline(), f.readline().strip()
    except OSError as err:
        raise CacheError(f"--cache {path}: expected a readable cache file, got {err.strerror}") from err
    if magic != CACHE_MAGIC:
        raise CacheError(f"--cache {path}: expected a calibration cache pasa-npu-model wrote, got a file that "
                         "is not one; name a new file")
    if made_by != fingerprint.encode():
        raise StaleCacheError(f"--cache {path}: its calibrations were made by another build of the kernels or of "
                              "the model (calibration_fingerprint differs); remove the file to start afresh")


def load_calibrations(path: str, fingerprint: str) -> dict:
    """The calibrations kept in ``path`` (none where it is absent). CacheError naming the file
    where it is not a cache, StaleCacheError where it was made under another ``fingerprint``
    (calibration_fingerprint)."""
    check_cache(path, fingerprint)
    if not os.path.exists(path):
        return {}
    with open(path, "rb") as f:
        f.readline(), f.readline()
        try:
            return pickle.load(f)
        except Exception as err:  # unpickling a damaged file raises any of many types
            raise CacheError(f"--cache {path}: expected a whole cache file, got a damaged one ({err!r}); "
                             "remove the file to start afresh") from err


def save_calibrations(path: str, fits: dict, fingerprint: str) -> None:
    """Keep ``fits`` in ``path`` under ``fingerprint`` (replaced whole, never left half written)."""
    partial = f"{path}.partial"
    with open(partial, "wb") as f:
        f.write(CACHE_MAGIC + fingerprint.encode() + b"\n")
        pickle.dump(fits, f)
    os.replace(partial, path)


def _calibrating(config) -> str:
    return f"calibrate {config.algorithm} d={config.d} g={config.group} {config.tile}"


def run(shape_list, algorithms, band: bool, progress, jobs: int = 1) -> dict:
    """Each shape's row of the model: each allocation at its fastest tiling, at the nominal
    parameters and (``band``) at the fast and the slow corner. ``jobs``: processes that make
    the calibrations (the same figures as one process)."""
    corners = {"nominal": npu_params.values()}
    if band:
        corners.update(fast=npu_params.corner("fast"), slow=npu_params.corner("slow"))
    fits, rows = {}, []
    cells = len(shape_list) * len(algorithms)
    total = len({c for s in shape_list for a in algorithms for c in calibrations(s, a, corners["nominal"])}) + cells
    done = 0

    def fit(config, params, name="nominal"):
        nonlocal done
        if (config, name) not in fits:
            progress(done, total, _calibrating(config))
            done += 1
        return cached_calibration(fits, (config, name), config, params)

    def prefetch(pool, keys):
        """The calibrations of the (config, corner name) ``keys``, made in the pool."""
        nonlocal done
        keys = [k for k in dict.fromkeys(keys) if k not in fits]
        for key, made in zip(keys, pool.imap(_calibration_of, [(c, corners[name]) for c, name in keys])):
            fits[key] = made
            progress(done, total, _calibrating(key[0]))
            done += 1

    pool = _calibration_pool(jobs)
    try:
        if pool is not None:
            prefetch(pool, [(c, "nominal") for s in shape_list for a in algorithms
                            for c in calibrations(s, a, corners["nominal"])])
        chosen = {(s.name, a): fastest(s, a, corners["nominal"], fit) for s in shape_list for a in algorithms}
        chosen_configs = set()  # each chosen tiling's config and those of its tasks of fewer rows
        for s in shape_list:
            for a in algorithms:
                config, result = chosen[(s.name, a)]
                chosen_configs.update((config, *part_configs(s, config, corners["nominal"], result["tail_pieces"])))
        total += (len(corners) - 1) * len(chosen_configs)  # the band's calibrations
        if pool is not None:
            prefetch(pool, [(config, name) for config in sorted(chosen_configs, key=str) for name in corners])
    finally:
        if pool is not None:
            pool.close()
    for shape in shape_list:
        row = dict(shape=shape.name, b=shape.b, h=shape.h, hkv=shape.hkv, sq=shape.sq,
                   skv=shape.skv, d=shape.d, causal=shape.causal)
        for algorithm in algorithms:
            config, nominal = chosen[(shape.name, algorithm)]
            cell = {name: nominal if name == "nominal" else
                    extrapolate(shape, fit(config, params, name), params, lambda c, p, name=name: fit(c, p, name),
                                nominal["tail_pieces"])
                    for name, params in corners.items()}
            progress(done, total, f"{shape.name[:20]} {algorithm}")
            nominal_fit = fits[(config, "nominal")]
            row[algorithm] = dict(
                tflops=nominal["tflops"], time_us=nominal["time_us"], binding=nominal["binding"],
                q_block=config.q_block, kv_block=config.kv_block, tail_pieces=nominal["tail_pieces"],
                vector_prob_sums=config.vector_prob_sums,
                group=config.group,
                cube_share=nominal["tflops"] / npu_params.cube_peak_tflops(corners["nominal"]),
                kv_gbs=nominal["kv_gbs"],
                band=[cell[c]["tflops"] for c in ("slow", "fast") if c in cell],
                exchange_kib_per_block=nominal_fit.per_block("exchange_bytes") / 1024,
                vector_instructions_per_block=round(nominal_fit.per_block("vector_instructions") / 2, 1) + 0.0,
                scalar_ub_accesses_per_block=round(nominal_fit.per_block("scalar_ub_accesses") / 2, 1) + 0.0,
                block=_per_block(nominal_fit, shape, corners["nominal"]), busy=nominal["busy"],
                golden_rmse=max(fits[(config, name)].golden_rmse for name in corners))
            done += 1
        rows.append(row)
    progress(total, total, "done")
    return dict(algorithms=list(algorithms), rows=rows, params=corners["nominal"],
                cube_peak_tflops=npu_params.cube_peak_tflops(corners["nominal"]))


def _per_block(fit, shape: Shape, params: dict) -> dict:
    """One kv block on one AI Core, from the fit: modelled cycles, V and M busy cycles, and the
    ceiling the chip's L2 bandwidth puts on the cube (every core moving this block's GM bytes)."""
    rows = fit.config.q_block if not shape.decode else shape.h // shape.hkv
    ideal = 2 * rows * fit.config.kv_block * shape.d / params["cube_macs_per_cycle"]  # QK^T and PV, perfect cube
    l2 = fit.per_block("gm_bytes") * params["core_num"] / params["l2_aggregate_bytes_per_cycle"]
    cycles = fit.block_cycles()
    return dict(cycles=cycles, v=fit.per_block("busy_V"), m=fit.per_block("busy_M"),
                l2=l2, l2_ceiling=ideal / l2)


def _tile(cell: dict) -> str:
    """The tiling of a reported cell (:func:`tile_name` of its q_block, kv_block and tail choice)."""
    return tile_name(cell["q_block"], cell["kv_block"], cell.get("tail_pieces", 0), cell.get("vector_prob_sums", False))


def markdown(result) -> str:
    algos = result["algorithms"]
    lines = ["**Modelled** (pipe-level timing model of an Atlas A2 / 910B1, parameters in "
             "`pasa_npu/npu_params.py`; not measured on an NPU). TFLOP/s with, in brackets, the band: "
             f"every parameter with a range at its slow and at its fast end; cube peak {result['cube_peak_tflops']:.0f} TFLOP/s. "
             "Each figure is fitted from emulated runs whose outputs were checked against the fp64 "
             "golden; `rmse` is the largest relative RMSE among them. Binding: a pipe, `RD`/`WR` (an AI "
             "Core's GM read/write port), `L2`/`HBM` (the chip's bandwidth), or `path` (the AI Core's "
             "dependency chain: no resource reaches 90% of its cycles). Tile: `q_block` x `kv_block` of the figure, "
             f"of {tiling_choices()} the one "
             "where the allocation is faster among those its kernels take (decode: one tile of a kv group's "
             "query heads whatever `q_block` is); where the tasks leave AI Cores idle in their last round, the "
             "host cuts that round's tasks into pieces of query rows, or, where that is slower (`whole`), "
             f"deals them whole; `{VECTOR_SUMS_MARK}`: pasa's row sums of P' on the vector cores, where "
             "that is faster than on the cube.", "",
             "| shape | " + " | ".join(f"{a} TFLOP/s [band] (binding, % peak, rmse, tile)" for a in algos)
             + (" | pasa / fa-fp32 | pasa-exact / fa-fp32 |" if "fa-fp32" in algos else " |"),
             "|---|" + "---|" * len(algos) + ("---|---|" if "fa-fp32" in algos else "")]
    for row in result["rows"]:
        cells = []
        for a in algos:
            e = row[a]
            band = f" [{e['band'][0]:.0f}-{e['band'][1]:.0f}]" if e["band"] else ""
            cells.append(f"{e['tflops']:.1f}{band} ({e['binding']}, {e['cube_share']:.0%}, {e['golden_rmse']:.1e}, "
                         f"{_tile(e)})")
        ratios = []
        if "fa-fp32" in algos:
            for a in ("pasa", "pasa-exact"):
                ratios.append(f"{row[a]['tflops'] / row['fa-fp32']['tflops']:.2f}" if a in algos else "-")
        lines.append(f"| {row['shape']} | " + " | ".join(cells + ratios) + " |")
    lines += ["", "Per kv block (of the tile named) at each shape's head dim and query heads a tile "
              "(a kv group's stacked where the query is short, decode included), from the calibration "
              "fits: KiB handed between cube and vector through the workspace (S' or S and P'V "
              "out of the cube, P' back; each is also read once); per vector core the vector "
              "instructions and scalar UB accesses; on one AI Core the modelled cycles (V and M "
              "busy); and the share of the cube's peak the chip's L2 bandwidth allows when every "
              "core moves this block's GM bytes:", "",
              "| shape | " + " | ".join(f"{a}: KiB / instr / scalar / cycles (V, M) / L2 ceiling" for a in algos)
              + " |", "|---|" + "---|" * len(algos)]
    seen = set()
    for row in result["rows"]:
        key = (row["d"], row[algos[0]]["group"], row["sq"] == 1)  # the tile's heads (Shape.config)
        if key in seen:
            continue
        seen.add(key)
        cells = [f"{row[a]['exchange_kib_per_block']:.1f} / {row[a]['vector_instructions_per_block']:g} / "
                 f"{abs(row[a]['scalar_ub_accesses_per_block']):g} / {row[a]['block']['cycles']:.0f} "
                 f"({row[a]['block']['v']:.0f}, {row[a]['block']['m']:.0f}) / {row[a]['block']['l2_ceiling']:.0%} "
                 f"({_tile(row[a])})"
                 for a in algos]
        heads = f"{key[1]} head{'s' if key[1] > 1 else ''} a tile"
        lines.append(f"| d={row['d']}, {heads}{', decode' if key[2] else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


#: parameters that enter only the launch total, not the one-core calibration fits
_LAUNCH_ONLY = ("l2_aggregate_bytes_per_cycle", "hbm_aggregate_bytes_per_cycle", "launch_overhead_cycles")


def calibration_key(config, params: dict) -> tuple:
    """What a calibration of ``config`` under ``params`` depends on: the config and the timing
    parameters but those that enter only the launch total (the key the calibrations are kept by)."""
    return config, tuple(sorted((k, v) for k, v in npu_params.timing_only(params).items() if k not in _LAUNCH_ONLY))


#: passes of the coordinate search for a shape's worst corner
WORST_CORNER_PASSES = 3
#: away from the nominal parameters the search tunes pasa among the tilings of at most this many
#: keys (and its nominal tiling): a larger tile's calibration takes several times as long
SEARCH_PASA_KV_BLOCK = 256


#: parameter points (those not named at their nominal value) where earlier searches ended, each
#: the worst corner found for the shape named beside it: every shape's search also evaluates each
#: and starts from the lowest of them and its own start, so the corner it reports is at most each
KNOWN_CORNERS = (
    # paper 1x16x1280x128
    dict(mmad_head_cycles=64, mte1_head_cycles=48, mte2_bytes_per_cycle=128, mte2_head_cycles=64,
         gm_read_latency_cycles=347, mte3_bytes_per_cycle=43, mte3_head_cycles=64, gm_write_latency_cycles=203,
         fix_head_cycles=64, scalar_issue_cycles=4, scalar_ub_access_cycles=20, vs_sync_cycles=50,
         scalar_gm_access_cycles=40, cross_core_latency_cycles=1000, l2_aggregate_bytes_per_cycle=4324,
         launch_overhead_cycles=5000),
    # Qwen2-7B-like, causal
    dict(mmad_head_cycles=64, mte1_head_cycles=48, mte2_head_cycles=8, gm_read_latency_cycles=150,
         mte3_bytes_per_cycle=43, mte3_head_cycles=64, gm_write_latency_cycles=203, fix_head_cycles=64,
         vec_head_cycles=4, scalar_issue_cycles=4, vs_sync_cycles=50, scalar_gm_access_cycles=40,
         cross_core_latency_cycles=1000, l2_aggregate_bytes_per_cycle=4324, launch_overhead_cycles=20000),
    # d=128 S=4096 causal, two searches' ends
    dict(mmad_head_cycles=64, mte1_head_cycles=48, mte2_bytes_per_cycle=128, mte2_head_cycles=8,
         gm_read_latency_cycles=150, mte3_bytes_per_cycle=43, mte3_head_cycles=64, gm_write_latency_cycles=203,
         fix_head_cycles=64, vec_head_cycles=4, scalar_issue_cycles=4, vs_sync_cycles=50,
         scalar_gm_access_cycles=40, cross_core_latency_cycles=1000, l2_aggregate_bytes_per_cycle=4324,
         launch_overhead_cycles=20000),
    dict(mmad_head_cycles=64, mte1_head_cycles=48, mte2_head_cycles=8, gm_read_latency_cycles=150,
         mte3_bytes_per_cycle=43, mte3_head_cycles=8, gm_write_latency_cycles=203, fix_head_cycles=64,
         vec_head_cycles=4, scalar_issue_cycles=4, vs_sync_cycles=50, scalar_gm_access_cycles=40,
         cross_core_latency_cycles=1000, l2_aggregate_bytes_per_cycle=4324, launch_overhead_cycles=20000),
    # d=128 S=16384, three searches' ends
    dict(mmad_head_cycles=64, mte1_head_cycles=48, mte2_head_cycles=8, gm_read_latency_cycles=150,
         mte3_bytes_per_cycle=43, mte3_head_cycles=64, gm_write_latency_cycles=203, fix_head_cycles=64,
         scalar_issue_cycles=4, vs_sync_cycles=50, scalar_gm_access_cycles=40,
         cross_core_latency_cycles=1000, l2_aggregate_bytes_per_cycle=4324, launch_overhead_cycles=20000),
    dict(mmad_head_cycles=64, mte1_head_cycles=48, mte2_head_cycles=64, gm_read_latency_cycles=150,
         mte3_bytes_per_cycle=43, mte3_head_cycles=64, gm_write_latency_cycles=203, fix_head_cycles=64,
         vec_head_cycles=4, scalar_issue_cycles=4, vs_sync_cycles=50, scalar_gm_access_cycles=40,
         cross_core_latency_cycles=1000, l2_aggregate_bytes_per_cycle=4324, launch_overhead_cycles=20000),
    dict(mmad_head_cycles=64, mte1_head_cycles=48, mte2_bytes_per_cycle=128, mte2_head_cycles=64,
         mte3_bytes_per_cycle=43, mte3_head_cycles=64, gm_write_latency_cycles=203, fix_head_cycles=64,
         scalar_issue_cycles=4, vs_sync_cycles=50, scalar_gm_access_cycles=40, cross_core_latency_cycles=1000,
         l2_aggregate_bytes_per_cycle=4324, launch_overhead_cycles=20000),
)


def check_seeds(seeds) -> None:
    """Raise ValueError unless each seed names only parameters that have a range, each at its low,
    nominal or high value (the corners sensitivity() searches)."""
    settable = {p.name: (p.low, p.value, p.high) for p in npu_params.ALL if p.assumption}
    for seed in seeds:
        for name, value in seed.items():
            if name not in settable or value not in settable[name]:
                raise ValueError(f"seeds: expected each parameter with a range at its low, nominal or "
                                 f"high value ({', '.join(settable)}), got {name}={value}")


def search_tilings(shape: Shape, nominal_tiling: tuple) -> tuple:
    """The (q_block, kv_block) tilings the sensitivity search tunes pasa among on ``shape``
    away from the nominal parameters: its ``nominal_tiling`` and every tiling of tilings()
    of at most SEARCH_PASA_KV_BLOCK keys."""
    return tuple(dict.fromkeys((nominal_tiling,) + tuple(
        t for t in tilings(shape) if t[1] <= SEARCH_PASA_KV_BLOCK)))


def _ratio_cell(shape: Shape, params: dict, fit, algorithms, only: dict = None) -> dict:
    """Each allocation on ``shape`` at its fastest tiling under ``params`` (among the tilings
    ``only[allocation]`` where that is given), with its tile and its fit's golden RMSE, and
    the pasa / fa-fp32 ratio."""
    cell = {}
    for a in algorithms:
        config, cell[a] = fastest(shape, a, params, fit, (only or {}).get(a))
        cell[a].update(golden_rmse=fit(config, params).golden_rmse, q_block=config.q_block,
                       kv_block=config.kv_block, vector_prob_sums=config.vector_prob_sums)
    cell["ratio"] = cell["pasa"]["tflops"] / cell["fa-fp32"]["tflops"]
    return cell


def sensitivity(shape_list, progress, algorithms=("fa-fp32", "pasa"), names=None, jobs: int = 1,
                seeds=KNOWN_CORNERS, cache: Optional[str] = None) -> dict:
    """The pasa / fa-fp32 ratio per shape at the nominal parameters, with each parameter that
    has a range alone at its low and at its high end, and at each shape's worst independent
    corner. At the nominal parameters each allocation is at the tiling of tilings() where it is
    faster; away from them fa-fp32 is tuned again at every point (as it would be on a chip with
    those parameters) and pasa among search_tilings() (its nominal tiling and the smaller ones),
    so each ratio is at most what both tuned again would give. Each parameter with a range takes
    its low end, its nominal value or its high end, independently of the others; the search starts
    at the lowest of two kinds of point: every parameter at the end that lowered the ratio alone
    (nominal where neither did), and each of ``seeds`` (KNOWN_CORNERS: the parameters it names
    that are varied, the others nominal). From there it moves one parameter at a time
    (in the order of npu_params.ALL, trying its low, nominal and high value) while that lowers
    the ratio further, up to WORST_CORNER_PASSES passes: a local minimum over the 3^n corners,
    every one evaluated as a whole. The shapes' searches run side by side, each as it would
    alone. At each shape's worst corner both are then tuned among every tiling (``worst``'s
    ``tuned``), from the search's calibrations and more. ``names``: the parameters to vary
    (default: every one with a range). ``jobs``: processes that make the calibrations a
    parameter point needs, before it is evaluated (the same figures as one process). ``cache``: a
    file that keeps the calibrations as they are made and gives them back to a later search of
    the same build (load_calibrations; the same figures as without)."""
    ranged = [p for p in npu_params.ALL if p.assumption and (names is None or p.name in names)]
    check_seeds(seeds)
    fingerprint = calibration_fingerprint() if cache is not None else None  # hashed once, not at every save
    fits = load_calibrations(cache, fingerprint) if cache is not None else {}
    saved = len(fits)
    pool = _calibration_pool(jobs)

    def fit(config, params):
        return cached_calibration(fits, calibration_key(config, params), config, params)

    held = {}  # (shape name, allocation): the tilings it is evaluated at; absent: every one

    def prefetch(points):
        """Calibrate what the (params, shape or None) points need, in the pool where there is one."""
        if pool is None:
            return
        todo = {}
        for params, only in points:
            for shape in shape_list if only is None else [only]:
                for a in algorithms:
                    for c in calibrations(shape, a, params, held.get((shape.name, a))):
                        key = calibration_key(c, params)
                        if key not in fits:
                            todo[key] = (c, params)
        fits.update(zip(todo, pool.map(_calibration_of, list(todo.values()))))

    def evaluate(params, only=None):
        nonlocal saved
        prefetch([(params, only)])
        out = {}
        for shape in shape_list if only is None else [only]:
            out[shape.name] = _ratio_cell(shape, params, fit, algorithms,
                                          {a: held.get((shape.name, a)) for a in algorithms})
        if cache is not None and len(fits) > saved:
            save_calibrations(cache, fits, fingerprint)
            saved = len(fits)
        return out

    try:
        total = 2 + 2 * len(ranged) + WORST_CORNER_PASSES
        progress(0, total, "nominal")
        nominal = evaluate(npu_params.values())
        for shape in shape_list:  # away from the nominal parameters pasa is tuned among fewer tilings
            held[(shape.name, "pasa")] = search_tilings(shape, (nominal[shape.name]["pasa"]["q_block"],
                                                                nominal[shape.name]["pasa"]["kv_block"]))
        alone, done = {}, 1
        for p in ranged:
            alone[p.name] = {}
            for end in ("low", "high"):
                progress(done, total, f"{p.name} {end}")
                alone[p.name][end] = evaluate(npu_params.values(**{p.name: getattr(p, end)}))
                done += 1
        # each shape's search starts where each parameter alone lowered its ratio; the shapes
        # search side by side (the same moves as one after the other), so that each step's
        # calibrations for every shape still moving run in the pool together
        corner, best = {}, {}
        for shape in shape_list:
            corner[shape.name] = {}
            for p in ranged:
                ends = {getattr(p, end): alone[p.name][end][shape.name]["ratio"] for end in ("low", "high")}
                lowest = min(ends, key=ends.get)
                corner[shape.name][p.name] = lowest if ends[lowest] < nominal[shape.name]["ratio"] else p.value
        starts = [{p.name: seed.get(p.name, p.value) for p in ranged} for seed in seeds]
        prefetch([(npu_params.values(**corner[s.name]), s) for s in shape_list]
                 + [(npu_params.values(**start), None) for start in starts])
        for shape in shape_list:
            best[shape.name] = evaluate(npu_params.values(**corner[shape.name]), shape)[shape.name]
            for start in starts:
                got = evaluate(npu_params.values(**start), shape)[shape.name]
                if got["ratio"] < best[shape.name]["ratio"] - 1e-9:
                    corner[shape.name], best[shape.name] = dict(start), got
        searching = list(shape_list)
        for n in range(WORST_CORNER_PASSES):
            if not searching:
                break
            progress(done, total, f"worst corners, pass {n + 1} ({len(searching)} shapes)")
            done += 1
            moved = {shape.name: False for shape in searching}
            for p in ranged:
                for value in dict.fromkeys((p.low, p.value, p.high)):
                    trials = {s.name: dict(corner[s.name], **{p.name: value}) for s in searching
                              if value != corner[s.name][p.name]}
                    prefetch([(npu_params.values(**trials[s.name]), s) for s in searching if s.name in trials])
                    for shape in searching:
                        if shape.name not in trials:
                            continue
                        got = evaluate(npu_params.values(**trials[shape.name]), shape)[shape.name]
                        if got["ratio"] < best[shape.name]["ratio"] - 1e-9:
                            corner[shape.name], best[shape.name] = trials[shape.name], got
                            moved[shape.name] = True
            searching = [s for s in searching if moved[s.name]]
        progress(done, total, "worst corners, both tuned among every tiling")
        held.clear()
        corners = {s.name: npu_params.values(**corner[s.name]) for s in shape_list}
        prefetch([(corners[s.name], s) for s in shape_list])
        tuned = {s.name: evaluate(corners[s.name], s)[s.name] for s in shape_list}
    finally:
        if pool is not None:
            pool.close()
    worst = {s.name: dict(corner=corner[s.name], result=best[s.name], tuned=tuned[s.name]) for s in shape_list}
    progress(total, total, "done")
    evaluated = [nominal] + [r for ends in alone.values() for r in ends.values()] \
        + [{n: w["result"]} for n, w in worst.items()]
    rmse = max(cell[a]["golden_rmse"] for r in evaluated for cell in r.values() for a in algorithms)
    return dict(shapes=[s.name for s in shape_list], nominal=nominal, alone=alone, worst=worst,
                ranged=[dict(name=p.name, value=p.value, low=p.low, high=p.high, source=p.source) for p in ranged],
                seeds=len(seeds), golden_rmse=rmse)


def sensitivity_markdown(result) -> str:
    names = result["shapes"]
    lines = ["**Modelled** (pipe-level timing model of an Atlas A2 / 910B1, parameters and their sources "
             "in `pasa_npu/npu_params.py`; not measured on an NPU). pasa / fa-fp32 TFLOP/s ratio with each "
             "parameter that has a range alone at its low / high end, the others nominal. At the nominal "
             f"parameters each allocation is at the tiling (`q_block` x `kv_block`: {tiling_choices()}) "
             "where it is faster, among those its kernels take; away from them fa-fp32 is tuned again at "
             "every point and pasa among its nominal tiling and those of at most "
             f"{SEARCH_PASA_KV_BLOCK} keys, so each ratio is at most the one with both tuned again among "
             "every tiling. "
             "Every figure is "
             "fitted from emulated runs checked against the fp64 golden (largest relative RMSE "
             f"{result['golden_rmse']:.1e}).", "",
             "| parameter (nominal, range) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names),
             "| nominal | " + " | ".join(f"{result['nominal'][n]['ratio']:.2f}" for n in names) + " |"]
    for p in result["ranged"]:
        ends = result["alone"][p["name"]]
        cells = [f"{ends['low'][n]['ratio']:.2f} / {ends['high'][n]['ratio']:.2f}" for n in names]
        lines.append(f"| `{p['name']}` ({p['value']:g}, {p['low']:g} - {p['high']:g}) | " + " | ".join(cells) + " |")
    lines += ["", "Worst independent corner per shape: each parameter with a range at its low end, its "
              "nominal value or its high end, independently of the others; found by a coordinate search "
              "that starts from the lowest of the ends that lowered the ratio alone and "
              f"{result['seeds']} corner{'s' if result['seeds'] != 1 else ''} found by earlier searches "
              "(`npu_model.KNOWN_CORNERS`; a local minimum over the "
              f"3^{len(result['ranged'])} corners, each evaluated whole). TFLOP/s and binding resource "
              "at that corner, and the ratio there with pasa tuned again among every tiling (the search "
              f"tunes pasa among its nominal tiling and those of at most {SEARCH_PASA_KV_BLOCK} keys: the "
              "ratio with both tuned among every tiling lies between the two):", "",
              "| shape | nominal ratio | worst-corner ratio | fa-fp32 there | pasa there "
              "| pasa tuned again there: ratio (pasa) "
              "| the corner (parameters not at their nominal value) |",
              "|---|---|---|---|---|---|---|"]
    for n in names:
        w = result["worst"][n]
        r, t = w["result"], w["tuned"]
        nominal_values = npu_params.values()
        lows = ", ".join(f"`{k}`={v:g}" for k, v in w["corner"].items() if v != nominal_values[k])
        lines.append(f"| {n} | {result['nominal'][n]['ratio']:.2f} | {r['ratio']:.2f} | "
                     f"{r['fa-fp32']['tflops']:.1f} ({r['fa-fp32']['binding']}, {_tile(r['fa-fp32'])}) | "
                     f"{r['pasa']['tflops']:.1f} ({r['pasa']['binding']}, {_tile(r['pasa'])}) | "
                     f"{t['ratio']:.2f} ({t['pasa']['tflops']:.1f}, {t['pasa']['binding']}, {_tile(t['pasa'])}) | "
                     f"{lows} |")
    return "\n".join(lines) + "\n"


SETS = ("paper", "sweep", "decode", "readme")
#: the shape sets modelled where --sets is not given: by the model run, by --sensitivity
DEFAULT_SETS, SENSITIVITY_SETS = ("paper", "sweep", "decode"), ("readme",)
DEFAULT_OUT = "npu-model-out"
#: the options each mode takes besides its own flag and --quiet; it refuses the others, which it would ignore
MODE_OPTIONS = {
    "the model run": ("--out", "--sets", "--algorithms", "--no-band", "--jobs"),
    "--sensitivity": ("--out", "--sets", "--jobs", "--cache"),
    "--calibrate": ("--out",),
    "--sim": ("--out", "--algorithms"),
    "--params": (),
}


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _jobs(text: str) -> int:
    """--jobs: a whole number >= 1; more than the cores here run as that many."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of processes >= 1, got {text}")
    return min(value, _cores())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pasa-npu-model", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    parser.add_argument("--out", help="folder for npu_model.md/.json (npu_calibrate.md, npu_sensitivity.md/.json, "
                                      f"npu_sim.md/.json) (default: {DEFAULT_OUT})")
    parser.add_argument("--sets", nargs="+", choices=SETS,
                        help=f"shape sets to model (default: {' '.join(DEFAULT_SETS)}; "
                             f"with --sensitivity: {' '.join(SENSITIVITY_SETS)})")
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS,
                        help=f"allocations to model (default: {' '.join(ALGORITHMS)})")
    parser.add_argument("--no-band", action="store_true", help="nominal parameters only (default: the band too)")
    mode.add_argument("--params", action="store_true", help="print the parameter table and exit")
    mode.add_argument("--calibrate", action="store_true",
                      help="compare the model with the public figures measured on Atlas A2 hardware")
    mode.add_argument("--sensitivity", action="store_true",
                      help="each parameter with a range alone at both ends; the ratio's worst corner")
    mode.add_argument("--sim", action="store_true",
                      help="the instruction-level model (the simulator, ascend_kernels/sim) beside this one, "
                           "at its own shapes and nominal parameters")
    parser.add_argument("--jobs", type=_jobs,
                        help=f"processes that make the calibrations of the model run or --sensitivity, at most "
                             f"the cores here ({_cores()}): more run as that many (default: 1)")
    parser.add_argument("--cache", metavar="FILE",
                        help="with --sensitivity: keep its calibrations in FILE as they are made, and take "
                             "those FILE holds from an earlier search of the same build (default: none)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _check_cache_path(path: str) -> None:
    """CacheError unless ``path`` can be written as the cache and, where it exists, is one of this build."""
    if os.path.isdir(path):
        raise CacheError(f"--cache {path}: expected a file, got a folder")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CacheError(f"--cache {path}: expected a file in an existing folder, got a path whose folder "
                         f"{folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CacheError(f"--cache {path}: expected a file in a writable folder, got {folder}, not writable")
    check_cache(path, calibration_fingerprint())


def _report(args, progress) -> tuple:
    """The report of the mode ``args`` name: its Markdown, its data (None: none) and the file names."""
    if args.calibrate:
        return npu_calibrate.markdown(npu_params.values(), progress), None, ["npu_calibrate.md"]
    if args.sim:
        data = npu_sim.compare(npu_sim.SHAPES, args.algorithms or ALGORITHMS, npu_params.values(), progress=progress)
        return npu_sim.markdown(data), data, ["npu_sim.md", "npu_sim.json"]
    if args.sensitivity:
        data = sensitivity(shapes(args.sets or SENSITIVITY_SETS), progress, jobs=args.jobs or 1, cache=args.cache)
        return sensitivity_markdown(data), data, ["npu_sensitivity.md", "npu_sensitivity.json"]
    data = run(shapes(args.sets or DEFAULT_SETS), args.algorithms or ALGORITHMS, not args.no_band, progress,
               jobs=args.jobs or 1)
    return markdown(data), data, ["npu_model.md", "npu_model.json"]


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    mode = next((f"--{m}" for m in ("params", "calibrate", "sensitivity", "sim") if getattr(args, m)), "the model run")
    ignored = [o for o in MODE_OPTIONS["the model run"] + ("--cache",)
               if o not in MODE_OPTIONS[mode] and getattr(args, o[2:].replace("-", "_")) not in (None, False)]
    if ignored:
        parser.error(f"{', '.join(ignored)}: not used by {mode}, which takes "
                     f"{', '.join(MODE_OPTIONS[mode] + ('--quiet',))}")
    if args.params:
        print(params_markdown(), end="")
        return 0
    try:  # the paths are checked before any work
        out = pathlib.Path(checked_folder(args.out or DEFAULT_OUT))
        if args.cache is not None:
            _check_cache_path(args.cache)
    except (OutputFolderError, CacheError) as exc:
        parser.error(str(exc))
    progress = ProgressBar(not args.quiet)
    try:
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(created_folder(str(out)))  # created now, removed again if the run fails
            except OutputFolderError as exc:
                parser.error(str(exc))
            text, data, names = _report(args, progress)
            (out / names[0]).write_text(text)
            if data is not None:
                (out / names[1]).write_text(json.dumps(data, indent=1, default=str))
    except (WrongRunError, CacheError) as exc:
        print(f"pasa-npu-model: {exc}", file=sys.stderr)
        return 1
    except npu_sim.SimUnavailable as exc:
        print(f"pasa-npu-model: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(("" if args.quiet else "\n") + "pasa-npu-model: interrupted", file=sys.stderr)  # past the bar's line
        return 130
    print(text, end="")
    print(f"\nwrote {', '.join(names)} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
