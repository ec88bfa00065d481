"""A call's scalar arguments checked and normalised into :class:`Options`
(:func:`resolve_options`): the layouts, β, the tiling, the sparse mode and the sinks, with
errors that name the argument, what was expected and what came. The arguments themselves, as
given, are :class:`pasa_npu.arguments.Call`'s.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from .arguments import Call, describe
from .beta import default_beta
from .numerics import (ALGORITHM_NAMES, ALLOCATIONS, DEFAULT_ALGORITHM_BY_PRECISE_BIT,
                       DEFAULT_TILING, Allocation, Tiling)

#: input_layout -> (query/key/value layout, output layout)
LAYOUTS = {
    "BSH": ("BSH", "BSH"), "BSND": ("BSND", "BSND"), "BNSD": ("BNSD", "BNSD"),
    "TND": ("TND", "TND"), "BNSD_BSND": ("BNSD", "BSND"), "BSH_NBSD": ("BSH", "NBSD"),
    "BSND_NBSD": ("BSND", "NBSD"), "BNSD_NBSD": ("BNSD", "NBSD"), "TND_NTD": ("TND", "NTD"),
    "NTD_TND": ("NTD", "TND"),
}
PACKED = ("TND", "NTD")


@dataclass(frozen=True)
class Options:
    """A call's scalar arguments, validated and resolved once (the plan holds them):
    layouts, heads, scale, ``inner_precise``, the outputs asked for, the sparse mode and its
    token counts, the paged cache's block size, and (for a call that is not the golden) the
    allocation, tiling, rounding guard and whether the overflow check runs. β, which the
    allocation and tiling decide, is :func:`resolve_beta`'s."""

    in_layout: str
    out_layout: str
    packed: bool
    num_heads: int
    num_kv_heads: int
    scale: float
    inner_precise: int
    want_lse: bool
    out_dtype: torch.dtype
    allocation: Allocation
    tiling: Tiling
    rounding_guard: bool
    overflow_check: bool
    sparse_mode: int
    pre_tokens: int
    next_tokens: int
    block_size: int


def resolve_options(call: Call, golden: bool) -> Options:
    """``call``'s :class:`Options`, or the first error among them, naming the argument.
    ``golden``: the fp64 reference, which takes torch_npu's arguments only (fa-fp32's
    order of operations, no tiling choice, no check)."""
    query = call.query
    check_tensors(query, call.key, call.value)
    in_layout, out_layout = parse_layout(call.input_layout)
    num_heads = int_arg(call.num_heads, "num_heads", minimum=1)
    num_kv_heads = int_arg(call.num_key_value_heads, "num_key_value_heads", minimum=0)
    num_kv_heads = num_kv_heads or num_heads
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_key_value_heads "
                         f"({num_kv_heads})")
    check_fia_limits(num_heads, num_kv_heads)
    scale = check_scale(call.scale)
    inner_precise = int_arg(call.inner_precise, "inner_precise", minimum=0)
    if inner_precise > 3:
        raise ValueError(f"inner_precise must be 0, 1, 2 or 3, got {inner_precise}")
    out_dtype = resolve_out_dtype(call.out_dtype, query.dtype)
    if not isinstance(call.softmax_lse_flag, bool):
        raise TypeError(f"softmax_lse_flag must be a bool, got "
                        f"{describe(call.softmax_lse_flag)}")
    sparse_mode = int_arg(call.sparse_mode, "sparse_mode", minimum=0)
    if sparse_mode > 4:
        raise ValueError(f"sparse_mode must be 0-4 (torch_npu's fused_infer_attention_score "
                         f"supports no other), got {sparse_mode}")
    common = dict(in_layout=in_layout, out_layout=out_layout, packed=in_layout in PACKED,
                  num_heads=num_heads, num_kv_heads=num_kv_heads, scale=scale,
                  inner_precise=inner_precise, want_lse=call.softmax_lse_flag,
                  sparse_mode=sparse_mode,
                  pre_tokens=int_arg(call.pre_tokens, "pre_tokens", -INT64_MAX - 1, INT64_MAX,
                                     "torch_npu's int64"),
                  next_tokens=int_arg(call.next_tokens, "next_tokens", -INT64_MAX - 1, INT64_MAX,
                                      "torch_npu's int64"),
                  block_size=int_arg(call.block_size, "block_size", minimum=0))
    if golden:
        return Options(**common, out_dtype=torch.float64, allocation=ALLOCATIONS["fa-fp32"],
                       tiling=DEFAULT_TILING, rounding_guard=False,
                       overflow_check=False)
    allocation = resolve_allocation(call.algorithm, inner_precise, query.dtype)
    tiling = resolve_tiling(call.q_block, call.kv_block)
    check_flags_and_backend(call.rounding_guard, call.repair_overflow, call.backend)
    return Options(**common, out_dtype=out_dtype, allocation=allocation, tiling=tiling,
                   rounding_guard=call.rounding_guard,
                   overflow_check=overflow_checked(call.repair_overflow, allocation))


def check_flags_and_backend(rounding_guard, repair_overflow, backend) -> None:
    """The types of ``rounding_guard``, ``repair_overflow`` (bool) and ``backend`` (str)."""
    for name, value in (("rounding_guard", rounding_guard), ("repair_overflow", repair_overflow)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {describe(value)}")
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {describe(backend)}")


def overflow_checked(repair_overflow: bool, allocation: Allocation) -> bool:
    """Whether a call's results are checked for overflow and loss of resolution: a PASA
    allocation, unless ``repair_overflow=False``."""
    return repair_overflow is True and allocation.shifts_keys


#: FIA's limits (docs/fia-conformance.md): heads per axis, query heads per kv head, head dim
MAX_HEADS, MAX_GROUP, MAX_HEAD_DIM, MAX_NBSD_QUERY_LEN = 256, 64, 512, 16
#: FIA's batch limits: B, and the sequences of a packed (TND) call
MAX_BATCH, MAX_PACKED_BATCH = 65536, 4096


def check_fia_limits(num_heads: int, num_kv_heads: int) -> None:
    """The head counts FIA refuses: over 256 on either axis, over 64 query heads per kv
    head (op-plugin's FIA documentation; the aclnn document)."""
    for name, n in (("num_heads", num_heads), ("num_key_value_heads", num_kv_heads)):
        if n > MAX_HEADS:
            raise ValueError(f"{name} must be at most {MAX_HEADS} (torch_npu's limit), got {n}")
    if num_heads // num_kv_heads > MAX_GROUP:
        raise ValueError(f"num_heads / num_key_value_heads must be at most {MAX_GROUP} "
                         f"(torch_npu's limit), got {num_heads} / {num_kv_heads} = "
                         f"{num_heads // num_kv_heads}")


#: torch's ScalarType codes of the output dtypes ``out_dtype`` may name without quantising
OUT_DTYPE_CODES = {torch.float16: 5, torch.bfloat16: 15}
_OUT_DTYPES = {code: dtype for dtype, code in OUT_DTYPE_CODES.items()}


def resolve_out_dtype(out_dtype, query_dtype: torch.dtype) -> torch.dtype:
    """The output dtype of a call: the query's (None), or float16 / bfloat16 given as a
    torch dtype or its ScalarType code (5, 15). Other outputs (int8, fp8) quantise the
    output: not implemented."""
    if out_dtype is None:
        return query_dtype
    if isinstance(out_dtype, torch.dtype):
        dtype = out_dtype
    elif isinstance(out_dtype, numbers.Integral) and not isinstance(out_dtype, bool):
        dtype = _OUT_DTYPES.get(int(out_dtype))
    else:
        raise TypeError(f"out_dtype must be an int (a ScalarType code) or a torch.dtype, got "
                        f"{describe(out_dtype)}")
    if dtype not in (torch.float16, torch.bfloat16):
        raise NotImplementedError(
            f"out_dtype={out_dtype!r} is not implemented by pasa_npu yet (float16 or bfloat16 "
            f"outputs only: quantised outputs are not)")
    return dtype


#: learnable_sink: the layouts and the largest value head dim torch_npu takes it with
SINK_LAYOUTS, SINK_MAX_HEAD_DIM_V = ("TND", "NTD_TND"), 128


def check_sink(sink, num_heads: int, input_layout: str, head_dim_v: int, device) -> None:
    """``learnable_sink``: :func:`check_sink_tensor`, with torch_npu's limits (TND or
    NTD_TND, value head dim at most 128)."""
    if sink is None:
        return
    check_sink_tensor(sink, num_heads, device, "learnable_sink")
    if input_layout not in SINK_LAYOUTS:
        raise ValueError(f"learnable_sink takes input_layout {' or '.join(SINK_LAYOUTS)} "
                         f"(torch_npu's limit), got {input_layout!r}")
    if head_dim_v > SINK_MAX_HEAD_DIM_V:
        raise ValueError(f"learnable_sink takes a value head dim of at most "
                         f"{SINK_MAX_HEAD_DIM_V} (torch_npu's limit), got {head_dim_v}")


def check_sink_tensor(sink, num_heads: int, device, name: str) -> None:
    """Sinks (``name``): a float16, bfloat16 or float32 (Nq,) tensor on the query's device,
    one logit per query head."""
    if not isinstance(sink, torch.Tensor) or sink.dtype not in (
            torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"{name} must be a float16, bfloat16 or float32 tensor, got "
                        f"{describe(sink)}")
    if tuple(sink.shape) != (num_heads,):
        raise ValueError(f"{name} must have shape ({num_heads},), one logit per query "
                         f"head, got {tuple(sink.shape)}")
    if sink.device != device:
        raise ValueError(f"{name} is on {sink.device} but query is on {device}")


def int_arg(value, name: str, minimum: int, maximum: int | None = None, why: str = "") -> int:
    """``value``, an int in [minimum, maximum]; the errors name ``name`` and give ``why``
    the maximum holds."""
    if type(value) is int and value >= minimum and (maximum is None or value <= maximum):
        return value  # the common case, without ABC checks
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {describe(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}{why and f' ({why})'}, got {value}")
    return int(value)


INT64_MAX = 2 ** 63 - 1
#: the largest q_block and kv_block: a larger tile only costs memory (the torch backend
#: forms q_block x kv_block scores and PASA's kv_block x kv_block shifting matrix)
MAX_TILE = 8192


def check_tensors(query, key, value) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {describe(t)}")
        if t.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"{name} must be float16 or bfloat16, got {t.dtype}")
    for name, t in (("key", key), ("value", value)):
        if t.dtype != query.dtype:
            raise TypeError(f"{name} dtype {t.dtype} differs from query dtype {query.dtype}")
        if t.device != query.device:
            raise ValueError(f"{name} is on {t.device} but query is on {query.device}")


def parse_layout(input_layout) -> tuple[str, str]:
    if not isinstance(input_layout, str):
        raise TypeError(f"input_layout must be a str, got {describe(input_layout)}")
    if input_layout not in LAYOUTS:
        raise ValueError(f"input_layout must be one of {sorted(LAYOUTS)}, got {input_layout!r}")
    return LAYOUTS[input_layout]


def check_scale(scale) -> float:
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float, got {describe(scale)}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be finite and positive, got {scale}")
    return float(scale)


def resolve_allocation(algorithm, inner_precise: int, dtype=None) -> Allocation:
    """The allocation a call runs: ``algorithm``, or by inner_precise bit 0 (0: high
    precision, 1: high performance); bf16 inputs do not distinguish the two (FIA's rule),
    they take bit 0 = 0's."""
    if algorithm is None:
        bit0 = 0 if dtype == torch.bfloat16 else inner_precise & 1
        return ALLOCATIONS[DEFAULT_ALGORITHM_BY_PRECISE_BIT[bit0]]
    if algorithm not in ALLOCATIONS:
        raise ValueError(f"algorithm must be one of {ALGORITHM_NAMES} or None, got {algorithm!r}")
    return ALLOCATIONS[algorithm]


def resolve_tiling(q_block, kv_block) -> Tiling:
    why = "a larger tile only costs memory"
    q_block = (DEFAULT_TILING.q_block if q_block is None
               else int_arg(q_block, "q_block", 1, MAX_TILE, why))
    kv_block = (DEFAULT_TILING.kv_block if kv_block is None
                else int_arg(kv_block, "kv_block", 2, MAX_TILE, why))
    return Tiling(q_block=q_block, kv_block=kv_block)


def resolve_beta(beta, allocation: Allocation, tiling: Tiling, scale: float,
                 picked_by: str = "") -> float:
    """PASA's shift fraction: ``beta`` checked, or the optimal one for the tiling and scale;
    0 where the allocation does not shift. ``picked_by`` says, in its errors, how
    ``algorithm=None`` chose the allocation."""
    if not allocation.shifts_keys:
        if beta is not None:
            raise ValueError(f"beta applies to pasa and pasa-mixed; algorithm "
                             f"{allocation.name!r}{picked_by and picked_by + ','} takes beta=None, got {beta!r}")
        return 0.0
    if allocation.exact_shift:
        if beta is not None:
            raise ValueError(f"pasa-exact always shifts fully (beta = 1); pass beta=None, got "
                             f"{beta!r}")
        return 1.0
    if beta is None:
        try:
            return default_beta(tiling.kv_block, scale)
        except ValueError:
            raise ValueError(
                f"no beta solves PASA's optimal accuracy condition for scale={scale} and "
                f"kv_block={tiling.kv_block}: the shifting matrix's fp16 entries "
                f"scale*(1 - beta/kv_block) and scale*beta/kv_block underflow or overflow "
                f"there; pass beta in [0, 1), or algorithm='pasa-exact' or 'fa-fp32' "
                f"(algorithm {allocation.name!r}{picked_by})") from None
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real):
        raise TypeError(f"beta must be a float, got {describe(beta)}")
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta must lie in [0, 1) (1 would make the shifting matrix singular), "
                         f"got {beta}")
    return float(beta)
