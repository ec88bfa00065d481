"""The "pasa" backend of diffusers' attention dispatcher and PasaAttnProcessor, on tiny
models built from configs (no download): against an independent fp64 attention and against
the models' own fp32 attention. Runs on the GPU (default backend: Triton) when there is one.

Model-level bounds: a fp16 model differs from its fp32 self wherever it rounds, so PASA's
error must be within twice that of the same fp16 model with SDPA (fp32 scores inside the
kernel), plus 1e-3 for the output's own fp16 rounding."""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("diffusers", reason="diffusers is not installed (pip install 'pasa-npu[hf]')")

from diffusers import LTXVideoTransformer3DModel, PixArtTransformer2DModel  # noqa: E402
from diffusers.models.attention_dispatch import (attention_backend,  # noqa: E402
                                                 dispatch_attention_fn)
from diffusers.models.attention_processor import Attention, AttnProcessor2_0  # noqa: E402

from _support import assert_measured, naive_attention  # noqa: E402
from pasa_npu.integrations import diffusers as pasa_diffusers  # noqa: E402
from pasa_npu.integrations.diffusers import PasaAttnProcessor  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).half().to(DEVICE)


def _reference(q, k, v, visible, scale=None):
    """fp64 attention of (B, S, N, D) tensors; ``visible`` (B|1, S1, S2); (B, S1, N, D)."""
    q, k, v = (t.transpose(1, 2).cpu() for t in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return naive_attention(q, k, v, scale, visible.cpu(), empty_rows_mean_v=False).transpose(1, 2)


def _err(out, ref):
    return float((out.double().cpu() - ref).abs().max())


def _check(out, ref, case, what=""):
    """Max-abs error against the fp64 reference within 2x the largest measured for ``case``
    on this device (tests/measured.json, kind "integration")."""
    assert_measured(_err(out, ref), "integration", f"{DEVICE}/diffusers/{case}", 2.0, what)


@pytest.mark.parametrize("s_q,s_kv", [(20, 20), (20, 7)])
def test_dispatcher_self_and_cross_attention_with_masks(s_q, s_kv):
    """dispatch_attention_fn(backend="pasa"): no mask, diffusers' per-key additive mask
    (B, S2) with -10000 fills, a bool (B, 1, S1, S2) mask, and GQA with enable_gqa."""
    q, k, v = _randn(2, s_q, 4, 32, seed=0), _randn(2, s_kv, 4, 32, seed=1), \
        _randn(2, s_kv, 4, 32, seed=2)
    keep = torch.ones(2, s_kv, dtype=torch.bool, device=DEVICE)
    keep[1, -3:] = False
    additive = torch.where(keep, 0.0, -10000.0).half()
    every = torch.ones(1, s_q, s_kv, dtype=torch.bool)
    per_key = keep[:, None, :].expand(2, s_q, s_kv)
    cases = [(None, every), (additive, per_key), (keep[:, None, None, :], per_key)]
    for mask, visible in cases:
        out = dispatch_attention_fn(q, k, v, attn_mask=mask, backend="pasa")
        assert out.shape == q.shape
        _check(out, _reference(q, k, v, visible), "dispatcher", f"{s_q}x{s_kv}")
    k2, v2 = k[:, :, :2], v[:, :, :2]
    out = dispatch_attention_fn(q, k2, v2, enable_gqa=True, scale=0.3, backend="pasa")
    _check(out, _reference(q, k2, v2, every, 0.3), "dispatcher", "gqa")


def test_dispatcher_causal_is_sdpas_upper_left():
    q, k, v = _randn(1, 5, 2, 16, seed=3), _randn(1, 9, 2, 16, seed=4), _randn(1, 9, 2, 16, seed=5)
    for s_q in (5, 1):
        out = dispatch_attention_fn(q[:, :s_q], k, v, is_causal=True, backend="pasa")
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(1, 2).double() for t in (q[:, :s_q], k, v)), is_causal=True)
        _check(out, sdpa.transpose(1, 2).cpu(), "causal", f"{s_q} rows")


def test_dispatcher_refuses_what_it_cannot_do():
    q = _randn(1, 4, 2, 16, seed=6)
    with pytest.raises(ValueError, match="adds a bias"):
        dispatch_attention_fn(q, q, q, attn_mask=torch.full((1, 4), -2.0, device=DEVICE),
                              backend="pasa")
    with pytest.raises(NotImplementedError, match="dropout"):
        dispatch_attention_fn(q, q, q, dropout_p=0.1, backend="pasa")
    with pytest.raises(ValueError, match="enable_gqa"):
        dispatch_attention_fn(q, q[:, :, :1], q[:, :, :1], backend="pasa")
    with pytest.raises(ValueError, match="configure"):
        pasa_diffusers.configure(algorithm="flash")


def _ltx():
    torch.manual_seed(0)
    model = LTXVideoTransformer3DModel(in_channels=8, out_channels=8, num_attention_heads=2,
                                       attention_head_dim=16, cross_attention_dim=32,
                                       num_layers=1, caption_channels=24).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    return model.to(DEVICE)


def _ltx_inputs(dtype):
    g = torch.Generator().manual_seed(1)
    frames, height, width = 3, 4, 4
    caption_mask = torch.ones(2, 7)
    caption_mask[1, 4:] = 0   # the second caption has 4 tokens
    args = dict(hidden_states=torch.randn(2, frames * height * width, 8, generator=g),
                encoder_hidden_states=torch.randn(2, 7, 24, generator=g),
                timestep=torch.tensor([10, 500]), encoder_attention_mask=caption_mask)
    args = {k: v.to(DEVICE, dtype if v.is_floating_point() else v.dtype)
            for k, v in args.items()}
    return dict(args, num_frames=frames, height=height, width=width, return_dict=False)


def test_video_transformer_with_set_attention_backend():
    """A tiny LTX video transformer (self-attention over frames x pixels, cross-attention to
    a padded caption): set_attention_backend("pasa") and the attention_backend("pasa")
    context give the same output, which agrees with the fp32 model; the caption mask
    matters (dropping it moves the fp32 output by far more than the bound)."""
    model = _ltx()
    with torch.no_grad():
        ref = model(**_ltx_inputs(torch.float32))[0].double().cpu()
        unmasked = model(**dict(_ltx_inputs(torch.float32), encoder_attention_mask=None))[0]
        fp16 = copy.deepcopy(model).half()
        sdpa = fp16(**_ltx_inputs(torch.float16))[0]
        fp16.set_attention_backend("pasa")
        out = fp16(**_ltx_inputs(torch.float16))[0]
        fp16.reset_attention_backend()
        with attention_backend("pasa"):
            in_context = fp16(**_ltx_inputs(torch.float16))[0]
    bound = 2 * _err(sdpa, ref) + 1e-3
    assert torch.equal(out, in_context)
    assert _err(out, ref) < bound < _err(unmasked, ref)


def test_processor_on_pixart_with_caption_mask():
    """set_attn_processor(PasaAttnProcessor()) on a tiny PixArt (classic Attention: self-
    and cross-attention, the caption mask in diffusers' -10000 convention)."""
    torch.manual_seed(0)
    model = PixArtTransformer2DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8,
        num_layers=1, cross_attention_dim=32, caption_channels=24, sample_size=8,
        patch_size=2, norm_num_groups=8, use_additional_conditions=False).eval().to(DEVICE)
    g = torch.Generator().manual_seed(1)
    x, caption = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 7, 24, generator=g)
    caption_mask = torch.ones(2, 7)
    caption_mask[1, 4:] = 0

    def run(m, dtype, mask=caption_mask):
        with torch.no_grad():
            return m(x.to(DEVICE, dtype), encoder_hidden_states=caption.to(DEVICE, dtype),
                     timestep=torch.tensor([10, 500], device=DEVICE),
                     encoder_attention_mask=None if mask is None else mask.to(DEVICE, dtype),
                     return_dict=False)[0].double().cpu()

    ref = run(model, torch.float32)
    fp16 = copy.deepcopy(model).half()
    bound = 2 * _err(run(fp16, torch.float16), ref) + 1e-3
    fp16.set_attn_processor(PasaAttnProcessor())
    assert _err(run(fp16, torch.float16), ref) < bound < _err(run(model, torch.float32, None), ref)


def test_processor_on_image_attention_blocks():
    """UNet-style Attention modules on (B, C, H, W) input, group norm, residual connection,
    output rescaling and attn.scale: self-attention, and cross-attention to a context with
    a mask in diffusers' convention; against the default SDPA processor in fp32."""
    torch.manual_seed(0)
    common = dict(query_dim=32, heads=2, dim_head=16, bias=True, norm_num_groups=8,
                  residual_connection=True, rescale_output_factor=2.0, out_bias=True)
    self_attn = Attention(**common).eval().to(DEVICE)
    cross_attn = Attention(cross_attention_dim=24, **common).eval().to(DEVICE)
    g = torch.Generator().manual_seed(1)
    x, context = torch.randn(2, 32, 6, 6, generator=g), torch.randn(2, 5, 24, generator=g)
    keep = torch.tensor([[1.0, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    bias = ((1 - keep) * -10000.0)[:, None]   # diffusers' convention, as its UNets build it

    def run(module, dtype, processor, **kw):
        module = copy.deepcopy(module).to(dtype)
        module.set_processor(processor)
        with torch.no_grad():
            return module(x.to(DEVICE, dtype), **{k: v.to(DEVICE, dtype) for k, v in
                                                  kw.items()}).double().cpu()

    for module, kw in ((self_attn, {}),
                       (cross_attn, {"encoder_hidden_states": context, "attention_mask": bias})):
        ref = run(module, torch.float32, AttnProcessor2_0(), **kw)
        bound = 2 * _err(run(module, torch.float16, AttnProcessor2_0(), **kw), ref) + 1e-3
        assert _err(run(module, torch.float16, PasaAttnProcessor(), **kw), ref) < bound
    unmasked = run(cross_attn, torch.float32, AttnProcessor2_0(), encoder_hidden_states=context)
    assert _err(unmasked, ref) > bound   # the mask matters


def test_processor_refuses_what_it_would_leave_out():
    """An Attention with added key/value projections (added-KV and joint attention), and
    what other processors take (rotary embeddings, IP-Adapter), are refused by name: their
    outputs would be wrong, with diffusers only logging the dropped keywords."""
    g = torch.Generator().manual_seed(2)
    x, context = torch.randn(1, 6, 32, generator=g), torch.randn(1, 5, 24, generator=g)
    added_kv = Attention(query_dim=32, heads=2, dim_head=16, added_kv_proj_dim=24,
                         processor=PasaAttnProcessor()).half().eval()
    plain = Attention(query_dim=32, heads=2, dim_head=16,
                      processor=PasaAttnProcessor()).half().eval()
    rotary = (torch.ones(6, 16), torch.zeros(6, 16))
    with torch.no_grad():
        with pytest.raises(NotImplementedError, match=r"added key/value projections "
                                                      r"\(Attention.add_k_proj\)"):
            added_kv(x.half(), encoder_hidden_states=context.half())
        with pytest.raises(NotImplementedError, match="does not take image_rotary_emb"):
            plain(x.half(), image_rotary_emb=rotary)
        with pytest.raises(NotImplementedError, match="IP-Adapter"):
            plain(x.half(), encoder_hidden_states=(x.half(), [x.half()]))
        assert plain(x.half()).shape == x.shape


def test_backend_options():
    """configure() sets the dispatcher backend's allocation, which the next call uses."""
    q = _randn(1, 6, 2, 16, seed=7)
    previous = pasa_diffusers.configure(algorithm="fa-fp32")
    try:
        fa = dispatch_attention_fn(q, q, q, backend="pasa")
    finally:
        pasa_diffusers.configure(**previous)
    exact = dispatch_attention_fn(q, q, q, backend="pasa")
    ref = _reference(q, q, q, torch.ones(1, 6, 6, dtype=torch.bool))
    assert previous["algorithm"] == "pasa-exact"
    _check(fa, ref, "options-fa-fp32")
    _check(exact, ref, "options-pasa-exact")
    assert not torch.equal(fa, exact)
