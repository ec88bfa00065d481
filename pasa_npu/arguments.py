"""torch_npu's argument list, written once, and the binding of a call to it.

:data:`TORCH_NPU_ARGUMENTS` and :data:`OWN_ARGUMENTS` are the one table of the keyword
arguments of :func:`pasa_npu.fused_attention` (name, default, type, and what this package
does with it). The public signature (:data:`SIGNATURE`), the keywords refused as not
implemented and the compiled operator's schema (:mod:`pasa_npu.compiled`) derive from it;
:class:`Call`, the typed arguments every call binds (:func:`bind`), holds its fields.
:mod:`pasa_npu.options` checks the values and turns them into what a plan holds.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import operator
import re
import sys
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from .problem import host_memory

INT_MAX = 2147483647


@dataclass(frozen=True)
class Argument:
    """A keyword argument of :func:`pasa_npu.fused_attention`. ``kind``: "tensor" (an
    optional tensor), "lengths" (a list of ints or a 1-D integer tensor), "scalar" (of
    ``annotation``, which is also the compiled operator's schema type) or "unimplemented"
    (accepted at its default only)."""

    name: str
    default: object
    annotation: object = inspect.Parameter.empty
    kind: str = "scalar"


def _unimplemented(name: str, default=None, annotation=inspect.Parameter.empty) -> Argument:
    return Argument(name, default, annotation, "unimplemented")


#: torch_npu.npu_fused_infer_attention_score's keywords, in its order
TORCH_NPU_ARGUMENTS = (
    _unimplemented("pse_shift"),
    Argument("atten_mask", None, Optional[torch.Tensor], "tensor"),
    Argument("actual_seq_lengths", None, Optional[Sequence[int]], "lengths"),
    Argument("actual_seq_lengths_kv", None, Optional[Sequence[int]], "lengths"),
    *(_unimplemented(name) for name in (
        "dequant_scale1", "quant_scale1", "dequant_scale2", "quant_scale2", "quant_offset2",
        "antiquant_scale", "antiquant_offset")),
    Argument("block_table", None, Optional[torch.Tensor], "tensor"),
    *(_unimplemented(name) for name in (
        "query_padding_size", "kv_padding_size", "key_antiquant_scale", "key_antiquant_offset",
        "value_antiquant_scale", "value_antiquant_offset", "key_shared_prefix",
        "value_shared_prefix", "actual_shared_prefix_len", "query_rope", "key_rope",
        "key_rope_antiquant_scale")),
    Argument("num_heads", 1, int),
    Argument("scale", 1.0, float),
    Argument("pre_tokens", INT_MAX, int),
    Argument("next_tokens", INT_MAX, int),
    Argument("input_layout", "BSH", str),
    Argument("num_key_value_heads", 0, int),
    Argument("sparse_mode", 0, int),
    Argument("inner_precise", 0, int),
    Argument("block_size", 0, int),
    _unimplemented("antiquant_mode", 0, int),
    Argument("softmax_lse_flag", False, bool),
    _unimplemented("key_antiquant_mode", 0, int),
    _unimplemented("value_antiquant_mode", 0, int),
)

#: this package's keywords, after torch_npu's
OWN_ARGUMENTS = (
    Argument("algorithm", None, Optional[str]),
    Argument("beta", None, Optional[float]),
    Argument("backend", "auto", str),
    Argument("rounding_guard", False, bool),
    Argument("q_block", None, Optional[int]),
    Argument("kv_block", None, Optional[int]),
    Argument("repair_overflow", True, bool),
)

KEYWORD_ARGUMENTS = TORCH_NPU_ARGUMENTS + OWN_ARGUMENTS

#: npu_fused_infer_attention_score_v2 (op-plugin's documentation), as data on v1's table:
#: v1's keywords it renames (v2 name -> v1 name); the rest of v1's that it keeps are taken
#: under their own names, and v1's shared-prefix, padding and combined-quantisation ones
#: are dropped (they stay at their v1 defaults)
V2_RENAMES = {"actual_seq_qlen": "actual_seq_lengths", "actual_seq_kvlen": "actual_seq_lengths_kv",
              "num_query_heads": "num_heads", "softmax_scale": "scale",
              "return_softmax_lse": "softmax_lse_flag"}
#: v2's keywords that v1 lacks and pasa_npu implements: they join the argument dict of every
#: call (a v1 call's at these defaults). ``out_dtype``: torch's ScalarType code, or a dtype
V2_EXTENSIONS = (
    Argument("learnable_sink", None, Optional[torch.Tensor], "tensor"),
    Argument("out_dtype", None, Optional[int]),
)
#: v2's other keywords v1 lacks: accepted at their defaults only
V2_UNIMPLEMENTED = (
    *(_unimplemented(name) for name in (
        "dequant_scale_query", "dequant_scale_key", "dequant_offset_key", "dequant_scale_value",
        "dequant_offset_value", "dequant_scale_key_rope", "quant_scale_out", "quant_offset_out",
        "quant_scale_p")),
    *(_unimplemented(name, 0, int) for name in (
        "query_quant_mode", "key_quant_mode", "value_quant_mode")),
    *(_unimplemented(name, None, Optional[int]) for name in (
        "query_dtype", "key_dtype", "value_dtype", "query_rope_dtype", "key_rope_dtype",
        "key_shared_prefix_dtype", "value_shared_prefix_dtype", "dequant_scale_query_dtype",
        "dequant_scale_key_dtype", "dequant_scale_value_dtype", "dequant_scale_key_rope_dtype")),
)
#: v2's keywords in its order, by v2 name
V2_ORDER = (
    "query_rope", "key_rope", "pse_shift", "atten_mask", "actual_seq_qlen", "actual_seq_kvlen",
    "block_table", "dequant_scale_query", "dequant_scale_key", "dequant_offset_key",
    "dequant_scale_value", "dequant_offset_value", "dequant_scale_key_rope", "quant_scale_out",
    "quant_offset_out", "quant_scale_p", "learnable_sink", "num_query_heads",
    "num_key_value_heads", "softmax_scale", "pre_tokens", "next_tokens", "input_layout",
    "sparse_mode", "block_size", "query_quant_mode", "key_quant_mode", "value_quant_mode",
    "inner_precise", "return_softmax_lse", "query_dtype", "key_dtype", "value_dtype",
    "query_rope_dtype", "key_rope_dtype", "key_shared_prefix_dtype", "value_shared_prefix_dtype",
    "dequant_scale_query_dtype", "dequant_scale_key_dtype", "dequant_scale_value_dtype",
    "dequant_scale_key_rope_dtype", "out_dtype",
)
#: torch_npu keywords not implemented here, with the default that means "unused"
UNIMPLEMENTED_KEYWORDS = {a.name: a.default for a in TORCH_NPU_ARGUMENTS
                          if a.kind == "unimplemented"}
OWN_KEYWORDS = tuple(a.name for a in OWN_ARGUMENTS)
_DEFAULTS = {a.name: a.default for a in KEYWORD_ARGUMENTS}
#: the keywords :func:`bind` passes on as they are
_IMPLEMENTED = frozenset(_DEFAULTS).difference(UNIMPLEMENTED_KEYWORDS)


def _v2_row(name: str) -> Argument:
    """v2's keyword ``name``: v1's row (renamed where v2 renames it) or v2's own."""
    own = {a.name: a for a in V2_EXTENSIONS + V2_UNIMPLEMENTED}
    if name in own:
        return own[name]
    row, = (a for a in TORCH_NPU_ARGUMENTS if a.name == V2_RENAMES.get(name, name))
    return dataclasses.replace(row, name=name)


#: npu_fused_infer_attention_score_v2's keywords, in its order, derived from v1's table
V2_ARGUMENTS = tuple(_v2_row(name) for name in V2_ORDER)
#: v2's keywords not implemented here (by v2 name), with the default that means "unused"
V2_UNIMPLEMENTED_KEYWORDS = {a.name: a.default for a in V2_ARGUMENTS if a.kind == "unimplemented"}
_V2_DEFAULTS = {a.name: a.default for a in V2_ARGUMENTS + OWN_ARGUMENTS}
TENSOR_NAMES = ("query", "key", "value")

#: the signature of :func:`pasa_npu.fused_attention` (inspect.signature and help() show it)
SIGNATURE = inspect.Signature(
    [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=torch.Tensor)
     for name in TENSOR_NAMES]
    + [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY, default=a.default,
                         annotation=a.annotation) for a in KEYWORD_ARGUMENTS],
    return_annotation=tuple[torch.Tensor, torch.Tensor])

#: the signature of :func:`pasa_npu.fused_attention_v2`
V2_SIGNATURE = inspect.Signature(
    [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=torch.Tensor)
     for name in TENSOR_NAMES]
    + [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY, default=a.default,
                         annotation=a.annotation) for a in V2_ARGUMENTS + OWN_ARGUMENTS],
    return_annotation=tuple[torch.Tensor, torch.Tensor])


@dataclass(slots=True)
class Call:
    """One call's arguments by name, as given, defaults filled in: the implemented arguments
    of :func:`pasa_npu.fused_attention` and of ``fused_attention_v2`` (under v1's names).
    Unvalidated: the plan (:mod:`pasa_npu.plans`) validates and resolves them, once per
    distinct set. The fields and defaults are the argument table's
    (``tests/api/test_layers.py`` holds them equal)."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    atten_mask: Optional[torch.Tensor] = None
    actual_seq_lengths: Union[Sequence[int], torch.Tensor, None] = None
    actual_seq_lengths_kv: Union[Sequence[int], torch.Tensor, None] = None
    block_table: Optional[torch.Tensor] = None
    num_heads: int = 1
    scale: float = 1.0
    pre_tokens: int = INT_MAX
    next_tokens: int = INT_MAX
    input_layout: str = "BSH"
    num_key_value_heads: int = 0
    sparse_mode: int = 0
    inner_precise: int = 0
    block_size: int = 0
    softmax_lse_flag: bool = False
    algorithm: Optional[str] = None
    beta: Optional[float] = None
    backend: str = "auto"
    rounding_guard: bool = False
    q_block: Optional[int] = None
    kv_block: Optional[int] = None
    repair_overflow: bool = True
    learnable_sink: Optional[torch.Tensor] = None
    out_dtype: Union[int, torch.dtype, None] = None


#: the :class:`Call` fields, in order
CALL_FIELDS = tuple(f.name for f in dataclasses.fields(Call))
#: the length arguments, under v1's names (v2's ``actual_seq_qlen`` and ``actual_seq_kvlen``)
LENGTH_ARGUMENTS = ("actual_seq_lengths", "actual_seq_lengths_kv")
_SCALAR_TYPES = frozenset((int, float, str, bool, type(None)))
_CALL_VALUES = operator.attrgetter(*CALL_FIELDS)
#: each field's default (``dataclasses.MISSING`` for query, key and value): a field that
#: holds its very default object adds nothing to :func:`call_key`
_FIELD_DEFAULTS = tuple(f.default for f in dataclasses.fields(Call))
_FIELD_INDICES = range(len(CALL_FIELDS))
#: how :func:`call_key` fingerprints each field's tensor
_FIELD_ROLES = tuple("input" if name in TENSOR_NAMES else "lengths" if name in LENGTH_ARGUMENTS
                     else "mask" if name == "atten_mask"
                     else "checked" if name in ("learnable_sink", "block_table") else "other"
                     for name in CALL_FIELDS)


def call_key(call: Call):
    """(arguments key, lengths key): a hashable fingerprint of everything a plan reads of
    ``call`` (:func:`pasa_npu.planner.make_plan`), or None where a call is not cacheable
    (a mask of sparse modes 0/1 that is int8 or uint8, whose converted contents the plan
    would hold, or an inference tensor, :func:`mask_key`). The values of the actual sequence lengths go in the second
    key, so that the calls of a decode loop, whose lengths grow every step, share the
    validation of everything else. A field that holds its default object is left out;
    every other one enters with its position and type, so that ``True`` never hits ``1``."""
    values = _CALL_VALUES(call)
    signature = _scalar_signature(call, values)
    if signature is not None:  # the common case, keyed by its signature alone
        return (_SCALAR_KEY, *signature), ()
    key = []
    lengths = []
    append = key.append
    for index in itertools.compress(_FIELD_INDICES, map(operator.is_not, values, _FIELD_DEFAULTS)):
        value = values[index]
        kind = type(value)
        if kind in _SCALAR_TYPES:
            append((index, kind, value))
            continue
        role = _FIELD_ROLES[index]
        if isinstance(value, torch.Tensor):
            if role == "input":
                append(_fingerprint(value))
            elif role == "mask" and plan_holds_mask(call, value):
                held = mask_key(call.sparse_mode, value)
                if held is None:
                    return None
                append((index, *held))
            elif role == "checked":  # read (checked) on every call
                append((index, value.shape, value.dtype, value.device))
            elif role == "lengths" and value.dim() == 1:  # other ranks: validation refuses them
                append((index, value.dtype, value.shape, value.device))
                # a device's stay there (plan_for reads those it does not keep first)
                lengths.append(tuple(value.tolist()) if host_memory(value.device)
                               else "on the device")
            else:
                return None
        elif kind in (list, tuple):
            entries = (tuple(value), tuple(map(type, value)))
            if role == "lengths":
                append((index, kind, len(value)))
                lengths.append((index, entries))
            else:
                append((index, kind, entries))
        else:
            append((index, kind, value))
    keys = (tuple(key), tuple(lengths))
    try:
        hash(keys)
    except TypeError:
        return None
    return keys


#: the first entry of the arguments key of a call of :func:`call_key`'s common case
_SCALAR_KEY = "scalars"


def _scalar_signature(call: Call, values: tuple) -> Optional[tuple]:
    """The key of a call of :func:`call_key`'s common case (tensors as the inputs, scalars
    everywhere else but for a mask, keyed by :func:`mask_key` as the general case keys
    it), ``values`` its field values: (the values after the mask, their types, the inputs'
    fingerprints, the mask's key or None); None for any other call."""
    q, k, v, mask = values[:4]
    after_mask = values[4:]
    kinds = tuple(map(type, after_mask))
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
            and isinstance(v, torch.Tensor) and _SCALAR_TYPES.issuperset(kinds)):
        return None
    held = None
    if mask is not None:
        if not (type(mask) is torch.Tensor and plan_holds_mask(call, mask)):
            return None
        held = mask_key(call.sparse_mode, mask)
        if held is None:
            return None
    return (after_mask, kinds, _fingerprint(q), _fingerprint(k), _fingerprint(v), held)


def signature_of(keys: Optional[tuple]) -> Optional[tuple]:
    """The signature in the :func:`call_key` ``keys`` of a call of its common case, for
    :func:`has_signature`; None for the keys of any other call."""
    if keys is None or keys[0][0] != _SCALAR_KEY:
        return None
    return keys[0][1:]


def has_signature(call: Call, signature: tuple) -> bool:
    """Whether ``call``'s :func:`call_key` holds ``signature`` (:func:`signature_of`),
    checked without building the key: each argument after the mask the same object, or one
    of the same type and value; a mask of the same :func:`mask_key`; inputs of the same
    fingerprints."""
    values = _CALL_VALUES(call)
    after_mask, kinds, q_print, k_print, v_print, held = signature
    rest = values[4:]
    if not all(map(operator.is_, rest, after_mask)):
        # the types first: a tensor is never compared by value, and True is not 1
        if tuple(map(type, rest)) != kinds or rest != after_mask:
            return False
    q, k, v, mask = values[:4]
    if mask is None:
        if held is not None:
            return False
    elif (held is None or type(mask) is not torch.Tensor
          or mask_key(call.sparse_mode, mask) != held):
        return False
    tensor = torch.Tensor
    return (isinstance(q, tensor) and isinstance(k, tensor) and isinstance(v, tensor)
            and _fingerprint(q) == q_print and _fingerprint(k) == k_print
            and _fingerprint(v) == v_print)


def plan_holds_mask(call: Call, mask: torch.Tensor) -> bool:
    """Whether a plan takes ``mask`` as it is, so that its calls are cached
    (:func:`mask_key`): the optimized mask of sparse modes 2-4, which each call checks,
    and bool masks of modes 0/1, which it holds as a view, reading their contents at each
    call. It holds any other mask converted, so their calls are not cached."""
    return call.sparse_mode in (2, 3, 4) or mask.dtype == torch.bool


def mask_key(sparse_mode, mask: torch.Tensor) -> Optional[tuple]:
    """How a plan's key holds its call's mask (:func:`plan_holds_mask`): the optimized mask
    of modes 2-4 by its shape, dtype and device (a plan does not hold it: each call checks
    its contents, remembered per tensor, :func:`pasa_npu.masks.check_optimized_mask`); a
    bool mask of modes 0/1 by :func:`tensor_identity` (the plan holds it, so its id is not
    reused while cached); None for an inference tensor there, which has no version to
    tell its writes: not cached."""
    if sparse_mode in (2, 3, 4):
        return ("optimized", mask.shape, mask.dtype, mask.device)
    return tensor_identity(mask)


def _fingerprint(t: torch.Tensor) -> tuple:
    """What a plan reads of an input tensor: its shape, strides, dtype and device."""
    return t.shape, t.stride(), t.dtype, t.device


def tensor_identity(t: torch.Tensor) -> Optional[tuple]:
    """This very tensor, unchanged since: its id (the caller keeps it alive while the key is
    held, so the id is not reused), storage, in-place version and metadata; None for an
    inference tensor, which has no version counter."""
    if t.is_inference():
        return None
    return (id(t), t.data_ptr(), t._version, t.shape, t.stride(), t.dtype, t.device)


def bind(function: str, query, key, value, keywords: dict) -> Call:
    """A v1 call's :class:`Call`; an unknown keyword is a TypeError, as Python's own binding
    makes it, and an unimplemented one away from its default a NotImplementedError."""
    if keywords.keys() <= _IMPLEMENTED:  # the common case: nothing to refuse
        return Call(query, key, value, **keywords)
    for name in keywords:
        if name not in _DEFAULTS:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")
    given = {}
    for name, value_ in keywords.items():
        if name in UNIMPLEMENTED_KEYWORDS:
            _refuse_unimplemented(name, value_, UNIMPLEMENTED_KEYWORDS[name])
        else:
            given[name] = value_
    return Call(query, key, value, **given)


def bind_v2(function: str, query, key, value, keywords: dict) -> Call:
    """A v2 call's :class:`Call` (v1's names, the v2 extensions): v2's renamed keywords under
    v1's names; unimplemented keywords refused unless at their defaults, as :func:`bind`
    refuses v1's."""
    for name in keywords:
        if name not in _V2_DEFAULTS:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")
    given = {}
    for name, value_ in keywords.items():
        if name in V2_UNIMPLEMENTED_KEYWORDS:
            _refuse_unimplemented(name, value_, V2_UNIMPLEMENTED_KEYWORDS[name])
            continue
        given[V2_RENAMES.get(name, name)] = value_
    if given.get("sparse_mode") == 9:
        raise NotImplementedError("sparse_mode=9 (v2's tree mask, MLA only) is not implemented "
                                  "by pasa_npu yet")
    return Call(query, key, value, **given)


#: v1's names of the keywords v2 renames, in an error message: anywhere but ``scale``,
#: which prose uses too, named only where a message starts with it or sets it
_V1_NAMES = re.compile(r"\b(actual_seq_lengths_kv|actual_seq_lengths|num_heads|softmax_lse_flag)"
                       r"\b|^scale\b|\bscale(?==)")
_V2_NAMES = {v1: v2 for v2, v1 in V2_RENAMES.items()}


def in_v2_names(exc: Exception) -> Exception:
    """``exc``, raised by a v2 call, with the arguments its message names in v2's names (the
    :class:`Call` holds v1's)."""
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (_V1_NAMES.sub(lambda m: _V2_NAMES[m.group(0)], exc.args[0]), *exc.args[1:])
    return exc


def _refuse_unimplemented(name: str, value, unused) -> None:
    if not is_default(value, unused):
        raise NotImplementedError(
            f"{name}={describe(value)} is not implemented by pasa_npu yet "
            f"(only the default {unused!r} is accepted)")


def describe(value) -> str:
    """A short description of an argument for an error message: tensors and arrays by
    type, shape and dtype; other values by repr, cut at 80 characters."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"a {type(value).__module__}.{type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def is_default(value, default) -> bool:
    if default is None:
        return value is None
    return not isinstance(value, torch.Tensor) and value == default


def caller_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning issued by the function calling this one
    to the first frame outside the package: the user's call (a ``fused_attention`` call,
    a plan's run, or their read of the overflow report)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith("pasa_npu"):
        frame, level = frame.f_back, level + 1
    return level
