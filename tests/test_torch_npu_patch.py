"""pasa_npu.patch_torch_npu on CPU, with a stand-in torch_npu module: what is routed to PASA
(and equals pasa_npu.fused_attention with the same arguments), what falls through to the
original operator, the one-time warning naming the argument, the .out form, and restoring."""
from __future__ import annotations

import sys
import types
import warnings

import pytest
import torch

import pasa_npu
from pasa_npu import torch_npu_patch


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
    (dict(block_size=128), "'block_size', which pasa_npu does not implement"),
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
    q, k, v = _qkv()
    mask = torch.zeros(24, 24, dtype=torch.bool)
    pasa_npu.patch_torch_npu(backend="ascendc-emu")
    with pytest.warns(RuntimeWarning, match="explicit atten_mask is not supported"):
        torch_npu.npu_fused_infer_attention_score(q, k, v, atten_mask=mask, **KW)
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


def test_patch_needs_torch_npu(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(ImportError, match="patch_torch_npu needs torch_npu"):
        pasa_npu.patch_torch_npu()
