"""``pasa-compare``: operator-level precision comparison against an fp64 golden.

Commands (``sweep`` when none is given):

* ``sweep``: the paper's uniform/hybrid sweeps, the resonance case and the score spread
  beyond fp16;
* ``file``: Q/K/V from .pt/.npy/.npz/.safetensors files in any supported layout;
* ``capture``: Q/K/V captured from chosen layers of a local Hugging Face model;
* ``bias``: the rounding-bias experiment, with and without ``rounding_guard``.

Every run prints its tables and writes results.csv, per_head.csv, results.json,
summary.md and PNG plots (bias: bias.*) into ``--out``, which it creates only when it
writes them. A bad input or option ends with one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import contextlib
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

from . import candidates as cand_mod
from .errors import CompareError
from .evaluate import check_finite_inputs, choose_baseline, compare
from .inputs import DEFAULT_SWEEPS, DTYPES, FILE_LAYOUTS, SWEEP_GROUPS, case_item, file_item, sweep_cases
from .progress import ProgressBar

COMMANDS = ("sweep", "file", "capture", "bias")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise CompareError(f"{self.prog}: {message}")


def _positive(name):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be an integer, got {text!r}")
        if value < 1:
            raise argparse.ArgumentTypeError(f"--{name} must be >= 1, got {value}")
        return value
    return parse


def _positive_float(name):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be a number, got {text!r}")
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"--{name} must be finite and > 0, got {text}")
        return value
    return parse


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
                   help="third-party candidates, run where installed (default: "
                   f"{' '.join(cand_mod.THIRD_PARTY)})")
    g.add_argument("--baseline", default="auto",
                   help="third party of the dual-benchmark verdict: auto (npu-ip0 when it runs, "
                   "else sdpa), a name, or none")
    g.add_argument("--device", type=_device, default="cpu",
                   help="device the candidates run on (golden: CPU)")
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
    parser = _Parser(prog="pasa-compare", description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="Run 'pasa-compare COMMAND --help' for a command's options.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    p = sub.add_parser("sweep", help="the paper's sweeps (Figures 9-10, Table 4) and resonance",
                       description="The paper's benchmark sweeps at (B, N, S, D); default "
                       "(1, 4, 1280, 128), --paper-shape for (1, 16, 1280, 128).")
    p.add_argument("--heads", type=_positive("heads"), default=4, help="N (default 4; paper 16)")
    p.add_argument("--seq", type=_positive("seq"), default=1280, help="S (default 1280)")
    p.add_argument("--dim", type=_positive("dim"), default=128, help="D (default 128)")
    p.add_argument("--batch", type=_positive("batch"), default=1, help="B (default 1)")
    p.add_argument("--paper-shape", action="store_true", help="(1, 16, 1280, 128), the paper's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", type=_dtype, default=torch.float16, help="fp16 (paper) or bf16")
    p.add_argument("--sweeps", nargs="+", default=list(DEFAULT_SWEEPS), metavar="NAME",
                   help=f"which sweeps: {' '.join(SWEEP_GROUPS)} (default: all but table4, "
                   "whose cases they contain)")
    _candidate_options(p)

    p = sub.add_parser("file", help="Q/K/V from files",
                       description="Q/K/V from one container file (.pt dict or (q, k, v) tuple, "
                       ".npz, .safetensors; tensors named q/k/v or query/key/value, optional "
                       "bool atten_mask, True = masked) or three files (.pt, .npy, ...).")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--layout", default="BNSD", help=f"layout of the tensors: "
                   f"{', '.join(FILE_LAYOUTS)} (TND/NTD: one sequence)")
    p.add_argument("--num-heads", type=_positive("num-heads"), default=None,
                   help="query heads (needed for BSH)")
    p.add_argument("--num-kv-heads", type=_positive("num-kv-heads"), default=None,
                   help="key/value heads (BSH with GQA)")
    p.add_argument("--scale", type=_positive_float("scale"), default=None,
                   help="softmax scale, > 0 (default 1/sqrt(D))")
    p.add_argument("--dtype", type=_dtype, default=None,
                   help="round inputs to fp16 or bf16 (default: keep fp16/bf16, fp32 -> fp16)")
    _candidate_options(p)

    p = sub.add_parser("capture", help="Q/K/V captured from a local Hugging Face model",
                       description="Runs a local Hugging Face model once on a prompt and "
                       "compares attention on the Q/K/V that reached the chosen layers.")
    p.add_argument("model", help="a save_pretrained() directory (no download)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default="The quick brown fox jumps over the lazy dog. " * 8)
    src.add_argument("--token-ids", type=int, nargs="+", default=None,
                     help="token ids instead of a prompt (models without a tokenizer)")
    p.add_argument("--layers", type=int, nargs="+", default=[0], help="layer indices (default 0)")
    p.add_argument("--max-tokens", type=_positive("max-tokens"), default=2048)
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
                   metavar="NAME")
    p.add_argument("--dtypes", nargs="+", type=_dtype, default=[torch.bfloat16, torch.float16],
                   metavar="DTYPE", help="input dtypes (default bf16 fp16)")
    p.add_argument("--trials", type=int, default=50, help="independent inputs (default 50)")
    p.add_argument("--ties", type=int, default=2, help="equal maxima per score row (default 2)")
    p.add_argument("--gap", type=float, default=12.0,
                   help="scaled score gap between the tied maxima and the rest (default 12)")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--queries", type=int, default=128)
    p.add_argument("--keys", type=int, default=128)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    _output_options(p)
    return parser


def _folder(args) -> str:
    """The output folder, checked but not created: a command creates it only once it has
    results to write (:func:`_output_folder`)."""
    folder = args.out or os.path.join("pasa-compare-out", args.command)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise CompareError(f"--out {folder}: expected a folder, got an existing file")
    parent = os.path.dirname(os.path.abspath(folder))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise CompareError(f"--out {folder}: cannot create it: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CompareError(f"--out {folder}: cannot create it: {parent} is not writable")
    return folder


@contextlib.contextmanager
def _output_folder(folder: str):
    """Create ``folder`` for the writes in the block; if the block fails, the folders
    created here are removed again where they are still empty."""
    created = []
    path = os.path.abspath(folder)
    while not os.path.exists(path):
        created.append(path)
        path = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise CompareError(f"--out {folder}: cannot create it: {err.strerror}") from err
    try:
        yield folder
    except BaseException:
        for path in created:  # innermost first
            try:
                os.rmdir(path)
            except OSError:  # not empty: keep what was written
                break
        raise


def _candidates(args):
    beta = None
    if args.beta0 is not None:
        try:
            beta = pasa_npu.optimal_beta(args.beta0, pasa_npu.DEFAULT_TILING.kv_block,
                                         scale=args.scale_for_beta)
        except ValueError as err:
            raise CompareError(f"--beta0: {err}") from err
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
    with _output_folder(folder):
        if not args.no_plots:
            from . import plots as plot_mod
            plots = (plot_mod.sweep_figures(comp, folder, shape) if sweep
                     else plot_mod.item_figures(comp, folder))
        paths = report.write_csv(comp, folder) + [report.write_json(comp, folder, settings)]
        paths.append(report.write_markdown(comp, folder, title, settings, plots, sweep=sweep))
    print(f"\nwrote {', '.join(os.path.basename(p) for p in paths + plots)} to {folder} "
          f"({time.perf_counter() - start:.0f} s)")
    return 0


def _sweep(args) -> int:
    if args.paper_shape:
        args.batch, args.heads, args.seq, args.dim = 1, 16, 1280, 128
    cases = sweep_cases(args.sweeps)
    shape = (args.batch, args.heads, args.seq, args.dim)
    args.scale_for_beta = args.dim ** -0.5
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
    args.prepared = _candidates(args)
    dt = str(item.dtype).replace("torch.", "")
    mask = item.mask_description()
    title = (f"{item.name}: query {tuple(item.query.shape)} (BNSD), key/value "
             f"{tuple(item.key.shape)}, {dt}, scale {item.scale:.4g}, mask: {mask}")
    return _run_comparison(args, [item], title, {"inputs": ", ".join(args.paths),
                                                 "layout": args.layout, "dtype": dt,
                                                 "mask": mask})


def _capture(args) -> int:
    from .capture import items_from_captures, load_model, record_attention, tokenize
    # candidates first: a bad candidate option should not wait for a model load
    args.scale_for_beta = 1.0
    cand_mod.build(args.allocations, args.backends, args.third_party, args.device)
    model, tokenizer = load_model(args.model, args.model_dtype, args.layers, args.quiet)
    ids = tokenize(tokenizer, args.prompt, args.token_ids, args.model, args.max_tokens)
    vocab = model.get_input_embeddings().num_embeddings
    if int(ids.max()) >= vocab or int(ids.min()) < 0:
        raise CompareError(f"--token-ids must lie in [0, {vocab}), got {int(ids.min())} to "
                           f"{int(ids.max())}")
    captures = record_attention(model, ids, args.layers)
    items = items_from_captures(captures, args.dtype)
    args.scale_for_beta = items[0].scale
    args.prepared = _candidates(args)
    dt = str(items[0].dtype).replace("torch.", "")
    title = (f"{args.model}: layers {args.layers}, {ids.shape[1]} tokens, captured "
             f"{captures[0].query.dtype} -> {dt}")
    return _run_comparison(args, items, title, {"model": args.model, "tokens": ids.shape[1],
                                                "layers": args.layers, "dtype": dt})


def _bias(args) -> int:
    from . import bias
    setup = bias.BiasSetup(args.heads, args.queries, args.keys, args.dim, args.ties, args.gap,
                           args.trials, args.seed)
    setup.check()
    folder = _folder(args)
    start = time.perf_counter()
    rows = bias.run_bias(args.allocations, args.dtypes, setup, ProgressBar(not args.quiet))
    print(bias.console(rows, setup))
    with _output_folder(folder):
        paths = bias.write(rows, setup, folder, plot=not args.no_plots)
    print(f"\nwrote {', '.join(os.path.basename(p) for p in paths)} to {folder} "
          f"({time.perf_counter() - start:.0f} s)")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        argv = ["sweep"] + argv
    try:
        args = build_parser().parse_args(argv)
        args.argv = argv
        command = {"sweep": _sweep, "file": _file, "capture": _capture, "bias": _bias}
        return command[args.command](args)
    except CompareError as err:
        print(f"pasa-compare: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pasa-compare: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (| head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
