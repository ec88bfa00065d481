"""``pasa-compare``: operator-level precision comparison against an fp64 golden.

Commands (``sweep`` when none is given, so a bare ``pasa-compare`` runs the default sweep,
a minute or more on a CPU):

* ``sweep``: the paper's uniform/hybrid sweeps, the resonance case and the score spread
  beyond fp16;
* ``file``: Q/K/V from .pt/.npy/.npz/.safetensors files in any supported layout;
* ``capture``: Q/K/V captured from chosen layers of a local Hugging Face model;
* ``bias``: the rounding-bias experiment, with and without ``rounding_guard``.

Every run prints its tables and writes results.csv, per_head.csv, results.json,
summary.md and PNG plots (bias: bias.*) into ``--out``, which it creates only when it
writes them. A bad input or option ends with one line on stderr and exit status 2. A
candidate that fails on an item shows ``error`` in the tables, and each distinct reason is
printed once on stderr; when no candidate computed anything the exit status is 1.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import sys
import time
from typing import Optional

import torch

import pasa_npu
from pasa_npu.backends import available_backends
from pasa_npu.numerics import DEFAULT_BETA0
from pasa_npu.tools.command_line import (OutputFolderError, checked_folder, created_folder,
                                         positive_float, positive_int)
from pasa_npu.tools.inputs import PAPER_SHAPE

from . import candidates as cand_mod
from .errors import CompareError
from .evaluate import check_finite_inputs, choose_baseline, compare
from .inputs import DEFAULT_SWEEPS, DTYPES, FILE_LAYOUTS, SWEEP_GROUPS, case_item, file_item, sweep_cases
from .progress import ProgressBar

DEFAULT_PROMPT = "The quick brown fox jumps over the lazy dog. " * 8
COMMANDS = ("sweep", "file", "capture", "bias")
#: sweep's (B, N, S, D) options and their defaults
SHAPE_OPTIONS = {"batch": 1, "heads": 4, "seq": 1280, "dim": 128}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise CompareError(f"{self.prog}: {message}")


def _device(text):
    """``text``, where it names a device this torch can place tensors on."""
    reason = device_unavailable(text)
    if reason:
        raise argparse.ArgumentTypeError(f"--device must be a device this torch can run on, got "
                                         f"{text!r}: {reason}")
    return text


def device_unavailable(name: str) -> Optional[str]:
    """None when tensors can be placed on the device ``name`` here, else why not."""
    if name.split(":")[0] == "npu":  # a device type torch knows once torch_npu registers it
        if importlib.util.find_spec("torch_npu") is None:
            return "torch_npu is not installed"
        try:
            import torch_npu  # noqa: F401
        except Exception as err:
            return f"torch_npu failed to import: {str(err).splitlines()[0] if str(err) else err!r}"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        return "not a torch device name (cpu, cuda, cuda:1, npu, ...)"
    if device.type == "cpu":
        return None
    if device.type == "meta":
        return "meta tensors hold no values"
    if device.type == "cuda" and not torch.backends.cuda.is_built():
        return f"this torch ({torch.__version__}) was built without CUDA"
    if device.type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device is visible"
    try:
        torch.empty(0, device=device)
    except Exception as err:  # whatever the device's runtime says, in one line
        return str(err).splitlines()[0] if str(err).strip() else type(err).__name__
    return None


def _dtype(text):
    if text not in DTYPES:
        raise argparse.ArgumentTypeError(f"dtype must be one of {', '.join(DTYPES)}, got {text!r}")
    return DTYPES[text]


def _candidate_options(p):
    g = p.add_argument_group("candidates")
    g.add_argument("--allocations", nargs="+", default=list(pasa_npu.ALGORITHM_NAMES),
                   metavar="NAME", help="precision allocations (default: all: "
                   f"{' '.join(pasa_npu.ALGORITHM_NAMES)})")
    g.add_argument("--backends", nargs="+", default=None, metavar="NAME",
                   help="pasa_npu backends (default: every one available on --device)")
    g.add_argument("--third-party", nargs="*", default=list(cand_mod.THIRD_PARTY), metavar="NAME",
                   help="third-party candidates, run where installed; the option alone: none "
                   f"(default: {' '.join(cand_mod.THIRD_PARTY)})")
    g.add_argument("--baseline", default="auto",
                   help="third party of the dual-benchmark verdict: auto (npu-ip0 when it runs, "
                   "else sdpa), a name, or none (default auto)")
    g.add_argument("--device", type=_device, default="cpu",
                   help="device the candidates run on, e.g. cpu, cuda, npu (default cpu; the "
                   "fp64 golden always runs on CPU)")
    g.add_argument("--beta0", type=float, default=None,
                   help="start of the optimal-beta iteration for pasa/pasa-mixed (default: the "
                   "package's, 1 - 2**-6)")
    g.add_argument("--rounding-guard", action="store_true",
                   help="run the allocations with rounding_guard=True")
    _output_options(p)


def _output_options(p):
    g = p.add_argument_group("output")
    g.add_argument("--out", default=None, help="output folder (default: pasa-compare-out/COMMAND)")
    g.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pasa-compare", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="Run 'pasa-compare COMMAND --help' for a command's options.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    p = sub.add_parser("sweep", help="the paper's sweeps (Figures 9-10, Table 4) and resonance",
                       description="The paper's benchmark sweeps at (B, N, S, D); default "
                       "(1, 4, 1280, 128), --paper-shape for (1, 16, 1280, 128).")
    # shape options default to None so that --paper-shape can tell that one was given
    p.add_argument("--heads", type=positive_int("heads"), help="N (default 4; paper 16)")
    p.add_argument("--seq", type=positive_int("seq"), help="S (default 1280)")
    p.add_argument("--dim", type=positive_int("dim"), help="D (default 128)")
    p.add_argument("--batch", type=positive_int("batch"), help="B (default 1)")
    p.add_argument("--paper-shape", action="store_true",
                   help="the paper's (1, 16, 1280, 128); not with --batch/--heads/--seq/--dim")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated inputs (default 0)")
    p.add_argument("--dtype", type=_dtype, default=torch.float16,
                   help="input dtype: fp16 (the paper's) or bf16 (default fp16)")
    p.add_argument("--sweeps", nargs="+", default=list(DEFAULT_SWEEPS), metavar="NAME",
                   help=f"which sweeps: {' '.join(SWEEP_GROUPS)} (default: all but table4, "
                   "whose cases they contain)")
    _candidate_options(p)

    p = sub.add_parser("file", help="Q/K/V from files",
                       description="Q/K/V from one container file (.pt dict or (q, k, v) tuple, "
                       ".npz, .safetensors; tensors named q/k/v or query/key/value, optional "
                       "bool atten_mask, True = masked, optional learnable_sink, one logit "
                       "per query head) or three files (.pt, .npy, ...).")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--layout", default="BNSD", help=f"layout of the tensors: "
                   f"{', '.join(FILE_LAYOUTS)} (TND/NTD: one sequence; default BNSD)")
    p.add_argument("--num-heads", type=positive_int("num-heads"), default=None,
                   help="query heads (needed for BSH)")
    p.add_argument("--num-kv-heads", type=positive_int("num-kv-heads"), default=None,
                   help="key/value heads (BSH with GQA)")
    p.add_argument("--scale", type=positive_float("scale"), default=None,
                   help="softmax scale, > 0 (default 1/sqrt(D))")
    p.add_argument("--dtype", type=_dtype, default=None,
                   help="round inputs to fp16 or bf16 (default: keep fp16/bf16, fp32 -> fp16)")
    _candidate_options(p)

    p = sub.add_parser("capture", help="Q/K/V captured from a local Hugging Face model",
                       description="Runs a local Hugging Face model once on a prompt and "
                       "compares attention on the Q/K/V that reached the chosen layers.")
    p.add_argument("model", help="a save_pretrained() directory (no download)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=DEFAULT_PROMPT,
                     help="text the model runs on, cut to --max-tokens tokens (default: "
                     "'The quick brown fox jumps over the lazy dog.' 8 times)")
    src.add_argument("--token-ids", type=int, nargs="+", default=None, metavar="ID",
                     help="token ids instead of a prompt (models without a tokenizer); at most "
                     "--max-tokens of them")
    p.add_argument("--layers", type=int, nargs="+", default=[0], help="layer indices (default 0)")
    p.add_argument("--max-tokens", type=positive_int("max-tokens"), default=2048,
                   help="most tokens the model runs on (default 2048)")
    p.add_argument("--model-dtype", choices=("fp32", "fp16", "bf16"), default=None,
                   help="dtype to load the model in (default: as saved)")
    p.add_argument("--dtype", type=_dtype, default=None,
                   help="round captured Q/K/V to fp16 or bf16 (default: the model's if fp16/bf16, "
                   "else fp16)")
    _candidate_options(p)

    p = sub.add_parser("bias", help="rounding-bias experiment with and without rounding_guard",
                       description="Rows with repeated maxima and same-signed V: signed mean "
                       "error over many trials, guard off and on, 95% CI.")
    p.add_argument("--allocations", nargs="+", default=["fa-fp16", "pasa", "pasa-exact"],
                   metavar="NAME", help="precision allocations (default fa-fp16 pasa pasa-exact)")
    p.add_argument("--dtypes", nargs="+", type=_dtype, default=[torch.bfloat16, torch.float16],
                   metavar="DTYPE", help="input dtypes (default bf16 fp16)")
    p.add_argument("--trials", type=int, default=50, help="independent inputs (default 50)")
    p.add_argument("--ties", type=int, default=2, help="equal maxima per score row (default 2)")
    p.add_argument("--gap", type=float, default=12.0,
                   help="scaled score gap between the tied maxima and the rest (default 12)")
    p.add_argument("--heads", type=int, default=8, help="heads per trial (default 8)")
    p.add_argument("--queries", type=int, default=128,
                   help="query rows per head, S1 (default 128)")
    p.add_argument("--keys", type=int, default=128, help="keys per head, S2 (default 128)")
    p.add_argument("--dim", type=int, default=64, help="head dim, D (default 64)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of trial 0; trial t uses seed + t (default 0)")
    _output_options(p)
    return parser


def _folder(args) -> str:
    """The output folder, checked but not created: a command creates it only once it has
    results to write (:func:`~pasa_npu.tools.command_line.created_folder`)."""
    return checked_folder(args.out or os.path.join("pasa-compare-out", args.command))


def _beta(args) -> Optional[float]:
    """The beta solved from --beta0 (None without it: the package solves its default per
    call). A scale where the optimal accuracy condition has no solution is refused here
    when pasa or pasa-mixed is asked for, rather than failing every one of their cells."""
    shifted = [a for a in dict.fromkeys(args.allocations) if a in pasa_npu.ALLOCATIONS
               and pasa_npu.ALLOCATIONS[a].pseudo_average_shift]
    if args.beta0 is not None and not 0.0 < args.beta0 < 1.0:
        raise CompareError(f"--beta0 must lie in (0, 1), got {args.beta0}")
    if not shifted:  # beta applies to pasa and pasa-mixed only
        return None
    beta0 = DEFAULT_BETA0 if args.beta0 is None else args.beta0
    try:
        beta = pasa_npu.optimal_beta(beta0, pasa_npu.DEFAULT_TILING.kv_block,
                                     scale=args.scale_for_beta)
    except ValueError as err:
        raise CompareError(f"{args.scale_origin}: PASA's shift fraction beta has no solution "
                           f"at this scale ({err}); leave {' and '.join(shifted)} out of "
                           f"--allocations") from err
    return None if args.beta0 is None else beta


def _candidates(args):
    beta = _beta(args)
    cands, skipped = cand_mod.build(args.allocations, args.backends, args.third_party,
                                    args.device, beta, args.rounding_guard)
    baseline = choose_baseline(args.baseline, cands, skipped)
    return cands, skipped, baseline, beta


def _settings(args, extra: dict, cands, beta) -> dict:
    s = {"command": "pasa-compare " + " ".join(sys.argv[1:]) if args.argv is None
         else "pasa-compare " + " ".join(args.argv)}
    s.update(extra)
    s.update({"device": args.device,
              "backends available": ", ".join(available_backends(args.device)),
              "candidates": ", ".join(c.label for c in cands),
              "beta (pasa, pasa-mixed)": "package default" if beta is None else f"{beta:.6f}",
              "rounding_guard": args.rounding_guard, "torch": torch.__version__,
              "pasa_npu": pasa_npu.__version__, "machine": platform.machine()})
    return s


def _run_comparison(args, items, title, extra, sweep=False, shape=None) -> int:
    cands, skipped, baseline, beta = args.prepared
    check_finite_inputs(items)
    folder = _folder(args)
    start = time.perf_counter()
    comp = compare(items, cands, skipped, baseline, ProgressBar(not args.quiet))
    from . import report
    print(report.console(comp, title, sweep=sweep))
    settings = _settings(args, extra, cands, beta)
    plots = []
    with created_folder(folder):
        if not args.no_plots:
            from . import plots as plot_mod
            plots = (plot_mod.sweep_figures(comp, folder, shape) if sweep
                     else plot_mod.item_figures(comp, folder))
        paths = report.write_csv(comp, folder) + [report.write_json(comp, folder, settings)]
        paths.append(report.write_markdown(comp, folder, title, settings, plots, sweep=sweep))
    print(f"\nwrote {', '.join(os.path.basename(p) for p in paths + plots)} to {folder} "
          f"({time.perf_counter() - start:.0f} s)")
    sys.stdout.flush()  # the tables before the failures on a shared terminal
    for line in _failures(comp.records, len(items)):
        print(f"pasa-compare: {line}", file=sys.stderr)
    if not any(r.status == "ok" for r in comp.records):
        print(f"pasa-compare: error: no candidate computed a result (reasons above and in "
              f"{os.path.join(folder, 'summary.md')})", file=sys.stderr)
        return 1
    return 0


def _failures(records, n_items: int, most: int = 10) -> list[str]:
    """One line per distinct reason a candidate failed: which candidates, on how many
    items, and the reason's first line; at most ``most`` lines and a count of the rest."""
    failed: dict[str, dict[str, int]] = {}  # reason -> candidate -> items
    for r in records:
        if r.status != "ok":
            lines = r.reason.strip().splitlines() or ["(no reason given)"]
            per = failed.setdefault(lines[0], {})
            per[r.candidate] = per.get(r.candidate, 0) + 1
    out = []
    for reason, per in failed.items():
        where = ", ".join(f"{c} ({n} of {n_items} items)" if n < n_items else c
                          for c, n in per.items())
        out.append(f"{where} failed: {reason}")
    if len(out) > most:
        out = out[:most] + [f"... and {len(out) - most} more reasons (see summary.md)"]
    return out


def _memory_bytes() -> Optional[int]:
    """This machine's physical memory, None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _check_memory(shape, cases: int, dtype: torch.dtype) -> None:
    """Refuse a sweep whose generated inputs alone exceed the machine's memory: every case's
    Q/K/V in ``dtype``, and one case's Q/K/V in fp64 while it is generated."""
    numel = math.prod(shape)
    need = 3 * numel * (cases * dtype.itemsize + 8)
    have = _memory_bytes()
    if have is not None and need > have:
        raise CompareError(f"--batch/--heads/--seq/--dim: the inputs at (B, N, S, D) = {shape} "
                           f"need about {need / 2**30:.3g} GiB ({cases} cases), more than this "
                           f"machine's {have / 2**30:.3g} GiB of memory")


def _sweep(args) -> int:
    given = [f"--{name}" for name in SHAPE_OPTIONS if getattr(args, name) is not None]
    if args.paper_shape and given:
        raise CompareError(f"pasa-compare sweep: argument --paper-shape: not allowed with "
                           f"{', '.join(given)} (it sets (B, N, S, D) = {PAPER_SHAPE})")
    defaults = dict(zip(SHAPE_OPTIONS, PAPER_SHAPE)) if args.paper_shape else SHAPE_OPTIONS
    for name, default in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    cases = sweep_cases(args.sweeps)
    shape = (args.batch, args.heads, args.seq, args.dim)
    _check_memory(shape, len(cases), args.dtype)
    args.scale_for_beta = args.dim ** -0.5
    args.scale_origin = f"scale 1/sqrt(D) = {args.scale_for_beta:.4g} (--dim {args.dim})"
    args.prepared = _candidates(args)
    items = [case_item(c, shape, args.seed, args.dtype) for c in cases]
    dt = str(args.dtype).replace("torch.", "")
    title = (f"paper sweeps at (B, N, S, D) = {shape}, {dt} inputs, scale 1/sqrt(D), seed "
             f"{args.seed}")
    return _run_comparison(args, items, title, {"shape (B,N,S,D)": shape, "dtype": dt,
                                                "seed": args.seed}, sweep=True, shape=shape)


def _file(args) -> int:
    item = file_item(args.paths, args.layout, args.num_heads, args.num_kv_heads, args.scale,
                     args.dtype)
    args.scale_for_beta = item.scale
    args.scale_origin = (f"--scale {args.scale:g}" if args.scale is not None
                         else f"scale 1/sqrt(D) = {item.scale:.4g}")
    args.prepared = _candidates(args)
    dt = str(item.dtype).replace("torch.", "")
    mask, sinks = item.mask_description(), item.sink_description()
    title = (f"{item.name}: query {tuple(item.query.shape)} (BNSD), key/value "
             f"{tuple(item.key.shape)}, {dt}, scale {item.scale:.4g}, mask: {mask}, "
             f"sinks: {sinks}")
    return _run_comparison(args, [item], title, {"inputs": ", ".join(args.paths),
                                                 "layout": args.layout, "dtype": dt,
                                                 "mask": mask, "sinks": sinks})


def _capture(args) -> int:
    from .capture import items_from_captures, load_model, record_attention, tokenize
    # candidates first: a bad candidate option should not wait for a model load
    args.scale_for_beta = 1.0
    cand_mod.build(args.allocations, args.backends, args.third_party, args.device)
    if args.token_ids and len(args.token_ids) > args.max_tokens:
        raise CompareError(f"--token-ids: {len(args.token_ids)} ids given, more than "
                           f"--max-tokens {args.max_tokens}; pass fewer ids or a larger "
                           f"--max-tokens")
    model, tokenizer = load_model(args.model, args.model_dtype, args.layers, args.quiet)
    ids = tokenize(tokenizer, args.prompt, args.token_ids, args.model, args.max_tokens)
    vocab = model.get_input_embeddings().num_embeddings
    if int(ids.max()) >= vocab or int(ids.min()) < 0:
        raise CompareError(f"--token-ids must lie in [0, {vocab}), got {int(ids.min())} to "
                           f"{int(ids.max())}")
    captures = record_attention(model, ids, args.layers)
    items = items_from_captures(captures, args.dtype)
    args.scale_for_beta = items[0].scale
    args.scale_origin = f"the model's scale {items[0].scale:.4g}"
    args.prepared = _candidates(args)
    dt = str(items[0].dtype).replace("torch.", "")
    sinks = " (with gpt-oss's attention sinks)" if items[0].sink is not None else ""
    title = (f"{args.model}: layers {args.layers}, {ids.shape[1]} tokens, captured "
             f"{captures[0].query.dtype} -> {dt}{sinks}")
    return _run_comparison(args, items, title, {"model": args.model, "tokens": ids.shape[1],
                                                "layers": args.layers, "dtype": dt})


def _bias(args) -> int:
    from . import bias
    setup = bias.BiasSetup(args.heads, args.queries, args.keys, args.dim, args.ties, args.gap,
                           args.trials, args.seed)
    setup.check()
    folder = _folder(args)
    start = time.perf_counter()
    allocations, dtypes = list(dict.fromkeys(args.allocations)), list(dict.fromkeys(args.dtypes))
    rows = bias.run_bias(allocations, dtypes, setup, ProgressBar(not args.quiet))
    print(bias.console(rows, setup))
    with created_folder(folder):
        paths = bias.write(rows, setup, folder, plot=not args.no_plots)
    print(f"\nwrote {', '.join(os.path.basename(p) for p in paths)} to {folder} "
          f"({time.perf_counter() - start:.0f} s)")
    return 0


def _out_of_memory(err: BaseException) -> Optional[str]:
    """The allocator's complaint in one line where ``err`` is an allocation failure."""
    text = str(err).strip()
    if (isinstance(err, (MemoryError, torch.cuda.OutOfMemoryError))
            or "can't allocate memory" in text):
        return (text.split("DefaultCPUAllocator: ")[-1].splitlines() or [type(err).__name__])[0]
    return None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["sweep"] + argv  # a bare pasa-compare, or sweep's options alone
    try:
        if argv[0] not in COMMANDS + ("-h", "--help"):
            raise CompareError(f"unknown command {argv[0]!r}; expected one of "
                               f"{', '.join(COMMANDS)} (or sweep's options alone)")
        args = build_parser().parse_args(argv)
        args.argv = argv
        command = {"sweep": _sweep, "file": _file, "capture": _capture, "bias": _bias}
        return command[args.command](args)
    except (CompareError, OutputFolderError) as err:
        print(f"pasa-compare: error: {err}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as err:
        reason = _out_of_memory(err)
        if reason is None:
            raise
        print(f"pasa-compare: error: out of memory: {reason}; try smaller inputs",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pasa-compare: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (| head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
