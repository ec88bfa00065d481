"""Drop-in routing of torch_npu's fused infer attention to PASA, for code that calls torch_npu
directly (vllm-ascend's attention backends, MindIE, user code).

:func:`patch_torch_npu` replaces, where torch_npu has them:

* ``torch_npu.npu_fused_infer_attention_score`` (v1) and ``..._v2``, with their ``.out`` forms
  (which write ``out=(attention_out, softmax_lse)`` or the two named outputs and take a
  ``workspace`` PASA does not need): they run :func:`pasa_npu.fused_attention` /
  :func:`pasa_npu.fused_attention_v2` with the same arguments;
* the workspace-size queries that go with the ``.out`` forms under graph capture,
  ``torch_npu._npu_fused_infer_attention_score_get_max_workspace`` and ``..._v2_...``: for a
  call PASA takes they return an empty workspace (PASA allocates none);
* the operator overloads callers reach directly, ``torch.ops.npu.npu_fused_infer_attention_score``
  and ``..._v2`` (the packet, ``.default`` and ``.out``), replaced on the ``torch.ops.npu``
  namespace. Code holding an overload object from before the patch (or a graph captured with
  it) still reaches the original.

A call with an argument pasa_npu does not implement, or one the chosen backend refuses
(``NotImplementedError``, e.g. ``learnable_sink`` off the torch backend) or that finds the
backend unbuilt (``ImportError``), goes to the original operator instead, with a warning
naming the argument or the feature, once per distinct reason; a ``.out`` call that falls
through with a workspace from the patched query gets the original's workspace first.
:func:`unpatch_torch_npu` (or leaving the context manager) restores every route;
:func:`routing_counts` says how many calls each route sent to PASA and to the original.
"""
from __future__ import annotations

import collections
import importlib
import inspect
import warnings
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .api import fused_attention, fused_attention_v2
from .arguments import (OWN_KEYWORDS, UNIMPLEMENTED_KEYWORDS, V2_UNIMPLEMENTED_KEYWORDS,
                        is_default)
from .planner import check_own_options

NAME = "npu_fused_infer_attention_score"
#: the torch.ops namespace torch_npu registers its operators in
OPS_NAMESPACE = "npu"
_TENSORS = ("query", "key", "value")
#: the ``.out`` form's outputs and its scratch buffer (PASA allocates its own)
_OUT_KEYWORDS = ("attention_out", "softmax_lse", "out", "workspace")


def _torch_npu_keywords(function) -> frozenset:
    return frozenset(name for name in inspect.signature(function).parameters
                     if name not in OWN_KEYWORDS and name not in _TENSORS)


@dataclass(frozen=True)
class Version:
    """One of torch_npu's fused infer attention interfaces: its names and what runs it."""

    name: str                    # the torch_npu function (and torch.ops.npu operator)
    workspace_query: str         # the torch_npu function returning its .out's workspace
    run: Callable                # pasa_npu's drop-in
    keywords: frozenset          # torch_npu's keywords
    unimplemented: dict          # keyword -> the default that means unused
    lse_flag: str                # the keyword that asks for the LSE


VERSIONS = (
    Version(NAME, f"_{NAME}_get_max_workspace", fused_attention,
            _torch_npu_keywords(fused_attention), UNIMPLEMENTED_KEYWORDS, "softmax_lse_flag"),
    Version(f"{NAME}_v2", f"_{NAME}_v2_get_max_workspace", fused_attention_v2,
            _torch_npu_keywords(fused_attention_v2), V2_UNIMPLEMENTED_KEYWORDS,
            "return_softmax_lse"),
)

_warned: set[str] = set()
#: route -> {"pasa": calls PASA computed, "original": calls that fell through}
_counts: dict = collections.defaultdict(collections.Counter)
#: the workspaces the patched queries handed out (empty tensors): id -> weak reference
_pasa_workspaces: dict = {}


def _is_pasa_workspace(workspace) -> bool:
    ref = _pasa_workspaces.get(id(workspace))
    return ref is not None and ref() is workspace


def routing_counts() -> dict:
    """{route: {"pasa": n, "original": m}} since the process started (or
    :func:`reset_routing_counts`): how many calls each patched route computed with PASA and
    how many it handed to torch_npu's original."""
    return {route: dict(counter) for route, counter in _counts.items()}


def reset_routing_counts() -> None:
    _counts.clear()


def _torch_npu():
    try:
        return importlib.import_module("torch_npu")
    except ImportError as exc:
        raise ImportError(f"patch_torch_npu needs torch_npu: {exc}") from exc


def _fall_through_reason(version: Version, args: tuple, kwargs: dict) -> Optional[str]:
    """Why pasa_npu cannot take this call as it stands (before running it), or None."""
    if len(args) > len(_TENSORS) or any(n not in kwargs for n in _TENSORS[len(args):]):
        return "arguments other than query, key and value by position, the rest by keyword"
    for name, value in kwargs.items():
        if name in _TENSORS:
            continue
        if name not in version.keywords:
            return f"argument {name!r}, which pasa_npu does not know"
        if name in version.unimplemented and not is_default(value, version.unimplemented[name]):
            return f"argument {name!r}, which pasa_npu does not implement"
    return None


def _warn_once(reason: str, route: str) -> None:
    key = f"{route}: {reason}"
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"pasa_npu.patch_torch_npu: a call of {route} with {reason} goes to the "
                      f"original (warned once)", RuntimeWarning, stacklevel=4)


class _Forwarding:
    """Forwards the attributes it lacks (an operator's overloads, schema, ...) to
    ``original``; its own and the special names are never forwarded (``copy`` and pickling
    look those up before ``__init__`` has run)."""

    def __getattr__(self, name):
        if name.startswith("__") or name in ("original", "_original", "patched"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        original = self.original
        if original is None:
            raise AttributeError(f"{self.route_name}: torch_npu's operator has no such form, "
                                 f"so no attribute {name!r}")
        return getattr(original, name)


class PatchedFusedInferAttentionScore(_Forwarding):
    """What a patched route is: PASA for the calls it supports, the original for the rest.
    ``.out`` and ``.default`` as the original's (a torch.ops packet's overloads when
    ``original`` is one)."""

    def __init__(self, original, options: dict, version: Version = VERSIONS[0],
                 route: Optional[str] = None):
        self.original = original
        self.options = dict(options)
        self.version = version
        self.route_name = route or f"torch_npu.{version.name}"
        packet = isinstance(original, torch._ops.OpOverloadPacket)
        self.default = (_PatchedOverload(self, original.default, f"{self.route_name}.default")
                        if packet and hasattr(original, "default") else self)
        self.out = _PatchedOut(self, getattr(original, "out", None) if packet else None)

    def route(self, args: tuple, kwargs: dict, counted: str):
        """(out, lse) from PASA, or None after warning when the call must fall through."""
        reason = _fall_through_reason(self.version, args, kwargs)
        if reason is None:
            try:
                result = self.version.run(*args, **kwargs, **self.options)
            except NotImplementedError as exc:
                reason = f"a feature the backend lacks ({exc})"
            except ImportError as exc:
                reason = f"no usable backend ({exc})"
            else:
                _counts[counted]["pasa"] += 1
                return result
        _warn_once(reason, counted)
        _counts[counted]["original"] += 1
        return None

    def __call__(self, *args, **kwargs):
        routed = self.route(args, kwargs, self.route_name)
        return routed if routed is not None else self.original(*args, **kwargs)


class _PatchedOverload(_Forwarding):
    """A torch.ops packet's ``.default`` overload while patched."""

    def __init__(self, patched: PatchedFusedInferAttentionScore, original, route: str):
        self.patched, self.original, self.route_name = patched, original, route

    def __call__(self, *args, **kwargs):
        routed = self.patched.route(args, kwargs, self.route_name)
        return routed if routed is not None else self.original(*args, **kwargs)


class _PatchedOut(_Forwarding):
    """The ``.out`` form: writes into ``out=(attention_out, softmax_lse)`` (or the two named
    arguments) and returns them; ``workspace`` is not needed by PASA and is ignored."""

    def __init__(self, patched: PatchedFusedInferAttentionScore, original=None):
        self.patched = patched
        self._original = original
        self.route_name = f"{patched.route_name}.out"

    @property
    def original(self):
        """torch_npu's ``.out``, None where its operator has none."""
        if self._original is not None:
            return self._original
        return getattr(self.patched.original, "out", None)

    def __call__(self, *args, **kwargs):
        given = {k: kwargs.pop(k) for k in _OUT_KEYWORDS if k in kwargs}
        outs = given.get("out") or (given.get("attention_out"), given.get("softmax_lse"))
        if len(outs) != 2 or any(t is None for t in outs):
            raise TypeError(f"{self.patched.version.name}.out takes its outputs as "
                            f"out=(attention_out, softmax_lse) or as attention_out= and "
                            f"softmax_lse=")
        routed = self.patched.route(args, kwargs, self.route_name)
        if routed is None:
            if self.original is None:
                raise NotImplementedError(f"{self.route_name}: this call goes to torch_npu's "
                                          f"operator (warned), which has no .out form")
            workspace = given.get("workspace")
            if workspace is not None and _is_pasa_workspace(workspace):
                # the patched query handed out PASA's empty workspace: the original needs its own
                given["workspace"] = _original_workspace(self.patched.version, args, kwargs)
            return self.original(*args, **kwargs, **given)
        attention_out, softmax_lse = outs
        attention_out.copy_(routed[0])
        if kwargs.get(self.patched.version.lse_flag, False):
            softmax_lse.copy_(routed[1])
        return attention_out, softmax_lse


#: the workspace queries' originals while patched: Version.name -> original
_workspace_originals: dict = {}


def _original_workspace(version: Version, args: tuple, kwargs: dict):
    return _workspace_originals[version.name](*args, **kwargs)


class PatchedWorkspaceQuery(_Forwarding):
    """What ``torch_npu._npu_fused_infer_attention_score[_v2]_get_max_workspace`` is while
    patched: an empty workspace for a call PASA would take (PASA needs none), the original's
    for the rest."""

    def __init__(self, original, version: Version):
        self.original, self.version = original, version
        self.route_name = f"torch_npu.{version.workspace_query}"

    def __call__(self, *args, **kwargs):
        reason = _fall_through_reason(self.version, args, kwargs)
        if reason is not None:
            _warn_once(reason, self.route_name)
            _counts[self.route_name]["original"] += 1
            return self.original(*args, **kwargs)
        query = args[0] if args else kwargs["query"]
        workspace = torch.empty(0, dtype=torch.uint8, device=query.device)
        key = id(workspace)
        _pasa_workspaces[key] = weakref.ref(workspace, lambda _: _pasa_workspaces.pop(key, None))
        _counts[self.route_name]["pasa"] += 1
        return workspace


_PATCHED_TYPES = (PatchedFusedInferAttentionScore, PatchedWorkspaceQuery)
#: patched route -> what it replaced, for the patches whose context has ended
_retired = weakref.WeakKeyDictionary()


class TorchNpuPatch:
    """The effect of one :func:`patch_torch_npu`: every route it replaced, as
    (owner, attribute, previous, patched). As a context manager, restores on exit what each
    was before it. ``patched``: the v1 function's replacement."""

    def __init__(self, module, replaced: list):
        self.module, self.replaced = module, replaced
        self.patched = next((p for owner, name, _, p in replaced
                             if name == NAME and owner is module), None)

    def __enter__(self) -> "TorchNpuPatch":
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, previous, patched in reversed(self.replaced):
            _retired[patched] = previous
            if getattr(owner, name, None) is patched:
                # an earlier patch may have ended first: restore what it had replaced
                while isinstance(previous, _PATCHED_TYPES) and previous in _retired:
                    previous = _retired[previous]
                setattr(owner, name, previous)


def _ops_namespace():
    return getattr(torch.ops, OPS_NAMESPACE)


def _has_op(namespace, name: str) -> bool:
    try:
        return isinstance(getattr(namespace, name), (torch._ops.OpOverloadPacket,
                                                     PatchedFusedInferAttentionScore))
    except (AttributeError, RuntimeError):
        return False


def _underlying(current):
    return current.original if isinstance(current, _PATCHED_TYPES) else current


def patch_torch_npu(**options) -> TorchNpuPatch:
    """Route torch_npu's fused infer attention (v1 and v2, their ``.out`` forms, the
    workspace queries that go with them, and the ``torch.ops.npu`` overloads) to
    :func:`pasa_npu.fused_attention` / :func:`pasa_npu.fused_attention_v2`. ``options``:
    pasa_npu's own keywords (``algorithm``, ``beta``, ``backend``, ``rounding_guard``,
    ``q_block``, ``kv_block``, ``repair_overflow``) for every routed call. Usable as a
    context manager. ImportError without torch_npu."""
    unknown = sorted(set(options) - set(OWN_KEYWORDS))
    if unknown:
        raise TypeError(f"patch_torch_npu takes pasa_npu's own keywords {OWN_KEYWORDS}, got {unknown}")
    try:
        check_own_options(options)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"patch_torch_npu: {exc}") from None
    module = _torch_npu()
    namespace = _ops_namespace()
    replaced = []
    for version in VERSIONS:
        if hasattr(module, version.name):
            previous = getattr(module, version.name)
            patched = PatchedFusedInferAttentionScore(_underlying(previous), options, version)
            setattr(module, version.name, patched)
            replaced.append((module, version.name, previous, patched))
        if hasattr(module, version.workspace_query):
            previous = getattr(module, version.workspace_query)
            original = _underlying(previous)
            patched = PatchedWorkspaceQuery(original, version)
            _workspace_originals[version.name] = original
            setattr(module, version.workspace_query, patched)
            replaced.append((module, version.workspace_query, previous, patched))
        if _has_op(namespace, version.name):
            previous = getattr(namespace, version.name)
            patched = PatchedFusedInferAttentionScore(
                _underlying(previous), options, version,
                route=f"torch.ops.{OPS_NAMESPACE}.{version.name}")
            setattr(namespace, version.name, patched)
            replaced.append((namespace, version.name, previous, patched))
    return TorchNpuPatch(module, replaced)


def unpatch_torch_npu() -> None:
    """Restore torch_npu's own operators on every route (no effect where not patched)."""
    module = _torch_npu()
    namespace = _ops_namespace()
    for version in VERSIONS:
        for owner, name in ((module, version.name), (module, version.workspace_query),
                            (namespace, version.name)):
            current = getattr(owner, name, None) if owner is module else (
                getattr(owner, name) if _has_op(owner, name) else None)
            if isinstance(current, _PATCHED_TYPES):
                setattr(owner, name, current.original)
