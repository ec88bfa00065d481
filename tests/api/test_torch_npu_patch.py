"""pasa_npu.patch_torch_npu on CPU, with a stand-in torch_npu module: what is routed to PASA
(and equals pasa_npu.fused_attention with the same arguments), what falls through to the
original operator, the one-time warning naming the argument, the .out form, and restoring;
then every route (v1 and v2, .out with a workspace, the workspace queries, torch.ops.npu
.default and .out, registered in the "npu" namespace with torch.library), counted."""
from __future__ import annotations

import copy
import dataclasses
import sys
import types
import warnings

import pytest
import torch

import pasa_npu
from pasa_npu import backends, plans, torch_npu_patch


class StandInOperator:
    """Plays torch_npu.npu_fused_infer_attention_score: records its calls and returns marker
    tensors (its .out form writes -1 into the outputs)."""

    def __init__(self):
        self.calls = []
        self.out = self._out

    def __call__(self, *args, **kwargs):
        self.calls.append(("call", args, kwargs))
        return torch.full((1,), 7.0), torch.full((1,), 8.0)

    def _out(self, *args, **kwargs):
        self.calls.append(("out", args, kwargs))
        for t in kwargs["out"]:
            t.fill_(-1)
        return tuple(kwargs["out"])


@pytest.fixture
def torch_npu(monkeypatch):
    module = types.ModuleType("torch_npu")
    module.npu_fused_infer_attention_score = StandInOperator()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setattr(torch_npu_patch, "_warned", set())
    yield module
    pasa_npu.unpatch_torch_npu()


def _qkv(seed=0, s=24):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, s, 64, generator=g).half() for _ in range(3)]


KW = dict(num_heads=4, num_key_value_heads=4, input_layout="BSH", scale=0.125,
          actual_seq_lengths=[24, 17], softmax_lse_flag=True)


def test_supported_call_is_routed_and_equals_fused_attention(torch_npu):
    original = torch_npu.npu_fused_infer_attention_score
    q, k, v = _qkv()
    pasa_npu.patch_torch_npu()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, lse = torch_npu.npu_fused_infer_attention_score(q, k, v, **KW)
    want_out, want_lse = pasa_npu.fused_attention(q, k, v, **KW)
    assert original.calls == []
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    assert out.shape == (2, 24, 64) and lse.shape == (2, 4, 24, 1)


def test_patch_options_apply_to_every_routed_call(torch_npu):
    q, k, v = _qkv(1)
    pasa_npu.patch_torch_npu(algorithm="fa-fp32")
    out, _ = torch_npu.npu_fused_infer_attention_score(q, k, v, **KW)
    assert torch.equal(out, pasa_npu.fused_attention(q, k, v, algorithm="fa-fp32", **KW)[0])
    assert not torch.equal(out, pasa_npu.fused_attention(q, k, v, algorithm="pasa", **KW)[0])
    with pytest.raises(TypeError, match="own keywords"):
        pasa_npu.patch_torch_npu(pse_shift=None)


@pytest.mark.parametrize("extra,named", [
    (dict(pse_shift=torch.zeros(1)), "'pse_shift', which pasa_npu does not implement"),
    (dict(antiquant_mode=1), "'antiquant_mode', which pasa_npu does not implement"),
    (dict(sink_tokens=4), "'sink_tokens', which pasa_npu does not know"),
])
def test_unsupported_argument_falls_through_with_one_warning(torch_npu, extra, named):
    original = torch_npu.npu_fused_infer_attention_score
    q, k, v = _qkv()
    pasa_npu.patch_torch_npu()
    with pytest.warns(RuntimeWarning, match=named):
        result = torch_npu.npu_fused_infer_attention_score(q, k, v, **KW, **extra)
    assert float(result[0]) == 7.0
    assert original.calls == [("call", (q, k, v), {**KW, **extra})]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per argument
        torch_npu.npu_fused_infer_attention_score(q, k, v, **KW, **extra)
    assert len(original.calls) == 2


def test_feature_the_backend_lacks_falls_through(torch_npu):
    pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")
    original = torch_npu.npu_fused_infer_attention_score
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 24, 256, generator=g).half() for _ in range(3))
    pasa_npu.patch_torch_npu(backend="ascendc-emu", rounding_guard=True)
    with pytest.warns(RuntimeWarning, match="rounding_guard=True is not supported by the ascendc-emu kernels"):
        torch_npu.npu_fused_infer_attention_score(q, k, v, **KW)
    assert [c[0] for c in original.calls] == ["call"]


def test_out_form_writes_the_given_outputs(torch_npu):
    q, k, v = _qkv(2)
    out, lse = torch.zeros(2, 24, 64, dtype=torch.float16), torch.zeros(2, 4, 24, 1)
    pasa_npu.patch_torch_npu()
    got = torch_npu.npu_fused_infer_attention_score.out(q, k, v, **KW, workspace=torch.empty(8),
                                                        out=[out, lse])
    want_out, want_lse = pasa_npu.fused_attention(q, k, v, **KW)
    assert got[0] is out and got[1] is lse
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    named = torch_npu.npu_fused_infer_attention_score.out(q, k, v, **KW, attention_out=out.zero_(),
                                                          softmax_lse=lse)
    assert named[0] is out and torch.equal(out, want_out)


def test_out_form_falls_through_with_its_outputs(torch_npu):
    original = torch_npu.npu_fused_infer_attention_score
    q, k, v = _qkv()
    out, lse = torch.zeros(2, 24, 64, dtype=torch.float16), torch.zeros(2, 4, 24, 1)
    pasa_npu.patch_torch_npu()
    with pytest.warns(RuntimeWarning, match="pse_shift"):
        torch_npu.npu_fused_infer_attention_score.out(q, k, v, **KW, pse_shift=torch.zeros(1),
                                                      out=[out, lse])
    assert original.calls[0][0] == "out" and original.calls[0][2]["out"] == [out, lse]
    assert bool((out == -1).all())


def test_unpatch_and_context_manager_restore(torch_npu):
    original = torch_npu.npu_fused_infer_attention_score
    pasa_npu.patch_torch_npu()
    assert torch_npu.npu_fused_infer_attention_score is not original
    pasa_npu.patch_torch_npu()  # patching twice keeps the true original underneath
    assert torch_npu.npu_fused_infer_attention_score.original is original
    pasa_npu.unpatch_torch_npu()
    assert torch_npu.npu_fused_infer_attention_score is original
    pasa_npu.unpatch_torch_npu()  # no effect when not patched
    assert torch_npu.npu_fused_infer_attention_score is original

    with pasa_npu.patch_torch_npu(algorithm="pasa") as outer:
        assert torch_npu.npu_fused_infer_attention_score is outer.patched
        with pasa_npu.patch_torch_npu(algorithm="fa-fp32") as inner:
            assert torch_npu.npu_fused_infer_attention_score is inner.patched
        assert torch_npu.npu_fused_infer_attention_score is outer.patched
    assert torch_npu.npu_fused_infer_attention_score is original


@pytest.mark.parametrize("options, error, message", [
    (dict(algorithm="nope"), ValueError, "algorithm must be one of"),
    (dict(backend="gpu"), ValueError, "backend must be one of"),
    (dict(q_block=0), ValueError, "q_block must be >= 1, got 0"),
    (dict(beta=1.5), ValueError, r"beta must lie in \[0, 1\)"),
    (dict(algorithm="fa-fp32", beta=0.5), ValueError, "beta applies to pasa"),
    (dict(repair_overflow="no"), TypeError, "repair_overflow must be a bool"),
])
def test_patch_checks_its_options_before_patching(torch_npu, options, error, message):
    original = torch_npu.npu_fused_infer_attention_score
    with pytest.raises(error, match=f"^patch_torch_npu: {message}"):
        pasa_npu.patch_torch_npu(**options)
    assert torch_npu.npu_fused_infer_attention_score is original


def test_patches_ended_out_of_order_restore_the_original(torch_npu):
    original = torch_npu.npu_fused_infer_attention_score
    first = pasa_npu.patch_torch_npu(algorithm="pasa")
    second = pasa_npu.patch_torch_npu(algorithm="fa-fp32")
    first.__exit__(None, None, None)
    assert torch_npu.npu_fused_infer_attention_score is second.patched
    second.__exit__(None, None, None)
    assert torch_npu.npu_fused_infer_attention_score is original


def test_patched_routes_copy_and_name_what_they_lack(torch_npu):
    del torch_npu.npu_fused_infer_attention_score.out  # an operator with no .out form
    pasa_npu.patch_torch_npu()
    patched = torch_npu.npu_fused_infer_attention_score
    duplicate = copy.copy(patched)
    assert duplicate.original is patched.original and duplicate.options == patched.options
    with pytest.raises(AttributeError, match="no attribute 'schema'"):
        patched.out.schema
    q, k, v = _qkv()
    out, lse = torch.zeros(2, 24, 64, dtype=torch.float16), torch.zeros(2, 4, 24, 1)
    with pytest.warns(RuntimeWarning, match="pse_shift"), \
            pytest.raises(NotImplementedError, match="which has no .out form"):
        patched.out(q, k, v, **KW, pse_shift=torch.zeros(1), out=[out, lse])


def test_patch_needs_torch_npu(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(ImportError, match="patch_torch_npu needs torch_npu"):
        pasa_npu.patch_torch_npu()


# ----------------------------------------------------------------------------- every route
#
# A stand-in torch_npu with v1 and v2, their .out forms, the workspace queries and
# torch.ops.npu operators of both names (.default and .out), registered with torch.library in
# the "npu" namespace itself (no torch_npu here registers it), each recording its calls.

from pasa_npu import arguments  # noqa: E402

_SCHEMA_TYPES = {int: "int", float: "float", str: "str", bool: "bool"}


def _schema_argument(a) -> str:
    if a.kind == "lengths":
        return f"SymInt[]? {a.name}=None"
    if a.kind == "tensor" or (a.kind == "unimplemented" and a.default is None
                              and not a.name.endswith("_dtype")):
        return f"Tensor? {a.name}=None"
    if a.default is None:
        return f"int? {a.name}=None"
    default = f'"{a.default}"' if isinstance(a.default, str) else a.default
    return f"{_SCHEMA_TYPES[type(a.default)]} {a.name}={default}"


def _schemas(name: str, rows) -> tuple[str, str]:
    keywords = ", ".join(_schema_argument(a) for a in rows)
    head = f"Tensor query, Tensor key, Tensor value, *, {keywords}"
    return (f"{name}({head}) -> (Tensor, Tensor)",
            f"{name}.out({head}, Tensor? workspace=None, Tensor(a!) attention_out, "
            f"Tensor(b!) softmax_lse) -> (Tensor(a!), Tensor(b!))")


OP_CALLS: list = []  # (operator, overload) of every call reaching the stand-in operators
_LIBRARY = None


def _register_ops():
    global _LIBRARY
    if _LIBRARY is not None:
        return
    lib = torch.library.Library("npu", "FRAGMENT")
    for name, rows in (("npu_fused_infer_attention_score", arguments.TORCH_NPU_ARGUMENTS),
                       ("npu_fused_infer_attention_score_v2", arguments.V2_ARGUMENTS)):
        default, out = _schemas(name, rows)
        lib.define(default)
        lib.define(out)

        def run(query, key, value, *, _name=name, **kwargs):
            OP_CALLS.append((_name, "default"))
            return torch.full((1,), 7.0), torch.full((1,), 8.0)

        def run_out(query, key, value, *, attention_out, softmax_lse, _name=name, **kwargs):
            OP_CALLS.append((_name, "out"))
            attention_out.fill_(-1)
            return attention_out, softmax_lse

        lib.impl(name, run, "CompositeExplicitAutograd")
        lib.impl(f"{name}.out", run_out, "CompositeExplicitAutograd")
    _LIBRARY = lib


class StandInWorkspaceQuery:
    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append(kwargs)
        return torch.zeros(1024, dtype=torch.uint8)  # the original's (large) workspace


@pytest.fixture
def full_torch_npu(monkeypatch):
    _register_ops()
    module = types.ModuleType("torch_npu")
    module.npu_fused_infer_attention_score = StandInOperator()
    module.npu_fused_infer_attention_score_v2 = StandInOperator()
    module._npu_fused_infer_attention_score_get_max_workspace = StandInWorkspaceQuery()
    module._npu_fused_infer_attention_score_v2_get_max_workspace = StandInWorkspaceQuery()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setattr(torch_npu_patch, "_warned", set())
    torch_npu_patch.reset_routing_counts()
    OP_CALLS.clear()
    yield module
    pasa_npu.unpatch_torch_npu()


KW2 = dict(num_query_heads=4, num_key_value_heads=4, input_layout="BSH", softmax_scale=0.125,
           actual_seq_qlen=[24, 17], return_softmax_lse=True)


def _originals(module):
    names = ("npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2",
             "_npu_fused_infer_attention_score_get_max_workspace",
             "_npu_fused_infer_attention_score_v2_get_max_workspace")
    return ({n: getattr(module, n) for n in names},
            {n: getattr(torch.ops.npu, n) for n in names[:2]})


def test_every_route_reaches_pasa_and_unpatch_restores_all(full_torch_npu):
    module = full_torch_npu
    functions, ops = _originals(module)
    q, k, v = _qkv(3)
    want_out, want_lse = pasa_npu.fused_attention(q, k, v, **KW)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pasa_npu.patch_torch_npu():
            for call in (module.npu_fused_infer_attention_score,
                         torch.ops.npu.npu_fused_infer_attention_score,
                         torch.ops.npu.npu_fused_infer_attention_score.default):
                out, lse = call(q, k, v, **KW)
                assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
            for call in (module.npu_fused_infer_attention_score_v2,
                         torch.ops.npu.npu_fused_infer_attention_score_v2,
                         torch.ops.npu.npu_fused_infer_attention_score_v2.default):
                out, lse = call(q, k, v, **KW2)
                assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
            # graph-capture style: the workspace query, then .out with that workspace
            for function, kw in ((module.npu_fused_infer_attention_score, KW),
                                 (module.npu_fused_infer_attention_score_v2, KW2)):
                query = getattr(module, f"_{function.version.name}_get_max_workspace")
                workspace = query(query=q, key=k, value=v, **kw)
                assert workspace.numel() == 0  # PASA needs none
                out, lse = torch.zeros_like(want_out), torch.zeros_like(want_lse)
                function.out(query=q, key=k, value=v, **kw, workspace=workspace, out=[out, lse])
                assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
                op = getattr(torch.ops.npu, function.version.name)
                out.zero_()
                op.out(q, k, v, **kw, workspace=workspace, attention_out=out, softmax_lse=lse)
                assert torch.equal(out, want_out)
    counts = torch_npu_patch.routing_counts()
    assert all(c == {"pasa": 1} for c in counts.values()), counts
    assert len(counts) == 12  # 2 versions x (function, .out, query, packet, .default, op .out)
    assert OP_CALLS == [] and all(not f.calls for f in functions.values())
    # restored, each route
    assert _originals(module) == (functions, ops)


def test_v2_unsupported_arguments_fall_through_on_every_route(full_torch_npu, monkeypatch):
    module = full_torch_npu
    q, k, v = _qkv(4)
    out, lse = torch.zeros(2, 24, 64, dtype=torch.float16), torch.zeros(2, 4, 24, 1)
    sink = torch.zeros(4)
    # a backend without sinks: ascendc-emu's entry with its sinks flag off (every registered
    # backend computes them), no plan made with the real entry
    monkeypatch.setitem(backends.BACKENDS, "ascendc-emu",
                        dataclasses.replace(backends.BACKENDS["ascendc-emu"], sinks=False))
    monkeypatch.setattr(plans, "PLANS", {})
    pasa_npu.patch_torch_npu(backend="ascendc-emu")
    v2 = module.npu_fused_infer_attention_score_v2
    with pytest.warns(RuntimeWarning, match="'query_quant_mode', which pasa_npu does not"):
        assert float(v2(q, k, v, **KW2, query_quant_mode=3)[0]) == 7.0
    with pytest.warns(RuntimeWarning, match="learnable_sink"):
        v2(q.view(48, 4, 16), k.view(48, 4, 16), v.view(48, 4, 16),
           **dict(KW2, input_layout="TND", actual_seq_qlen=[24, 48], actual_seq_kvlen=[24, 48]),
           learnable_sink=sink)
    with pytest.warns(RuntimeWarning, match="'dequant_scale_key'"):
        torch.ops.npu.npu_fused_infer_attention_score_v2(q, k, v, **KW2,
                                                         dequant_scale_key=torch.ones(1))
    with pytest.warns(RuntimeWarning, match="'pse_shift'"):
        torch.ops.npu.npu_fused_infer_attention_score.out(
            q, k, v, **KW, pse_shift=torch.zeros(1), attention_out=out, softmax_lse=lse)
    assert bool((out == -1).all())
    # a workspace query PASA would take, then a .out PASA's backend refuses: the original
    # gets the original's workspace, not PASA's empty one
    tnd = dict(KW2, input_layout="TND", actual_seq_qlen=[24, 48], actual_seq_kvlen=[24, 48])
    q3, k3, v3 = (t.view(48, 4, 16) for t in (q, k, v))
    workspace = module._npu_fused_infer_attention_score_v2_get_max_workspace(
        q3, k3, v3, **tnd, learnable_sink=sink)
    assert workspace.numel() == 0
    with pytest.warns(RuntimeWarning, match="learnable_sink is not implemented by backend"):
        v2.out(q3, k3, v3, **tnd, learnable_sink=sink, workspace=workspace,
               out=[torch.zeros(48, 4, 16, dtype=torch.float16), torch.zeros(48, 4, 1)])
    assert v2.original.calls[-1][2]["workspace"].numel() == 1024
    counts = torch_npu_patch.routing_counts()
    assert counts["torch_npu.npu_fused_infer_attention_score_v2"] == {"original": 2}
    assert counts["torch.ops.npu.npu_fused_infer_attention_score_v2"] == {"original": 1}
    assert counts["torch.ops.npu.npu_fused_infer_attention_score.out"] == {"original": 1}
    assert OP_CALLS == [("npu_fused_infer_attention_score_v2", "default"),
                        ("npu_fused_infer_attention_score", "out")]
