"""``fused_attention``: a drop-in for ``torch_npu.npu_fused_infer_attention_score``.

This module validates and normalises torch_npu's arguments into an
:class:`~pasa_npu.problem.AttentionProblem`, dispatches it to a backend and
shapes the results as torch_npu returns them. It is the only place that knows
about layouts, mask shapes and sparse modes.
"""
from __future__ import annotations

import copy
import functools
import inspect
import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from . import backends
from .beta import default_beta
from .numerics import (ALGORITHM_NAMES, ALLOCATIONS, DEFAULT_ALGORITHM_BY_PRECISE_BIT,
                       DEFAULT_TILING, FP16_MAX, Allocation, Tiling, compute_dtype)
from .problem import AttentionProblem

INT_MAX = 2147483647
OPTIMIZED_MASK_SIZE = 2048

#: input_layout -> (query/key/value layout, output layout)
LAYOUTS = {
    "BSH": ("BSH", "BSH"), "BSND": ("BSND", "BSND"), "BNSD": ("BNSD", "BNSD"),
    "TND": ("TND", "TND"), "BNSD_BSND": ("BNSD", "BSND"), "BSH_NBSD": ("BSH", "NBSD"),
    "BSND_NBSD": ("BSND", "NBSD"), "BNSD_NBSD": ("BNSD", "NBSD"), "TND_NTD": ("TND", "NTD"),
    "NTD_TND": ("NTD", "TND"),
}
_PACKED = ("TND", "NTD")

#: torch_npu keywords not implemented here, with the default that means "unused".
UNIMPLEMENTED_KEYWORDS = {
    "pse_shift": None, "dequant_scale1": None, "quant_scale1": None, "dequant_scale2": None,
    "quant_scale2": None, "quant_offset2": None, "antiquant_scale": None,
    "antiquant_offset": None, "block_table": None, "query_padding_size": None,
    "kv_padding_size": None, "key_antiquant_scale": None, "key_antiquant_offset": None,
    "value_antiquant_scale": None, "value_antiquant_offset": None, "key_shared_prefix": None,
    "value_shared_prefix": None, "actual_shared_prefix_len": None, "query_rope": None,
    "key_rope": None, "key_rope_antiquant_scale": None, "block_size": 0, "antiquant_mode": 0,
    "key_antiquant_mode": 0, "value_antiquant_mode": 0,
}

#: Keywords of this package that torch_npu does not have.
OWN_KEYWORDS = ("algorithm", "beta", "backend", "rounding_guard", "q_block", "kv_block")


def fused_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
    pse_shift=None, atten_mask: Optional[torch.Tensor] = None,
    actual_seq_lengths: Optional[Sequence[int]] = None,
    actual_seq_lengths_kv: Optional[Sequence[int]] = None,
    dequant_scale1=None, quant_scale1=None, dequant_scale2=None, quant_scale2=None,
    quant_offset2=None, antiquant_scale=None, antiquant_offset=None, block_table=None,
    query_padding_size=None, kv_padding_size=None, key_antiquant_scale=None,
    key_antiquant_offset=None, value_antiquant_scale=None, value_antiquant_offset=None,
    key_shared_prefix=None, value_shared_prefix=None, actual_shared_prefix_len=None,
    query_rope=None, key_rope=None, key_rope_antiquant_scale=None,
    num_heads: int = 1, scale: float = 1.0, pre_tokens: int = INT_MAX,
    next_tokens: int = INT_MAX, input_layout: str = "BSH", num_key_value_heads: int = 0,
    sparse_mode: int = 0, inner_precise: int = 0, block_size: int = 0, antiquant_mode: int = 0,
    softmax_lse_flag: bool = False, key_antiquant_mode: int = 0, value_antiquant_mode: int = 0,
    algorithm: Optional[str] = None, beta: Optional[float] = None, backend: str = "auto",
    rounding_guard: bool = False, q_block: Optional[int] = None, kv_block: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward with torch_npu's interface, computed by PASA or a reference allocation.

    Arguments up to ``value_antiquant_mode`` are torch_npu's, with its names,
    defaults, layouts (BSH, BSND, BNSD, TND and the ``X_Y`` output variants),
    mask conventions (True/1 = masked) and ``sparse_mode`` 0-4 semantics. Returns
    ``(attention_out, softmax_lse)``: the output in the output layout and the
    input dtype; the LSE in float32, (B, N, S1, 1) or (T, N, 1) for packed
    layouts, when ``softmax_lse_flag``, else a one-element zero tensor.

    Our keywords:

    * ``algorithm``: a precision allocation of DESIGN.md §2.3 (``pasa``,
      ``pasa-mixed``, ``pasa-exact``, ``fa-fp32``, ``fa-fp16s``, ``fa-fp16``).
      None picks by ``inner_precise`` bit 0: ``pasa-exact`` (0, high precision)
      or ``pasa`` (1, high performance); an explicit algorithm takes precedence
      over bit 0.
    * ``beta``: PASA's shift fraction (``pasa``, ``pasa-mixed``); None solves the
      optimal accuracy condition for the stored shifting matrix.
    * ``backend``: ``auto``, ``torch``; ``triton``, ``ascendc-emu``, ``npu``
      where built.
    * ``rounding_guard``: the dynamic maximum of DESIGN.md §2.5 for rows with a
      repeated maximum.
    * ``q_block``, ``kv_block``: the tiling (default 128 x 128).

    ``inner_precise`` bit 1 set: a row with nothing to attend returns 0. Clear:
    it returns the mean of V over the batch's valid keys, as a kernel with a
    finite mask fill does. Its LSE is -inf either way; rows past
    ``actual_seq_lengths`` are 0 in both outputs. bf16 inputs run PASA in fp16
    (the paper's rule) after a range check.

    Under torch.compile the call is one opaque operator,
    ``torch.ops.pasa_npu.fused_attention``, that runs this eager call: the compiler
    neither traces into the backends nor fuses away the allocation's roundings.
    """
    if torch.compiler.is_compiling():
        # every argument by name: torch 2.11's dynamo cannot trace locals()
        return _traced_call(dict(
            query=query, key=key, value=value, pse_shift=pse_shift, atten_mask=atten_mask,
            actual_seq_lengths=actual_seq_lengths, actual_seq_lengths_kv=actual_seq_lengths_kv,
            dequant_scale1=dequant_scale1, quant_scale1=quant_scale1,
            dequant_scale2=dequant_scale2, quant_scale2=quant_scale2,
            quant_offset2=quant_offset2, antiquant_scale=antiquant_scale,
            antiquant_offset=antiquant_offset, block_table=block_table,
            query_padding_size=query_padding_size, kv_padding_size=kv_padding_size,
            key_antiquant_scale=key_antiquant_scale, key_antiquant_offset=key_antiquant_offset,
            value_antiquant_scale=value_antiquant_scale,
            value_antiquant_offset=value_antiquant_offset, key_shared_prefix=key_shared_prefix,
            value_shared_prefix=value_shared_prefix,
            actual_shared_prefix_len=actual_shared_prefix_len, query_rope=query_rope,
            key_rope=key_rope, key_rope_antiquant_scale=key_rope_antiquant_scale,
            num_heads=num_heads, scale=scale, pre_tokens=pre_tokens, next_tokens=next_tokens,
            input_layout=input_layout, num_key_value_heads=num_key_value_heads,
            sparse_mode=sparse_mode, inner_precise=inner_precise, block_size=block_size,
            antiquant_mode=antiquant_mode, softmax_lse_flag=softmax_lse_flag,
            key_antiquant_mode=key_antiquant_mode, value_antiquant_mode=value_antiquant_mode,
            algorithm=algorithm, beta=beta, backend=backend, rounding_guard=rounding_guard,
            q_block=q_block, kv_block=kv_block))
    return _attention(dict(locals()), golden=False)


_SIGNATURE = inspect.signature(fused_attention)


def reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 golden attention with the same (torch_npu) arguments as :func:`fused_attention`.

    Dense softmax in fp64, no blocking and no low-precision step; outputs are
    float64 in the requested layout (the LSE too, when ``softmax_lse_flag``).
    """
    own = sorted(set(kwargs) & set(OWN_KEYWORDS))
    if own:
        raise TypeError(f"reference_attention takes torch_npu's arguments only; got {own}")
    bound = _SIGNATURE.bind(query, key, value, **kwargs)
    bound.apply_defaults()
    return _attention(dict(bound.arguments), golden=True)


def compressed_causal_mask(device: torch.device | str | None = None) -> torch.Tensor:
    """The 2048 x 2048 "optimized" mask torch_npu expects with ``sparse_mode`` 2, 3 and 4."""
    ones = torch.ones(OPTIMIZED_MASK_SIZE, OPTIMIZED_MASK_SIZE, dtype=torch.bool, device=device)
    return torch.triu(ones, diagonal=1)


# --------------------------------------------------------------------------- driver


@dataclass(frozen=True)
class _Plan:
    """Everything a call derives from its arguments but not from tensor contents:
    validated once per distinct argument set (see :func:`_plan_key`)."""

    in_layout: str
    out_layout: str
    num_heads: int
    num_kv_heads: int
    packed: bool
    q_lens: torch.Tensor
    q_starts: torch.Tensor
    kv_lens: torch.Tensor
    kv_starts: torch.Tensor
    mask: Optional[torch.Tensor]
    band: Optional[tuple[torch.Tensor, torch.Tensor]]
    scale: float
    inner_precise: int
    want_lse: bool
    allocation: Allocation
    beta: float
    tiling: Tiling
    guard: bool
    runner: Callable[[AttentionProblem], None]
    out_dtype: torch.dtype
    lse_dtype: torch.dtype
    low: torch.dtype
    covered: bool         # every output row is written by the backend: no zero fill
    lse_rows_past: bool   # some LSE row lies past its query length
    may_have_empty: bool  # some row inside its query length may see no key
    validated_mask: Optional[torch.Tensor] = None  # sparse modes 2-4: kept alive for the key


#: argument key -> {lengths key -> plan} (see :func:`_plan_key`)
_PLANS: dict = {}
_PLAN_CACHE_SIZE = 256      # argument sets
_LENGTHS_PER_PLAN = 64      # actual-length sets per argument set


def _attention(args: dict, golden: bool) -> tuple[torch.Tensor, torch.Tensor]:
    keys = None if golden else _plan_key(args)
    plans = _PLANS.get(keys[0]) if keys is not None else None
    plan = plans.get(keys[1]) if plans else None
    if plan is None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if plans:  # the same arguments with other lengths: only the lengths are new
                plan = _with_lengths(next(iter(plans.values())), args)
            else:
                plan = _make_plan(args, golden)
        for w in caught:  # re-issued as the caller's; a call that warns is never cached
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if keys is not None and not caught:
            if plans is None:
                if len(_PLANS) >= _PLAN_CACHE_SIZE:
                    _PLANS.clear()
                plans = _PLANS[keys[0]] = {}
            elif len(plans) >= _LENGTHS_PER_PLAN:
                plans.clear()
            plans[keys[1]] = plan
    return _execute(plan, args["query"], args["key"], args["value"], golden)


def _plan_key(args: dict):
    """(arguments key, lengths key): a hashable fingerprint of everything
    :func:`_make_plan` reads, or None where a call is not cacheable (explicit masks,
    whose contents the plan holds; device length tensors). The values of the actual
    sequence lengths go in the second key, so that the calls of a decode loop, whose
    lengths grow every step, share the validation of everything else. Types are part
    of the keys, so that ``True`` never hits ``1``."""
    key = []
    lengths = []
    append = key.append
    for name, value in args.items():
        kind = type(value)
        if value is None or kind in _SCALAR_TYPES:
            append((kind, value))
        elif isinstance(value, torch.Tensor):
            if name in ("query", "key", "value"):
                append((value.shape, value.stride(), value.dtype, value.device))
            elif name == "atten_mask" and args["sparse_mode"] in (2, 3, 4):
                # only validated there: this very tensor, unchanged since (the plan keeps
                # it alive, so its id is not reused while cached)
                append(_tensor_identity(value))
            elif name.startswith("actual_seq_lengths") and value.device.type == "cpu":
                append((value.dtype, value.shape))
                lengths.append(tuple(value.tolist()))
            else:
                return None
        elif kind in (list, tuple):
            entries = tuple((type(x), x) for x in value)
            if name.startswith("actual_seq_lengths"):
                append((kind, len(value)))
                lengths.append(entries)
            else:
                append((kind, entries))
        else:
            append((kind, value))
    keys = (tuple(key), tuple(lengths))
    try:
        hash(keys)
    except TypeError:
        return None
    return keys


_SCALAR_TYPES = frozenset((int, float, str, bool))


def _check_implemented(args: dict) -> None:
    for name, unused in UNIMPLEMENTED_KEYWORDS.items():
        if not _is_default(args[name], unused):
            raise NotImplementedError(
                f"{name}={_describe(args[name])} is not implemented by pasa_npu yet "
                f"(only the default {unused!r} is accepted)")


def _make_plan(args: dict, golden: bool) -> _Plan:
    _check_implemented(args)
    query, key, value = args["query"], args["key"], args["value"]
    _check_tensors(query, key, value)
    in_layout, out_layout = _layout(args["input_layout"])
    num_heads = _int_arg(args["num_heads"], "num_heads", minimum=1)
    num_kv_heads = _int_arg(args["num_key_value_heads"], "num_key_value_heads", minimum=0)
    num_kv_heads = num_kv_heads or num_heads
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_key_value_heads "
                         f"({num_kv_heads})")
    q, k, v = _canonical_views(query, key, value, in_layout, num_heads, num_kv_heads)
    _check_shapes(q, k, v, in_layout)
    packed = in_layout in _PACKED
    q_lens, q_starts, kv_lens, kv_starts = _lengths(args, q, k, packed)

    scale = _scale(args["scale"])
    inner_precise = _int_arg(args["inner_precise"], "inner_precise", minimum=0)
    if inner_precise > 3:
        raise ValueError(f"inner_precise must be 0, 1, 2 or 3, got {inner_precise}")
    if not isinstance(args["softmax_lse_flag"], bool):
        raise TypeError(f"softmax_lse_flag must be a bool, got {_describe(args['softmax_lse_flag'])}")
    mask, band = _mask_and_band(args, q_lens.numel(), q.shape[2], k.shape[2], packed, q_lens,
                                kv_lens, query.device)

    if golden:
        allocation, beta, tiling, guard = ALLOCATIONS["fa-fp32"], 0.0, DEFAULT_TILING, False
        runner = backends.run_golden
        out_dtype, lse_dtype, low = torch.float64, torch.float64, torch.float64
    else:
        allocation = _allocation(args["algorithm"], inner_precise)
        tiling = _tiling(args["q_block"], args["kv_block"])
        beta = _beta(args["beta"], allocation, tiling, scale)
        guard = args["rounding_guard"]
        if not isinstance(guard, bool):
            raise TypeError(f"rounding_guard must be a bool, got {_describe(guard)}")
        if not isinstance(args["backend"], str):
            raise TypeError(f"backend must be a str, got {_describe(args['backend'])}")
        runner = backends.resolve(args["backend"], query.device).runner()
        out_dtype, lse_dtype = query.dtype, torch.float32
        low = compute_dtype(allocation, query.dtype)
    return _Plan(
        in_layout=in_layout, out_layout=out_layout, num_heads=num_heads,
        num_kv_heads=num_kv_heads, packed=packed, q_lens=q_lens, q_starts=q_starts,
        kv_lens=kv_lens, kv_starts=kv_starts, mask=mask, band=band, scale=scale,
        inner_precise=inner_precise, want_lse=args["softmax_lse_flag"], allocation=allocation,
        beta=beta, tiling=tiling, guard=guard, runner=runner, out_dtype=out_dtype,
        lse_dtype=lse_dtype, low=low,
        validated_mask=args["atten_mask"] if args["sparse_mode"] in (2, 3, 4) else None,
        **_row_flags(q_lens, kv_lens, mask, band, packed, q.shape[2]))


def _with_lengths(plan: _Plan, args: dict) -> _Plan:
    """``plan`` (made for the same arguments but other actual sequence lengths) for the
    lengths in ``args``: the lengths, the band they set and the row flags are redone."""
    q, k, _ = _canonical_views(args["query"], args["key"], args["value"], plan.in_layout,
                               plan.num_heads, plan.num_kv_heads)
    q_lens, q_starts, kv_lens, kv_starts = _lengths(args, q, k, plan.packed)
    mask, band = _mask_and_band(args, q_lens.numel(), q.shape[2], k.shape[2], plan.packed,
                                q_lens, kv_lens, args["query"].device)
    plan = copy.copy(plan)  # dataclasses.replace would cost a third of this function
    plan.__dict__.update(q_lens=q_lens, q_starts=q_starts, kv_lens=kv_lens, kv_starts=kv_starts,
                         mask=mask, band=band, **_row_flags(q_lens, kv_lens, mask, band,
                                                            plan.packed, q.shape[2]))
    return plan


def _row_flags(q_lens, kv_lens, mask, band, packed: bool, s_q: int) -> dict:
    """The plan's facts about rows, from the lengths (as Python ints: a decode step's
    worth of tensor operations would cost more than the rest of the lengths)."""
    lens = q_lens.tolist()
    return dict(covered=not packed and all(n == s_q for n in lens),
                lse_rows_past=not packed and any(n < s_q for n in lens),
                may_have_empty=mask is not None or _may_have_empty_rows(lens, kv_lens.tolist(),
                                                                        band))


def _execute(plan: _Plan, query, key, value, golden: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-call part: canonical views, outputs, the backend, torch_npu's row rules."""
    q, k, v = _canonical_views(query, key, value, plan.in_layout, plan.num_heads,
                               plan.num_kv_heads)
    v_input = v
    if plan.low != query.dtype and not golden:
        q, k, v = _to_fp16_checked((q, k, v), ("query", "key", "value"))

    # every row a backend does not write (past a query length, between packed sequences)
    # must read 0; when every row is written, skip the fill
    out, out_view = _allocate_output(q, v, plan.out_layout, plan.out_dtype, zero=not plan.covered)
    lse, lse_view = (_allocate_lse(q, plan.packed, plan.lse_dtype) if plan.want_lse
                     else (None, None))
    if q.numel() == 0 or out.numel() == 0:
        return out, lse if plan.want_lse else _lse_placeholder(query.device)

    problem = AttentionProblem(
        query=q, key=k, value=v, out=out_view, lse=lse_view, q_lens=plan.q_lens,
        kv_lens=plan.kv_lens, q_starts=plan.q_starts, kv_starts=plan.kv_starts,
        packed=plan.packed, mask=plan.mask, band=plan.band, scale=plan.scale,
        allocation=plan.allocation, beta=plan.beta, compute_dtype=plan.low,
        rounding_guard=plan.guard, tiling=plan.tiling)
    plan.runner(problem)
    _fix_rows(problem, v_input, plan)
    return out, (lse if plan.want_lse else _lse_placeholder(query.device))


# --------------------------------------------------------------------------- checks


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return repr(value)


def _is_default(value, default) -> bool:
    if default is None:
        return value is None
    return not isinstance(value, torch.Tensor) and value == default


def _int_arg(value, name: str, minimum: int) -> int:
    if type(value) is int and value >= minimum:  # the common case, without ABC checks
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {_describe(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_tensors(query, key, value) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {_describe(t)}")
        if t.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"{name} must be float16 or bfloat16, got {t.dtype}")
    for name, t in (("key", key), ("value", value)):
        if t.dtype != query.dtype:
            raise TypeError(f"{name} dtype {t.dtype} differs from query dtype {query.dtype}")
        if t.device != query.device:
            raise ValueError(f"{name} is on {t.device} but query is on {query.device}")


def _layout(input_layout) -> tuple[str, str]:
    if not isinstance(input_layout, str):
        raise TypeError(f"input_layout must be a str, got {_describe(input_layout)}")
    if input_layout not in LAYOUTS:
        raise ValueError(f"input_layout must be one of {sorted(LAYOUTS)}, got {input_layout!r}")
    return LAYOUTS[input_layout]


def _to_canonical(t: torch.Tensor, name: str, layout: str, heads: int) -> torch.Tensor:
    """A (B, N, S, D) view of ``t`` given in ``layout`` (packed: B = 1, S = T)."""
    dims = 3 if layout in ("BSH", "TND", "NTD") else 4
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D for input_layout {layout}, got shape "
                         f"{tuple(t.shape)}")
    if layout == "BSH":
        if t.shape[2] % heads:
            raise ValueError(f"{name}'s hidden size {t.shape[2]} is not divisible by its head "
                             f"count {heads} (input_layout BSH)")
        return t.unflatten(2, (heads, t.shape[2] // heads)).permute(0, 2, 1, 3)
    head_axis = {"BSND": 2, "BNSD": 1, "TND": 1, "NTD": 0}[layout]
    if t.shape[head_axis] != heads:
        what = "num_heads" if name == "query" else "num_key_value_heads (or num_heads)"
        raise ValueError(f"{name} has {t.shape[head_axis]} heads on its N axis (input_layout "
                         f"{layout}) but {what} is {heads}")
    if layout == "BSND":
        return t.permute(0, 2, 1, 3)
    if layout == "BNSD":
        return t
    if layout == "TND":
        return t.permute(1, 0, 2).unsqueeze(0)
    return t.unsqueeze(0)


def _canonical_views(query, key, value, layout: str, num_heads: int, num_kv_heads: int):
    """(q, k, v) as (B, N, S, D) views, each checked against its head count."""
    return (_to_canonical(query, "query", layout, num_heads),
            _to_canonical(key, "key", layout, num_kv_heads),
            _to_canonical(value, "value", layout, num_kv_heads))


def _check_shapes(q, k, v, layout) -> None:
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"key batch {k.shape[0]} differs from query batch {q.shape[0]} "
                         f"(input_layout {layout})")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"key head dim {k.shape[3]} differs from query head dim {q.shape[3]}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"value (batch, heads, seq) {tuple(v.shape[:3])} differs from key's "
                         f"{tuple(k.shape[:3])} (canonical BNSD order)")


def _lengths(args, q, k, packed):
    """(q_lens, q_starts, kv_lens, kv_starts) as int64 CPU tensors of length B."""
    if packed:
        q_lens, q_starts = _cumulative(args["actual_seq_lengths"], "actual_seq_lengths", q.shape[2])
        kv_lens, kv_starts = _cumulative(args["actual_seq_lengths_kv"], "actual_seq_lengths_kv",
                                         k.shape[2])
        if kv_lens.numel() != q_lens.numel():
            raise ValueError(f"actual_seq_lengths_kv has {kv_lens.numel()} entries but "
                             f"actual_seq_lengths has {q_lens.numel()} (packed layouts take the "
                             f"batch from their length)")
        return q_lens, q_starts, kv_lens, kv_starts
    batch = q.shape[0]
    zeros = _zero_starts(batch)
    return (_per_batch(args["actual_seq_lengths"], "actual_seq_lengths", batch, q.shape[2]), zeros,
            _per_batch(args["actual_seq_lengths_kv"], "actual_seq_lengths_kv", batch, k.shape[2]),
            zeros)


def _int_list(value, name: str) -> list[int]:
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.dtype.is_floating_point or value.dtype == torch.bool:
            raise TypeError(f"{name} must be a list of ints or a 1-D integer tensor, got "
                            f"{_describe(value)}")
        return [int(x) for x in value.tolist()]
    if type(value) in (list, tuple) and all(type(x) is int for x in value):
        return list(value)  # the common case, without ABC checks (a decode step's lengths)
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in value):
        raise TypeError(f"{name} must be a list of ints, got {_describe(value)}")
    return [int(x) for x in value]


@functools.lru_cache(maxsize=256)
def _full_lengths(batch: int, full: int) -> torch.Tensor:
    """Shared, never written: every batch at the tensor's full length."""
    return torch.full((batch,), full, dtype=torch.int64)


@functools.lru_cache(maxsize=256)
def _zero_starts(batch: int) -> torch.Tensor:
    return torch.zeros(batch, dtype=torch.int64)


def _per_batch(value, name: str, batch: int, full: int) -> torch.Tensor:
    if value is None:
        return _full_lengths(batch, full)
    lens = _int_list(value, name)
    if len(lens) == 1:
        lens = lens * batch
    elif len(lens) >= batch:
        lens = lens[:batch]
    else:
        raise ValueError(f"{name} must have 1 or at least batch={batch} entries, got {len(lens)}")
    for b, n in enumerate(lens):
        if not 0 <= n <= full:
            raise ValueError(f"{name}[{b}] = {n} is outside [0, {full}] (the sequence length of "
                             f"the tensor)")
    return torch.tensor(lens, dtype=torch.int64)


def _cumulative(value, name: str, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    if value is None:
        raise ValueError(f"{name} is required with packed layouts (TND, NTD): the cumulative "
                         f"sequence lengths, one per batch")
    ends = _int_list(value, name)
    if not ends:
        raise ValueError(f"{name} must not be empty with packed layouts")
    prev = 0
    for b, e in enumerate(ends):
        if e < prev:
            raise ValueError(f"{name} must be non-decreasing cumulative lengths starting at >= 0; "
                             f"entry {b} is {e} after {prev}")
        prev = e
    if ends[-1] > total:
        raise ValueError(f"{name} ends at {ends[-1]} but the tensor holds only T={total} tokens")
    ends_t = torch.tensor(ends, dtype=torch.int64)
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), ends_t[:-1]])
    return ends_t - starts, starts


def _scale(scale) -> float:
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float, got {_describe(scale)}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be finite and positive, got {scale}")
    return float(scale)


def _allocation(algorithm, inner_precise: int) -> Allocation:
    if algorithm is None:
        return ALLOCATIONS[DEFAULT_ALGORITHM_BY_PRECISE_BIT[inner_precise & 1]]
    if algorithm not in ALLOCATIONS:
        raise ValueError(f"algorithm must be one of {ALGORITHM_NAMES} or None, got {algorithm!r}")
    return ALLOCATIONS[algorithm]


def _tiling(q_block, kv_block) -> Tiling:
    q_block = DEFAULT_TILING.q_block if q_block is None else _int_arg(q_block, "q_block", 1)
    kv_block = DEFAULT_TILING.kv_block if kv_block is None else _int_arg(kv_block, "kv_block", 2)
    return Tiling(q_block=q_block, kv_block=kv_block)


def _beta(beta, allocation: Allocation, tiling: Tiling, scale: float) -> float:
    if allocation.shift == "none":
        if beta is not None:
            raise ValueError(f"beta applies to pasa and pasa-mixed; algorithm "
                             f"{allocation.name!r} takes beta=None, got {beta!r}")
        return 0.0
    if allocation.shift == "exact":
        if beta is not None:
            raise ValueError(f"pasa-exact always shifts fully (beta = 1); pass beta=None, got "
                             f"{beta!r}")
        return 1.0
    if beta is None:
        return default_beta(tiling.kv_block, scale)
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real):
        raise TypeError(f"beta must be a float, got {_describe(beta)}")
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta must lie in [0, 1) (1 would make the shifting matrix singular), "
                         f"got {beta}")
    return float(beta)


def _to_fp16_checked(tensors, names) -> tuple:
    """bf16 -> fp16 for PASA, refusing values fp16 cannot hold instead of making inf. The
    tensors' peak magnitudes come to the host together: one wait for the device, not one
    per tensor (each peak from one read of its tensor, without an |x| temporary; a NaN
    propagates to the peak and is refused too)."""
    filled = [(t, name) for t, name in zip(tensors, names) if t.numel()]
    if filled:
        ranges = torch.stack([torch.stack(torch.aminmax(t)) for t, _ in filled]).float()
        for (_, name), (low, high) in zip(filled, ranges.tolist()):
            peak = max(-low, high)
            if not peak <= FP16_MAX:
                raise ValueError(
                    f"{name} holds values up to {peak:.6g} in magnitude, beyond fp16's "
                    f"{FP16_MAX:.0f}; PASA computes bf16 inputs in fp16. Use "
                    f"algorithm='fa-fp32' for this input.")
    return tuple(t.to(torch.float16) for t in tensors)


# --------------------------------------------------------------------------- masks


_MASK_CACHE: dict = {}
_VALIDATED_MASKS: dict = {}  # masks already checked, by identity and version: no device sync


def _mask_and_band(args, batch, s_q, s_kv, packed, q_lens, kv_lens, device):
    """(mask (Bm, S1, S2) bool or None, band (pre, next) per batch in top-left
    coordinates or None) for torch_npu's sparse_mode semantics."""
    sparse_mode = _int_arg(args["sparse_mode"], "sparse_mode", minimum=0)
    if sparse_mode > 4:
        raise ValueError(f"sparse_mode must be 0-4 (torch_npu's fused_infer_attention_score "
                         f"supports no other), got {sparse_mode}")
    pre = _int_arg(args["pre_tokens"], "pre_tokens", minimum=-(2 ** 63))
    nxt = _int_arg(args["next_tokens"], "next_tokens", minimum=-(2 ** 63))
    tokens_given = (pre, nxt) != (INT_MAX, INT_MAX)
    mask = args["atten_mask"]
    _check_mask(mask, device)

    if sparse_mode in (2, 3, 4):
        _check_optimized_mask(mask, sparse_mode)
        if s_q == 1:
            if sparse_mode != 3:
                warnings.warn(f"sparse_mode={sparse_mode} has no effect when the query length is "
                              f"1 (torch_npu ignores it in decode); every valid key is attended",
                              stacklevel=4)
            return None, None
        if sparse_mode == 2:
            return None, (torch.full((batch,), INT_MAX, dtype=torch.int64),
                          torch.zeros(batch, dtype=torch.int64))
        if sparse_mode == 3:
            return None, (torch.full((batch,), INT_MAX, dtype=torch.int64), kv_lens - q_lens)
        _check_tokens(pre, nxt)
        return None, (pre - kv_lens + q_lens, nxt + kv_lens - q_lens)

    if mask is None:
        if sparse_mode == 1:
            raise ValueError("sparse_mode=1 (allMask) needs the full atten_mask, got None")
        if tokens_given:
            warnings.warn("pre_tokens/next_tokens have no effect with sparse_mode=0 and no "
                          "atten_mask (torch_npu ignores them too)", stacklevel=4)
        return None, None
    if packed:
        raise ValueError(f"packed layouts (TND) take sparse_mode 0 without atten_mask or 2-4 "
                         f"with the optimized mask, as torch_npu; got sparse_mode={sparse_mode} "
                         f"with an atten_mask")
    dense = _dense_mask(mask, batch, s_q, s_kv)
    if sparse_mode == 1 or not tokens_given:
        if sparse_mode == 1 and tokens_given:
            warnings.warn("pre_tokens/next_tokens have no effect with sparse_mode=1", stacklevel=4)
        return dense, None
    if s_q == 1:
        warnings.warn("pre_tokens/next_tokens have no effect when the query length is 1 "
                      "(torch_npu ignores them in decode)", stacklevel=4)
        return dense, None
    _check_tokens(pre, nxt)
    return dense, (torch.full((batch,), pre, dtype=torch.int64),
                   torch.full((batch,), nxt, dtype=torch.int64))


def _check_mask(mask, device) -> None:
    """atten_mask's type, dtype and device (metadata only: fake tensors pass through)."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"atten_mask must be a tensor or None, got {_describe(mask)}")
    if mask.dtype not in (torch.bool, torch.int8, torch.uint8):
        raise TypeError(f"atten_mask must be bool, int8 or uint8, got {mask.dtype}")
    if mask.device != device:
        raise ValueError(f"atten_mask is on {mask.device} but query is on {device}")


def _check_tokens(pre: int, nxt: int) -> None:
    if pre < 0 and nxt < 0:
        raise ValueError(f"pre_tokens ({pre}) and next_tokens ({nxt}) cannot both be negative")
    if -nxt > pre:
        raise ValueError(f"the band is empty: -next_tokens ({-nxt}) exceeds pre_tokens ({pre})")


def _tensor_identity(t: torch.Tensor) -> tuple:
    """This very tensor, unchanged since: its id (the caller keeps it alive while the key is
    held, so the id is not reused), storage, in-place version and metadata."""
    return (id(t), t.data_ptr(), t._version, t.shape, t.stride(), t.dtype, t.device)


def _check_optimized_mask(mask, sparse_mode: int) -> None:
    n = OPTIMIZED_MASK_SIZE
    if mask is None:
        raise ValueError(f"sparse_mode={sparse_mode} needs torch_npu's optimized {n}x{n} "
                         f"atten_mask (pasa_npu.compressed_causal_mask()), got None")
    if mask.shape not in ((n, n), (1, n, n), (1, 1, n, n)):
        raise ValueError(f"sparse_mode={sparse_mode} needs the optimized mask of shape ({n}, {n}), "
                         f"(1, {n}, {n}) or (1, 1, {n}, {n}); got {tuple(mask.shape)}")
    key = _tensor_identity(mask)
    if key in _VALIDATED_MASKS:
        return
    expected = _MASK_CACHE.get(mask.device)
    if expected is None:
        expected = _MASK_CACHE[mask.device] = compressed_causal_mask(mask.device)
    if not torch.equal(mask.reshape(n, n).bool(), expected):
        raise ValueError(f"sparse_mode={sparse_mode} needs the optimized mask to be the strict "
                         f"upper triangle (True above the diagonal), as torch_npu documents")
    if len(_VALIDATED_MASKS) > 64:
        _VALIDATED_MASKS.clear()
    _VALIDATED_MASKS[key] = mask  # kept alive: its id is not reused while cached


def _dense_mask(mask: torch.Tensor, batch: int, s_q: int, s_kv: int) -> torch.Tensor:
    shape = tuple(mask.shape)
    if mask.dim() == 2:
        m = mask.unsqueeze(1) if s_q == 1 else mask.unsqueeze(0)
    elif mask.dim() == 3:
        m = mask
    elif mask.dim() == 4:
        if mask.shape[1] != 1:
            raise ValueError(f"atten_mask of 4 dims must be (B or 1, 1, S1, S2); got {shape}")
        m = mask[:, 0]
    else:
        raise ValueError(f"atten_mask must have 2, 3 or 4 dims, got shape {shape}")
    if m.shape[0] not in (1, batch) or m.shape[1] < s_q or m.shape[2] < s_kv:
        expected = ("(B, S2), (B, 1, S2) or (B, 1, 1, S2)" if s_q == 1 else
                    "(S1, S2), (B|1, S1, S2) or (B|1, 1, S1, S2)")
        raise ValueError(f"atten_mask shape {shape} does not fit batch={batch}, S1={s_q}, "
                         f"S2={s_kv}: expected {expected} with S1, S2 at least the query and key "
                         f"lengths")
    return m[:, :s_q, :s_kv].bool()


# --------------------------------------------------------------------------- outputs


def _allocate_output(q, v, out_layout, dtype, zero: bool):
    """The output tensor in ``out_layout`` and its canonical (Bt, N, S, Dv) view."""
    bt, n, s, _ = q.shape
    d_v = v.shape[3]
    kw = dict(dtype=dtype, device=q.device)
    new = torch.zeros if zero else torch.empty
    if out_layout == "BSH":
        out = new(bt, s, n * d_v, **kw)
        return out, out.view(bt, s, n, d_v).permute(0, 2, 1, 3)
    if out_layout == "BSND":
        out = new(bt, s, n, d_v, **kw)
        return out, out.permute(0, 2, 1, 3)
    if out_layout == "BNSD":
        out = new(bt, n, s, d_v, **kw)
        return out, out
    if out_layout == "NBSD":
        out = new(n, bt, s, d_v, **kw)
        return out, out.permute(1, 0, 2, 3)
    if out_layout == "TND":
        out = new(s, n, d_v, **kw)
        return out, out.permute(1, 0, 2).unsqueeze(0)
    out = new(n, s, d_v, **kw)  # NTD
    return out, out.unsqueeze(0)


def _allocate_lse(q, packed: bool, dtype):
    bt, n, s, _ = q.shape
    if packed:
        lse = torch.zeros(s, n, 1, dtype=dtype, device=q.device)
        return lse, lse[..., 0].permute(1, 0).unsqueeze(0)
    lse = torch.zeros(bt, n, s, 1, dtype=dtype, device=q.device)
    return lse, lse[..., 0]


def _lse_placeholder(device) -> torch.Tensor:
    return torch.zeros(1, dtype=torch.float32, device=device)


def _fix_rows(problem: AttentionProblem, value: torch.Tensor, plan: _Plan) -> None:
    """torch_npu's row rules: rows past the query length are 0 (LSE too); rows that
    see no key are 0 with inner_precise bit 1, else the mean of V over valid keys."""
    if problem.lse is not None and plan.lse_rows_past:
        past = torch.arange(problem.lse.shape[2]) >= problem.q_lens[:, None]
        problem.lse.masked_fill_(past[:, None].to(problem.lse.device), 0.0)
    if plan.inner_precise & 2 or not plan.may_have_empty:
        return
    empty = _rows_without_keys(problem)
    if not bool(empty.any()):
        return
    b_idx, rows = empty.nonzero(as_tuple=True)
    means = torch.zeros(problem.batch, value.shape[1], value.shape[3], dtype=torch.float64,
                        device=value.device)
    for b in set(b_idx.tolist()):
        s, n = int(problem.kv_starts[b]), int(problem.kv_lens[b])
        if n:
            tb = 0 if problem.packed else b
            means[b] = value[tb, :, s:s + n].double().mean(1)
    means = means.repeat_interleave(problem.group, dim=1)  # kv heads -> query heads
    tb = torch.zeros_like(b_idx) if problem.packed else b_idx
    pos = rows + problem.q_starts[b_idx]
    dev = problem.out.device
    problem.out[tb.to(dev), :, pos.to(dev)] = means[b_idx.to(means.device)].to(
        problem.out.dtype).to(dev)


def _may_have_empty_rows(q_lens: list, kv_lens: list, band) -> bool:
    """Can a row inside its query length see no key (band and lengths only)? O(B) in
    Python ints: a few per batch, cheaper than tensor operations on a decode step. Row i
    sees [max(0, i - pre), min(kv_len - 1, i + next)]."""
    pres, nxts = (t.tolist() for t in band) if band is not None else ((), ())
    for b, (q, kv) in enumerate(zip(q_lens, kv_lens)):
        if q > 0 and (kv == 0 or (band is not None and (nxts[b] < 0 or q - 1 - pres[b] > kv - 1))):
            return True
    return False


def _rows_without_keys(problem: AttentionProblem) -> torch.Tensor:
    """Bool (B, max S1) on CPU: rows inside the query length that can see no key."""
    s_q = problem.query.shape[2] if not problem.packed else problem.max_q_len
    i = torch.arange(s_q)[None, :]
    valid = i < problem.q_lens[:, None]
    if problem.mask is None:
        lo = torch.zeros_like(i)
        hi = problem.kv_lens[:, None] - 1
        if problem.band is not None:
            pre, nxt = problem.band
            lo = torch.maximum(lo, i - pre[:, None])
            hi = torch.minimum(hi, i + nxt[:, None])
        return valid & (lo > hi)
    cols = torch.arange(problem.key.shape[2], device=problem.mask.device)
    has = torch.zeros(problem.batch, s_q, dtype=torch.bool)
    chunk = max(1, (1 << 22) // max(1, cols.numel()))
    for r0 in range(0, s_q, chunk):
        rows = torch.arange(r0, min(r0 + chunk, s_q), device=problem.mask.device)
        has[:, r0:r0 + rows.numel()] = problem.visible(rows, cols).any(-1).cpu()
    return valid & ~has


# --------------------------------------------------------------------------- torch.compile


@torch.library.custom_op("pasa_npu::fused_attention", mutates_args=())
def _fused_attention_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    atten_mask: Optional[torch.Tensor],
    actual_seq_lengths: Optional[list[int]], actual_seq_lengths_kv: Optional[list[int]],
    actual_seq_lengths_tensor: Optional[torch.Tensor],
    actual_seq_lengths_kv_tensor: Optional[torch.Tensor],
    num_heads: int, scale: float, pre_tokens: int, next_tokens: int, input_layout: str,
    num_key_value_heads: int, sparse_mode: int, inner_precise: int, softmax_lse_flag: bool,
    algorithm: Optional[str], beta: Optional[float], backend: str, rounding_guard: bool,
    q_block: Optional[int], kv_block: Optional[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fused_attention` as one opaque operator for torch.compile (the lengths come
    as a list or as a tensor, in separate arguments). It runs the eager call, so compiled
    code keeps every rounding of the allocation: traced into, the torch backend's fp16
    steps would be fused by the compiler and computed with fewer roundings."""
    given = dict(locals())
    for name in ("actual_seq_lengths", "actual_seq_lengths_kv"):
        tensor = given.pop(name + "_tensor")
        if tensor is not None:
            given[name] = tensor
    args = {name: p.default for name, p in _SIGNATURE.parameters.items()}
    args.update(given)
    return _attention(args, golden=False)


@_fused_attention_op.register_fake
def _(query, key, value, atten_mask, actual_seq_lengths, actual_seq_lengths_kv,
      actual_seq_lengths_tensor, actual_seq_lengths_kv_tensor, num_heads, scale, pre_tokens,
      next_tokens, input_layout, num_key_value_heads, sparse_mode, inner_precise,
      softmax_lse_flag, algorithm, beta, backend, rounding_guard, q_block, kv_block):
    """The outputs' shapes, strides and dtypes, as :func:`_execute` allocates them."""
    in_layout, out_layout = _layout(input_layout)
    q, _, v = _canonical_views(query, key, value, in_layout, num_heads,
                               num_key_value_heads or num_heads)
    out, _ = _allocate_output(q, v, out_layout, query.dtype, zero=False)
    if softmax_lse_flag:
        return out, _allocate_lse(q, in_layout in _PACKED, torch.float32)[0]
    return out, _lse_placeholder(query.device)


def _traced_call(args: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fused_attention` under torch.compile: one call of the opaque operator.
    Arguments its schema cannot carry are refused here with the eager call's errors."""
    _check_implemented(args)
    _check_tensors(args["query"], args["key"], args["value"])
    mask = args["atten_mask"]
    _check_mask(mask, args["query"].device)
    lengths = {}
    for name in ("actual_seq_lengths", "actual_seq_lengths_kv"):
        value = args[name]
        tensor = isinstance(value, torch.Tensor)
        lengths[name] = None if value is None or tensor else _int_list(value, name)
        lengths[name + "_tensor"] = value if tensor else None
    scalars = {name: _schema_value(args[name], name, kind, optional)
               for name, (kind, optional) in _OP_SCALARS.items()}
    return _fused_attention_op(args["query"], args["key"], args["value"], mask, **lengths,
                               **scalars)


#: The operator's non-tensor arguments: the Python type its schema takes, None allowed
_OP_SCALARS = {
    "num_heads": (int, False), "scale": (float, False), "pre_tokens": (int, False),
    "next_tokens": (int, False), "input_layout": (str, False),
    "num_key_value_heads": (int, False), "sparse_mode": (int, False),
    "inner_precise": (int, False), "softmax_lse_flag": (bool, False),
    "algorithm": (str, True), "beta": (float, True), "backend": (str, False),
    "rounding_guard": (bool, False), "q_block": (int, True), "kv_block": (int, True),
}


def _schema_value(value, name: str, kind: type, optional: bool):
    """``value`` as the ``kind`` the operator's schema takes; values are checked by the
    eager call inside the operator."""
    if value is None and optional:
        return None
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is str:
        ok = isinstance(value, str)
    else:
        ok = (isinstance(value, numbers.Integral if kind is int else numbers.Real)
              and not isinstance(value, bool))
    if not ok:
        article = "an" if kind is int else "a"
        raise TypeError(f"{name} must be {article} {kind.__name__}"
                        f"{' or None' if optional else ''}, got {_describe(value)}")
    return kind(value)
