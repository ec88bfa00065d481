"""Attention inputs to compare on: the paper's generated cases and Q/K/V files.

Everything becomes an :class:`Item`: one attention problem in BNSD order
(query (B, Nq, S1, D), key/value (B, Nkv, S2, D)), fp16 or bf16, on CPU, with
its softmax scale, an optional boolean mask (True = masked, torch_npu's
convention) and optional attention sinks (one logit per query head). Every candidate and
the fp64 golden run on the same item.
Hugging Face capture lives in :mod:`.capture`.
"""
from __future__ import annotations

import math
import os
import pickle
import re
import zipfile
from dataclasses import dataclass, field
from typing import Optional

import torch

from pasa_npu.arguments import describe
from pasa_npu.integrations._attention import kept_by_sink
from pasa_npu.tools.inputs import PAPER_SHAPE, Case, paper_cases

from .errors import CompareError

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: The layouts a file may hold (torch_npu's input layouts).
FILE_LAYOUTS = ("BNSD", "BSND", "BSH", "TND", "NTD")
#: Names accepted for each tensor in a container file.
TENSOR_NAMES = {"query": ("q", "query"), "key": ("k", "key"), "value": ("v", "value"),
                "mask": ("atten_mask", "mask"), "sink": ("learnable_sink", "sink", "s_aux")}
RESONANCE_CASES = (Case("resonance", 0, 3e4, "resonance"), Case("resonance", 0, 1e5, "resonance"))
#: Scores whose spread exceeds fp16 on a quarter of the query rows: PASA's overflow check
#: recomputes those rows by fa-fp32 (pasa_npu.overflow_report()).
SPREAD_CASES = (Case("spread", 0, 1e5, "spread"),)
#: N(0, 1) inputs at scale 128 (op-plugin's FIA test case): scores in the thousands, inside
#: fp16's range, whose sharp softmax fp16 scores cannot resolve; fa-fp32 meets FIA's
#: high-precision criterion, no fp16-score allocation does (docs/design.md, "High precision").
AMPLITUDE_CASES = (Case("amplitude", 0, 128.0, "amplitude"),)


@dataclass
class Item:
    """One attention problem, BNSD, with the torch_npu arguments that describe it."""

    name: str
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    scale: float
    mask: Optional[torch.Tensor] = None   # bool (B|1, S1, S2), True = masked
    meta: dict = field(default_factory=dict)
    sink: Optional[torch.Tensor] = None   # float32 (Nq,): gpt-oss's attention sinks

    def __post_init__(self):
        for role in ("query", "key", "value", "mask", "sink"):
            value = getattr(self, role)
            if not (isinstance(value, torch.Tensor) or (role in ("mask", "sink")
                                                          and value is None)):
                raise CompareError(f"item {self.name!r}: {role} must be a torch.Tensor, got "
                                   f"{describe(value)}")
        if self.sink is not None:
            heads = self.query.shape[1]
            if tuple(self.sink.shape) != (heads,) or not self.sink.dtype.is_floating_point:
                raise CompareError(f"item {self.name!r}: the sinks must be floating point of "
                                   f"shape ({heads},), one per query head; got "
                                   f"{self.sink.dtype} of shape {tuple(self.sink.shape)}")
            self.sink = self.sink.float()

    @property
    def dtype(self) -> torch.dtype:
        return self.query.dtype

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return tuple(self.query.shape)

    def mask_description(self) -> str:
        """The mask as the reports state it: its shape and the share of masked (query,
        key) pairs, or "none"."""
        if self.mask is None:
            return "none"
        share = float(self.mask.float().mean()) * 100
        return (f"atten_mask {tuple(self.mask.shape)} (True = masked), {share:.3g}% of the "
                f"(query, key) pairs masked")

    def sink_description(self) -> str:
        """The sinks as the reports state them, or "none"."""
        if self.sink is None:
            return "none"
        return (f"{self.sink.numel()} logits in [{float(self.sink.min()):.3g}, "
                f"{float(self.sink.max()):.3g}]")

    def with_sink(self, out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        """``out`` (B, Nq, S1, D) of attention without the sinks, with its LSE (B, Nq, S1,
        1), as attention with them, in the LSE's dtype: out times the mass its keys keep
        (``kept_by_sink``, as pasa_npu.integrations applies gpt-oss's sinks). A row with no
        key stays 0."""
        return out.to(lse.dtype) * kept_by_sink(lse, self.sink)

    def npu_kwargs(self) -> dict:
        """Keyword arguments of ``npu_fused_infer_attention_score`` (and of
        ``pasa_npu.fused_attention``) for this item's BNSD tensors."""
        kw = dict(num_heads=self.query.shape[1], num_key_value_heads=self.key.shape[1],
                  input_layout="BNSD", scale=self.scale)
        if self.mask is not None:
            kw["atten_mask"] = self.mask
        return kw


# --------------------------------------------------------------------------- generated


#: Sweep groups: the paper's four sweeps, the resonance cases, the score spread beyond fp16,
#: the large amplitude, and the cases of Table 4.
SWEEP_GROUPS = ("uniform-mean", "uniform-amplitude", "hybrid-mean", "hybrid-amplitude",
                "resonance", "spread", "amplitude", "table4")
#: the groups ``pasa-compare sweep`` runs by default: all but table4
DEFAULT_SWEEPS = SWEEP_GROUPS[:-1]
#: The paper's Table 4: (kind, x0, Am) -> NaN % of its FA16-FP32 (our fa-fp16s) at
#: (1, 16, 1280, 128); the cases where it overflows.
PAPER_TABLE4 = {("uniform", 30, 0.5): 100.0, ("uniform", 20, 15): 0.12, ("uniform", 20, 20): 8.14,
                ("hybrid", 30, 10): 100.0, ("hybrid", 20, 50): 0.04, ("hybrid", 20, 100): 1.11}
TABLE4_CASES = tuple(PAPER_TABLE4)


def sweep_cases(groups=DEFAULT_SWEEPS) -> list[Case]:
    """The cases of the chosen sweep groups, each (kind, x0, Am) once, in the paper's order."""
    for g in groups:
        if g not in SWEEP_GROUPS:
            raise CompareError(f"unknown sweep {g!r}; expected one of {', '.join(SWEEP_GROUPS)}")
    every = paper_cases() + list(RESONANCE_CASES) + list(SPREAD_CASES) + list(AMPLITUDE_CASES)
    chosen = [c for c in every if c.sweep in groups
              or ("table4" in groups and (c.kind, c.x0, c.amplitude) in TABLE4_CASES)]
    return list({c.label: c for c in reversed(chosen)}.values())[::-1]


def case_item(case: Case, shape=PAPER_SHAPE, seed: int = 0, dtype=torch.float16) -> Item:
    q, k, v = case.make(shape, seed=seed, dtype=dtype)
    meta = {"kind": case.kind, "x0": case.x0, "amplitude": case.amplitude, "sweep": case.sweep,
            "seed": seed}
    return Item(case.label, q, k, v, scale=case.scale(shape[3]), meta=meta)


# --------------------------------------------------------------------------- files


def _read(path: str) -> dict[str, torch.Tensor] | torch.Tensor:
    """A file's tensors: a dict for containers, a tensor for a single array."""
    if not isinstance(path, (str, os.PathLike)):
        raise CompareError(f"an input path must be a str or os.PathLike, got {describe(path)}")
    if not os.path.exists(path):
        raise CompareError(f"input file not found: {path}")
    ext = os.path.splitext(path)[1].lower()
    try:
        if ext == ".pt":
            obj = _read_pt(path)
            if isinstance(obj, (list, tuple)):
                if len(obj) != 3:
                    raise CompareError(f"{path}: a list/tuple must hold (q, k, v), got "
                                       f"{len(obj)} elements")
                obj = dict(zip(("q", "k", "v"), obj))
            if not isinstance(obj, (dict, torch.Tensor)):
                raise CompareError(f"{path}: expected a tensor, a dict of tensors or (q, k, v), "
                                   f"got {type(obj).__name__}")
            return obj
        if ext in (".npy", ".npz"):
            return _read_numpy(path, ext)
        if ext == ".safetensors":
            try:
                from safetensors.torch import load_file
            except ImportError as err:
                raise CompareError(f"{path}: reading .safetensors needs the safetensors package "
                                   f"(pip install 'pasa-npu[compare]')") from err
            return load_file(path)
    except CompareError:
        raise
    except Exception as err:  # a corrupt or foreign file: say which and why, in one line
        raise CompareError(f"{path}: cannot read it as {ext}: {err}".splitlines()[0]) from err
    raise CompareError(f"{path}: unsupported file type {ext or '(none)'}; expected .pt, .npy, "
                       f".npz or .safetensors")


def _read_pt(path: str):
    """``torch.load`` of tensors and containers of them only (weights_only: pickled objects
    are never loaded)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        what = f"it holds a {found.group(1)}" if found else "not a torch.save file"
        raise CompareError(f"{path}: cannot read it as .pt: {what}; expected tensors, or dicts, "
                           f"lists or tuples of them") from err


def _read_numpy(path: str, ext: str):
    """A .npy array as a tensor or a .npz archive as a dict of tensors; numeric arrays only
    (pickled objects are never loaded)."""
    import numpy as np
    if ext == ".npz" and not zipfile.is_zipfile(path):
        raise CompareError(f"{path}: not a valid .npz archive (numpy.savez writes a zip file of "
                           f".npy arrays)")
    if ext == ".npy":
        with open(path, "rb") as f:
            if f.read(6) != b"\x93NUMPY":
                raise CompareError(f"{path}: not a valid .npy file (numpy.save writes one)")
    try:
        if ext == ".npy":
            return torch.from_numpy(np.load(path, allow_pickle=False))
        with np.load(path, allow_pickle=False) as z:
            return {name: torch.from_numpy(z[name]) for name in z.files}
    except ValueError as err:
        if "pickle" not in str(err):
            raise
        kind = "a valid .npz archive of numeric arrays" if ext == ".npz" else "a numeric array"
        raise CompareError(f"{path}: not {kind}: it holds Python objects") from err


def _pick(tensors: dict, role: str, path: str, required: bool = True):
    for name in TENSOR_NAMES[role]:
        if name in tensors:
            t = tensors[name]
            if not isinstance(t, torch.Tensor):
                raise CompareError(f"{path}: entry {name!r} is not a tensor, it holds "
                                   f"{describe(t)}")
            return t
    if required:
        raise CompareError(f"{path}: no tensor named {' or '.join(TENSOR_NAMES[role])} "
                           f"(found: {', '.join(sorted(map(str, tensors))) or 'nothing'})")
    return None


def _to_bnsd(t: torch.Tensor, role: str, layout: str, heads: Optional[int]) -> torch.Tensor:
    dims = 3 if layout in ("BSH", "TND", "NTD") else 4
    if t.dim() != dims:
        raise CompareError(f"{role} must be {dims}-D for layout {layout}, got shape "
                           f"{tuple(t.shape)}")
    if layout == "BSH":
        if heads is None:
            raise CompareError("layout BSH needs --num-heads (and --num-kv-heads for GQA)")
        if t.shape[2] % heads:
            raise CompareError(f"{role}'s hidden size {t.shape[2]} is not divisible by its head "
                               f"count {heads} (layout BSH)")
        return t.unflatten(2, (heads, t.shape[2] // heads)).permute(0, 2, 1, 3)
    if layout == "BSND":
        return t.permute(0, 2, 1, 3)
    if layout == "TND":
        return t.permute(1, 0, 2).unsqueeze(0)
    if layout == "NTD":
        return t.unsqueeze(0)
    return t


def _check_qkv(q, k, v) -> None:
    if k.shape[0] != q.shape[0]:
        raise CompareError(f"key batch {k.shape[0]} differs from query batch {q.shape[0]}")
    if k.shape[3] != q.shape[3]:
        raise CompareError(f"key head dim {k.shape[3]} differs from query head dim {q.shape[3]}")
    if v.shape[:3] != k.shape[:3]:
        raise CompareError(f"value (batch, heads, seq) {tuple(v.shape[:3])} differs from key's "
                           f"{tuple(k.shape[:3])} (BNSD order)")
    if q.shape[1] % k.shape[1]:
        raise CompareError(f"query heads {q.shape[1]} are not a multiple of key/value heads "
                           f"{k.shape[1]}")
    for t in (q, k, v):
        if 0 in t.shape:
            raise CompareError(f"empty tensor of shape {tuple(t.shape)}")


def _check_mask(mask: torch.Tensor, q, k) -> torch.Tensor:
    b, _, s1, _ = q.shape
    s2 = k.shape[2]
    m = mask
    if m.dim() == 4 and m.shape[1] == 1:
        m = m[:, 0]
    if m.dim() == 2:
        m = m.unsqueeze(0)
    if m.dim() != 3 or m.shape[0] not in (1, b) or tuple(m.shape[1:]) != (s1, s2):
        raise CompareError(f"mask of shape {tuple(mask.shape)} does not fit batch {b}, S1 {s1}, "
                           f"S2 {s2}: expected (S1, S2), (B|1, S1, S2) or (B|1, 1, S1, S2)")
    if m.dtype.is_floating_point:
        raise CompareError(f"mask must be bool or integer (1 = masked), got {m.dtype}")
    return m.bool()


def file_item(paths: list[str], layout: str = "BNSD", num_heads: Optional[int] = None,
              num_kv_heads: Optional[int] = None, scale: Optional[float] = None,
              dtype: Optional[torch.dtype] = None) -> Item:
    """An item from one container file (tensors named q/k/v or query/key/value, an
    optional bool ``atten_mask``, optional sinks ``learnable_sink`` of shape (Nq,)) or from
    three files holding q, k and v; ``paths`` is
    a list of one or three paths (a single path may be given as is).

    ``layout`` is the files' layout (one of :data:`FILE_LAYOUTS`; TND/NTD hold
    one sequence). fp32/fp64 tensors are rounded to ``dtype`` (default fp16);
    fp16/bf16 tensors keep their dtype unless ``dtype`` is given.
    """
    if layout not in FILE_LAYOUTS:
        raise CompareError(f"--layout must be one of {', '.join(FILE_LAYOUTS)}, got {layout!r}")
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not isinstance(paths, (list, tuple)):
        raise CompareError(f"paths must be a list of file paths, got {describe(paths)}")
    mask = sink = None
    if len(paths) == 1:
        tensors = _read(paths[0])
        if isinstance(tensors, torch.Tensor):
            raise CompareError(f"{paths[0]}: holds a single tensor; give q, k and v as three "
                               f"files, or one file with tensors named q, k, v")
        q, k, v = (_pick(tensors, role, paths[0]) for role in ("query", "key", "value"))
        mask = _pick(tensors, "mask", paths[0], required=False)
        sink = _pick(tensors, "sink", paths[0], required=False)
    elif len(paths) == 3:
        loaded = [_read(p) for p in paths]
        for p, t in zip(paths, loaded):
            if isinstance(t, dict) and len(t) != 1:
                raise CompareError(f"{p}: with three input files each must hold one tensor, "
                                   f"found {len(t)} ({', '.join(sorted(t))})")
        q, k, v = (next(iter(t.values())) if isinstance(t, dict) else t for t in loaded)
    else:
        raise CompareError(f"give one container file or three files (q, k, v), got {len(paths)} "
                           f"paths")
    for role, t in (("query", q), ("key", k), ("value", v)):
        if not t.dtype.is_floating_point:
            raise CompareError(f"{role} must be a floating-point tensor, got {t.dtype}")
    kv_heads = num_kv_heads or num_heads
    q = _to_bnsd(q, "query", layout, num_heads)
    k = _to_bnsd(k, "key", layout, kv_heads)
    v = _to_bnsd(v, "value", layout, kv_heads)
    if num_heads is not None and q.shape[1] != num_heads:
        raise CompareError(f"--num-heads is {num_heads} but query has {q.shape[1]} heads "
                           f"(layout {layout})")
    if num_kv_heads is not None and k.shape[1] != num_kv_heads:
        raise CompareError(f"--num-kv-heads is {num_kv_heads} but key has {k.shape[1]} heads "
                           f"(layout {layout})")
    _check_qkv(q, k, v)
    if dtype is None:
        low = {q.dtype, k.dtype, v.dtype} & {torch.float16, torch.bfloat16}
        dtype = q.dtype if q.dtype in low else torch.float16
    q, k, v = (t.to(dtype).contiguous() for t in (q, k, v))
    if mask is not None:
        mask = _check_mask(mask, q, k)
    scale = q.shape[3] ** -0.5 if scale is None else float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise CompareError(f"--scale must be finite and > 0, got {scale}")
    name = os.path.basename(paths[0]) if len(paths) == 1 else "+".join(
        os.path.basename(p) for p in paths)
    return Item(name, q, k, v, scale, mask,
                meta={"source": [os.fspath(p) for p in paths], "layout": layout}, sink=sink)
