"""``fused_attention`` under torch.compile: one opaque operator,
``torch.ops.pasa_npu.fused_attention``.

The operator runs the eager call, so that compiled code keeps every rounding of the
allocation: traced into, the torch backend's fp16 steps would be fused by the compiler and
computed with fewer roundings. Its schema derives from the argument table
(:data:`pasa_npu.arguments.KEYWORD_ARGUMENTS`): the tensors, each length argument as a list
and as a tensor (separate arguments, one of them None), and every implemented scalar with
its type. Unimplemented keywords never reach it: :func:`traced_call` refuses them with the
eager call's errors.

The operator returns the call's overflow row flags after out and LSE (an empty tensor
where the call is not checked): the compiled code hands them to
:func:`pasa_npu.overflow.record_compiled` with the resolved facts the report needs, so that
they are an output of the compiled graph, which a CUDA graph's memory pool tracks
(``mode="reduce-overhead"``), and every replay records its own.
"""
from __future__ import annotations

import dataclasses
import inspect
import numbers
import typing
from typing import Optional

import torch

from . import overflow, paging, plans
from .arguments import KEYWORD_ARGUMENTS, TENSOR_NAMES, V2_EXTENSIONS, Call, describe
from .lengths import int_list
from .masks import check_mask
from .options import (LAYOUTS, OUT_DTYPE_CODES, PACKED, overflow_checked, resolve_allocation,
                      resolve_options, resolve_out_dtype)
from .views import canonical_views, to_canonical
from .outputs import allocate_lse, allocate_output, lse_placeholder

#: v1's keywords and v2's additions (the learnable sinks, the output dtype)
_ARGUMENTS = (*KEYWORD_ARGUMENTS, *V2_EXTENSIONS)
_TENSORS = [a.name for a in _ARGUMENTS if a.kind == "tensor"]
_LENGTHS = [a.name for a in _ARGUMENTS if a.kind == "lengths"]


def _scalar_type(annotation) -> tuple[type, bool]:
    """(the Python type, whether None is allowed) of a scalar argument's annotation."""
    if typing.get_origin(annotation) is typing.Union:
        kind, = (t for t in typing.get_args(annotation) if t is not type(None))
        return kind, True
    return annotation, False


#: the operator's non-tensor arguments: the Python type its schema takes, None allowed
OP_SCALARS = {a.name: _scalar_type(a.annotation) for a in _ARGUMENTS if a.kind == "scalar"}


def _parameter(name: str, annotation) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation)


OP_SIGNATURE = inspect.Signature(
    [_parameter(name, torch.Tensor) for name in TENSOR_NAMES]
    + [_parameter(name, Optional[torch.Tensor]) for name in _TENSORS]
    + [_parameter(name, Optional[list[int]]) for name in _LENGTHS]
    + [_parameter(name + "_tensor", Optional[torch.Tensor]) for name in _LENGTHS]
    + [_parameter(a.name, a.annotation) for a in _ARGUMENTS if a.kind == "scalar"],
    return_annotation=tuple[torch.Tensor, torch.Tensor, torch.Tensor])

def _eager_arguments(op_args: tuple, op_kwargs: dict) -> dict:
    """The operator's arguments as the eager call's (each length from its list or tensor)."""
    given = OP_SIGNATURE.bind(*op_args, **op_kwargs).arguments
    for name in _LENGTHS:
        tensor = given.pop(name + "_tensor")
        if tensor is not None:
            given[name] = tensor
    query, key, value = (given.pop(name) for name in TENSOR_NAMES)
    return Call(query, key, value, **given)


def _run(*op_args, **op_kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`pasa_npu.fused_attention` as one opaque operator: the eager call, its row
    flags returned (:func:`pasa_npu.plans.attention`, ``traced``)."""
    return plans.attention(_eager_arguments(op_args, op_kwargs), golden=False, traced=True)


def _fake(*op_args, **op_kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The outputs' shapes, strides and dtypes, as the eager call allocates them."""
    call = _eager_arguments(op_args, op_kwargs)
    query = call.query
    # the arguments were validated by traced_call; here ints may be symbolic
    in_layout, out_layout = LAYOUTS[call.input_layout]
    num_kv_heads = call.num_key_value_heads or call.num_heads
    if call.block_table is not None:  # K/V are paged caches
        q = to_canonical(query, "query", in_layout, call.num_heads)
        _, v = paging.cache_views(call.key, call.value, in_layout, num_kv_heads,
                                  call.block_size)
    else:
        q, _, v = canonical_views(query, call.key, call.value, in_layout, call.num_heads,
                                  num_kv_heads)
    out, out_view = allocate_output(q, v, out_layout,
                                    resolve_out_dtype(call.out_dtype, query.dtype), zero=False)
    inner_precise = call.inner_precise if isinstance(call.inner_precise, int) else 0
    allocation = resolve_allocation(call.algorithm, inner_precise, query.dtype)
    flags = query.new_empty(out_view.shape[:3] if overflow_checked(call.repair_overflow,
                                                                  allocation) else (0,),
                            dtype=torch.uint8)
    if call.softmax_lse_flag:
        return out, allocate_lse(q, in_layout in PACKED, torch.float32)[0], flags
    return out, lse_placeholder(query.device), flags


_run.__signature__ = _fake.__signature__ = OP_SIGNATURE
fused_attention_op = torch.library.custom_op("pasa_npu::fused_attention", mutates_args=())(_run)
fused_attention_op.register_fake(_fake)


def traced_call(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pasa_npu.fused_attention` under torch.compile (``call``: its arguments): one call of the opaque operator. Arguments its schema cannot carry are refused
    here with the eager call's errors."""
    call = _specialised(call)
    options = resolve_options(call, golden=False)  # the operator's fake kernel reads them resolved
    if isinstance(call.out_dtype, torch.dtype):  # the schema takes its ScalarType code
        call = dataclasses.replace(call, out_dtype=OUT_DTYPE_CODES[call.out_dtype])
    check_mask(call.atten_mask, call.query.device)
    op_args = {name: getattr(call, name) for name in (*TENSOR_NAMES, *_TENSORS)}
    for name in _LENGTHS:
        value = getattr(call, name)
        tensor = isinstance(value, torch.Tensor)
        op_args[name] = None if value is None or tensor else int_list(value, name)
        op_args[name + "_tensor"] = value if tensor else None
    for name, (kind, optional) in OP_SCALARS.items():
        op_args[name] = _schema_value(getattr(call, name), name, kind, optional)
    out, lse, row_flags = fused_attention_op(**op_args)
    lengths = op_args["actual_seq_lengths_tensor"]
    overflow.record_compiled(row_flags, overflow.CompiledCall(
        options.allocation.name, call.backend, options.packed, options.tiling.q_block,
        op_args["actual_seq_lengths"] if lengths is None else lengths))
    return out, lse


def _specialised(call: Call) -> Call:
    """``call`` with its symbolic scalars (``dynamic=True`` makes a float held outside the
    compiled function one) as the numbers they hold, guarded on: the checks, β and the
    plan depend on the values."""
    # loaded by torch.compile already; at the top it would add a third of a second to import
    from torch.fx.experimental.symbolic_shapes import guard_scalar

    given = {}
    for name, (kind, _) in OP_SCALARS.items():
        value = getattr(call, name)
        if kind in (int, float) and isinstance(value, numbers.Real) and not isinstance(value, bool):
            given[name] = guard_scalar(value)
    return dataclasses.replace(call, **given)


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
                        f"{' or None' if optional else ''}, got {describe(value)}")
    return kind(value)
