"""The layer the Hugging Face integrations share (pasa_npu.integrations._attention): SDPA's
mask convention turned into pasa_npu's, and its attention call, against an independent fp64
attention. Runs on the GPU (default backend: Triton) when there is one."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from _support import BACKENDS, DEVICE_OF, assert_measured, naive_attention, skip_unsupported
from pasa_npu.integrations._attention import attend, masked_positions

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _biased(batch, heads, kv_heads, s_q, s_kv, d=64, bias=96.0, seed=0, device=DEVICE):
    """fp16 (B, N, S, D) query, key, value whose Q and K share a large pattern on 8 dims:
    every q . k carries 8 * bias^2, which softmax cancels."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, s_q, d, generator=g)
    k = torch.randn(batch, kv_heads, s_kv, d, generator=g)
    v = torch.randn(batch, kv_heads, s_kv, d, generator=g)
    pattern = bias * torch.tensor([(-1.0) ** i for i in range(8)])
    q[..., :8] = pattern
    k[..., :8] = pattern
    return (t.half().to(device) for t in (q, k, v))


def _error(out_bsnd, q, k, v, visible, scale):
    ref = naive_attention(q.cpu(), k.cpu(), v.cpu(), scale, visible.cpu(),
                          empty_rows_mean_v=False)
    return float((out_bsnd.transpose(1, 2).double().cpu() - ref).abs().max())


#: the integration tests' bounds: this factor times the largest max-abs error measured
#: (tests/measured.json, kind "integration", keyed by the device the default backend runs on)
FACTOR = 2.0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa"])
@pytest.mark.parametrize("s_kv", [3, 37, 128, 200])
def test_large_shared_bias_with_any_key_count(algorithm, s_kv, backend):
    """Keys sharing a bias that overflows fp16 scores, at key counts that leave the last kv
    block part-filled (3, 37, 200) or full (128): the output is the fp64 attention's (every
    backend shifts a part-filled block by its own keys' mean)."""
    device = DEVICE_OF[backend]
    q, k, v = _biased(2, 4, 2, 5, s_kv, device=device)
    with skip_unsupported(backend):
        out = attend(q, k, v, layout="BNSD", masked=None, causal=False, scale=0.125,
                     algorithm=algorithm, backend=backend)
    visible = torch.ones(1, 5, s_kv, dtype=torch.bool)
    assert_measured(_error(out, q, k, v, visible, 0.125), "integration",
                    f"{device}/shared-bias/{backend}/{algorithm}", FACTOR, f"{s_kv} keys")


def test_fp16_scores_overflow_on_the_same_inputs():
    """The inputs above are hard: fa-fp16s (fp16 scores) gives non-finite output."""
    q, k, v = _biased(1, 2, 2, 5, 37)
    out = attend(q, k, v, layout="BNSD", masked=None, causal=False, scale=0.125,
                 algorithm="fa-fp16s", backend="auto")
    assert not torch.isfinite(out).all()


@pytest.mark.parametrize("backend,layout", [(b, "BNSD") for b in BACKENDS] + [("torch", "BSND")])
@pytest.mark.parametrize("s_q,s_kv", [(9, 9), (1, 21), (6, 140)])
def test_causal_and_masks_with_gqa(backend, layout, s_q, s_kv):
    """Upper-left causal (SDPA's is_causal) combined with a per-batch key mask, GQA 4:2, in
    both layouts, on every backend; the row that sees no key returns 0."""
    device = DEVICE_OF[backend]
    q, k, v = _biased(2, 4, 2, s_q, s_kv, seed=1, device=device)
    key_mask = torch.zeros(2, 1, s_kv, dtype=torch.bool, device=device)
    key_mask[1, :, :3] = True   # batch 1: its first three keys are padding
    causal = torch.ones(s_q, s_kv, dtype=torch.bool, device=device).triu(1)
    for masked, is_causal in ((None, True), (key_mask, True), (key_mask, False)):
        args = (q, k, v) if layout == "BNSD" else (t.transpose(1, 2) for t in (q, k, v))
        with skip_unsupported(backend):
            out = attend(*args, layout=layout, masked=masked, causal=is_causal, scale=0.125,
                         algorithm="pasa-exact", backend=backend)
        hidden = torch.zeros(2, s_q, s_kv, dtype=torch.bool, device=device)
        if masked is not None:
            hidden = hidden | masked
        if is_causal:
            hidden = hidden | causal
        assert out.shape == (2, s_q, 4, 64)
        assert_measured(_error(out, q, k, v, ~hidden, 0.125), "integration",
                        f"{device}/masks-gqa/{backend}",
                        FACTOR, f"{layout} {s_q}x{s_kv}")
        empty = hidden.all(-1)
        assert (out.transpose(1, 2)[empty[:, None].expand(-1, 4, -1)] == 0).all()


def _sink_golden(q, k, v, visible, scale, sink):
    """fp64 attention whose softmax has one more column per head, the sink's logit, with a
    zero value (gpt-oss's eager attention, in fp64); (B, N, S1, Dv)."""
    q, k, v = q.double().cpu(), k.double().cpu(), v.double().cpu()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~visible.cpu()[:, None], -torch.inf)
    column = sink.double().cpu()[None, :, None, None].expand(*s.shape[:3], 1)
    return torch.softmax(torch.cat([s, column], -1), -1)[..., :-1] @ v


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("s_q,s_kv", [(9, 9), (1, 21), (6, 140)])
def test_sinks_from_the_lse(backend, s_q, s_kv, monkeypatch):
    """Sinks (one logit per query head) with a key mask, GQA 4:2, causal attention in
    prefill and a row that sees no key in decode, against fp64 attention with the sink as a
    softmax column. attend
    scales the operator's output by σ(LSE − sink); so its error is at most the operator's
    own (σ <= 1), plus its LSE's error times |out| / 4 (σ's slope), plus one more fp16
    rounding (2^-11 of |out|): each term measured on the operator's output in this run."""
    from pasa_npu.integrations import _attention

    device = DEVICE_OF[backend]
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, n, s, 64, generator=g).half().to(device)
               for n, s in ((4, s_q), (2, s_kv), (2, s_kv)))
    sink = torch.tensor([-2.0, 0.5, 3.0, 6.0], device=device)
    key_mask = torch.zeros(2, 1, s_kv, dtype=torch.bool, device=device)
    key_mask[1, :, :3] = True
    causal = s_q > 1
    key_mask[0, :, :] = not causal  # decode: batch 0's row sees no key
    hidden = key_mask | torch.ones(s_q, s_kv, dtype=torch.bool, device=device).triu(1) * causal
    inner = []

    def spy(*args, **kw):
        inner.append(_attention_call(*args, **kw))
        return inner[-1]

    _attention_call = _attention.fused_attention
    monkeypatch.setattr(_attention, "fused_attention", spy)
    with skip_unsupported(backend):
        out = attend(q, k, v, layout="BNSD", masked=key_mask, causal=causal, scale=0.125,
                     algorithm="pasa-exact", backend=backend, sink=sink)
    (plain, lse), = inner
    plain, lse = plain.transpose(1, 2).double().cpu(), lse[..., 0].double().cpu()
    visible = ~hidden
    gold = _sink_golden(q, k, v, visible, 0.125, sink)
    gold_plain = naive_attention(q.cpu(), k.cpu(), v.cpu(), 0.125, visible.cpu(),
                                 empty_rows_mean_v=False)
    seen = visible.any(-1).cpu()[:, None].expand(-1, 4, -1)   # (B, N, S1): rows seeing a key
    scores = (q.double().cpu() @ k.double().cpu().repeat_interleave(2, 1).transpose(-1, -2)
              * 0.125).masked_fill(~visible.cpu()[:, None], -torch.inf)
    lse_error = float((lse - torch.logsumexp(scores, -1))[seen].abs().max())
    bound = (float((plain - gold_plain)[seen].abs().max())
             + lse_error / 4 * float(gold_plain.abs().max())
             + 2.0 ** -11 * float(gold.abs().max())) * 1.01
    out = out.transpose(1, 2).double().cpu()
    assert float((out - gold)[seen].abs().max()) <= bound
    assert (out[~seen] == 0).all()
    assert float((gold - gold_plain)[seen].abs().max()) > 10 * bound  # the sinks matter


def test_sinks_are_checked():
    q = torch.randn(1, 2, 3, 16).half()
    call = dict(layout="BNSD", masked=None, causal=False, scale=0.25, algorithm="pasa-exact",
                backend="torch")
    with pytest.raises(ValueError, match=r"attention sinks must have shape \(2,\), one logit"):
        attend(q, q, q, sink=torch.zeros(1, 2, 3, 1), **call)
    with pytest.raises(TypeError, match="attention sinks must be a float16, bfloat16 or float32"):
        attend(q, q, q, sink=torch.zeros(2, dtype=torch.int32), **call)
    with pytest.raises(NotImplementedError, match="forward only"):
        attend(q, q, q, sink=torch.zeros(2).requires_grad_(), **call)
    with torch.no_grad():   # a model's sinks are parameters: fine without gradients
        attend(q, q, q, sink=torch.zeros(2).requires_grad_(), **call)


def test_masked_positions_conventions():
    """SDPA's bool mask (True attends) and additive masks with diffusers' and transformers'
    fills, in every broadcastable shape, become True = masked."""
    keep = torch.tensor([[True, True, False], [True, False, False]])   # (B=2, S2=3)
    expected = ~keep[:, None, :].expand(2, 4, 3)
    additive = torch.where(keep, 0.0, -10000.0)
    lowest = torch.where(keep, 0.0, torch.finfo(torch.float16).min).half()
    for mask in (keep[:, None, None, :], keep[:, None, None, :].expand(2, 3, 4, 3),
                 additive[:, None, None, :], lowest[:, None, None, :],
                 torch.where(keep, 0.0, -torch.inf)[:, None, None, :]):
        assert torch.equal(masked_positions(mask, 2, 3, 4, 3), expected)
    one_row = torch.tensor([[False, True, True]])      # 2-D: (S1, S2) in SDPA's convention
    assert torch.equal(masked_positions(one_row.expand(4, 3), 2, 3, 4, 3),
                       ~one_row.expand(4, 3)[None])


def test_masked_positions_refuses_what_it_cannot_carry():
    with pytest.raises(ValueError, match="adds a bias"):
        masked_positions(torch.tensor([[0.0, -3.0]]), 1, 1, 1, 2)
    per_head = torch.ones(1, 2, 1, 2, dtype=torch.bool)
    per_head[0, 1, 0, 0] = False
    with pytest.raises(NotImplementedError, match="differs between heads"):
        masked_positions(per_head, 1, 2, 1, 2)
    with pytest.raises(ValueError, match="does not broadcast"):
        masked_positions(torch.ones(3, 1, 1, 2, dtype=torch.bool), 2, 1, 1, 2)
    with pytest.raises(TypeError, match="bool or floating point"):
        masked_positions(torch.ones(1, 2, dtype=torch.int64), 1, 1, 1, 2)


def test_attend_refuses_fp32_and_gradients():
    q = torch.randn(1, 2, 3, 16)
    with pytest.raises(TypeError, match="float16 or bfloat16.*torch.float32"):
        attend(q, q, q, layout="BNSD", masked=None, causal=False, scale=0.25,
               algorithm="pasa-exact", backend="auto")
    h = q.half().requires_grad_()
    with pytest.raises(NotImplementedError, match="forward only"):
        attend(h, h, h, layout="BNSD", masked=None, causal=False, scale=0.25,
               algorithm="pasa-exact", backend="auto")


def test_importing_pasa_npu_imports_no_hugging_face_library(tmp_path):
    code = ("import sys, pasa_npu, pasa_npu.integrations; "
            "print([m for m in ('transformers', 'diffusers') if m in sys.modules])")
    # run outside the checkout, so that the installed package is the one imported
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("library", ["transformers", "diffusers"])
def test_integration_without_its_library_names_the_extra(library, monkeypatch):
    monkeypatch.setitem(sys.modules, library, None)   # import fails as if not installed
    monkeypatch.delitem(sys.modules, f"pasa_npu.integrations.{library}", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'pasa-npu\[hf\]'"):
        __import__(f"pasa_npu.integrations.{library}")
