"""Drop-in routing of ``torch_npu.npu_fused_infer_attention_score`` to PASA, for code that
calls torch_npu directly (vllm-ascend's attention backends, MindIE, user code).

:func:`patch_torch_npu` replaces the ``torch_npu`` module's attribute (and with it the
``.out`` form) by a function that runs :func:`pasa_npu.fused_attention` with the same
arguments. A call with an argument pasa_npu does not implement, or one the chosen backend
refuses (``NotImplementedError``, e.g. an explicit mask on the npu kernels) or that finds the
backend unbuilt (``ImportError``), goes to the original operator instead, with a warning
naming the argument or the feature, once per distinct reason. :func:`unpatch_torch_npu`
restores the original. Calls through ``torch.ops.npu`` are not routed.
"""
from __future__ import annotations

import importlib
import inspect
import warnings
from typing import Optional

import torch

from .api import fused_attention
from .arguments import OWN_KEYWORDS, UNIMPLEMENTED_KEYWORDS, is_default

NAME = "npu_fused_infer_attention_score"
_TENSORS = ("query", "key", "value")
#: torch_npu's keywords (those of fused_attention that are not pasa_npu's own)
_TORCH_NPU_KEYWORDS = frozenset(name for name in inspect.signature(fused_attention).parameters
                                if name not in OWN_KEYWORDS)
#: the ``.out`` form's outputs and its scratch buffer (PASA allocates its own)
_OUT_KEYWORDS = ("attention_out", "softmax_lse", "out", "workspace")

_warned: set[str] = set()


def _torch_npu():
    try:
        return importlib.import_module("torch_npu")
    except ImportError as exc:
        raise ImportError(f"patch_torch_npu needs torch_npu: {exc}") from exc


def _fall_through_reason(args: tuple, kwargs: dict) -> Optional[str]:
    """Why pasa_npu cannot take this call as it stands (before running it), or None."""
    if len(args) > len(_TENSORS) or any(n not in kwargs for n in _TENSORS[len(args):]):
        return "arguments other than query, key and value by position, the rest by keyword"
    for name, value in kwargs.items():
        if name not in _TORCH_NPU_KEYWORDS:
            return f"argument {name!r}, which pasa_npu does not know"
        if name in UNIMPLEMENTED_KEYWORDS and not is_default(value, UNIMPLEMENTED_KEYWORDS[name]):
            return f"argument {name!r}, which pasa_npu does not implement"
    return None


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"pasa_npu.patch_torch_npu: a call with {reason} goes to the original "
                      f"torch_npu.{NAME} (warned once)", RuntimeWarning, stacklevel=4)


class PatchedFusedInferAttentionScore:
    """What ``torch_npu.npu_fused_infer_attention_score`` is while patched: PASA for the calls
    it supports, the original for the rest. ``.out`` and ``.default`` as torch_npu's."""

    def __init__(self, original, options: dict):
        self.original = original
        self.options = dict(options)
        self.default = self
        self.out = _PatchedOut(self)

    def route(self, args: tuple, kwargs: dict):
        """(out, lse) from PASA, or None after warning when the call must fall through."""
        reason = _fall_through_reason(args, kwargs)
        if reason is None:
            try:
                return fused_attention(*args, **kwargs, **self.options)
            except NotImplementedError as exc:
                reason = f"a feature the backend lacks ({exc})"
            except ImportError as exc:
                reason = f"no usable backend ({exc})"
        _warn_once(reason)
        return None

    def __call__(self, *args, **kwargs):
        routed = self.route(args, kwargs)
        return routed if routed is not None else self.original(*args, **kwargs)

    def __getattr__(self, name):  # the operator's other attributes (overloads, schema, ...)
        return getattr(self.original, name)


class _PatchedOut:
    """The ``.out`` form: writes into ``out=(attention_out, softmax_lse)`` (or the two named
    arguments) and returns them; ``workspace`` is not needed by PASA and is ignored."""

    def __init__(self, patched: PatchedFusedInferAttentionScore):
        self.patched = patched

    def __call__(self, *args, **kwargs):
        given = {k: kwargs.pop(k) for k in _OUT_KEYWORDS if k in kwargs}
        outs = given.get("out") or (given.get("attention_out"), given.get("softmax_lse"))
        if len(outs) != 2 or any(t is None for t in outs):
            raise TypeError(f"{NAME}.out takes its outputs as out=(attention_out, softmax_lse) "
                            f"or as attention_out= and softmax_lse=")
        routed = self.patched.route(args, kwargs)
        if routed is None:
            return self.patched.original.out(*args, **kwargs, **given)
        attention_out, softmax_lse = outs
        attention_out.copy_(routed[0])
        if kwargs.get("softmax_lse_flag", False):
            softmax_lse.copy_(routed[1])
        return attention_out, softmax_lse

    def __getattr__(self, name):
        return getattr(self.patched.original.out, name)


class TorchNpuPatch:
    """The effect of one :func:`patch_torch_npu`; as a context manager, restores on exit what
    the attribute was before it."""

    def __init__(self, module, previous, patched):
        self.module, self.previous, self.patched = module, previous, patched

    def __enter__(self) -> "TorchNpuPatch":
        return self

    def __exit__(self, *exc) -> None:
        if getattr(self.module, NAME) is self.patched:
            setattr(self.module, NAME, self.previous)


def patch_torch_npu(**options) -> TorchNpuPatch:
    """Route ``torch_npu.npu_fused_infer_attention_score`` (and ``.out``) to
    :func:`pasa_npu.fused_attention`. ``options``: pasa_npu's own keywords (``algorithm``,
    ``beta``, ``backend``, ``rounding_guard``, ``q_block``, ``kv_block``) for every routed
    call. Usable as a context manager. ImportError without torch_npu."""
    unknown = sorted(set(options) - set(OWN_KEYWORDS))
    if unknown:
        raise TypeError(f"patch_torch_npu takes pasa_npu's own keywords {OWN_KEYWORDS}, got {unknown}")
    module = _torch_npu()
    previous = getattr(module, NAME)
    original = previous.original if isinstance(previous, PatchedFusedInferAttentionScore) else previous
    patched = PatchedFusedInferAttentionScore(original, options)
    setattr(module, NAME, patched)
    return TorchNpuPatch(module, previous, patched)


def unpatch_torch_npu() -> None:
    """Restore torch_npu's own operator (no effect when it is not patched)."""
    module = _torch_npu()
    current = getattr(module, NAME)
    if isinstance(current, PatchedFusedInferAttentionScore):
        setattr(module, NAME, current.original)
