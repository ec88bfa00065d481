"""A video-diffusion attention block whose fp16 scores overflow, run with PasaAttnProcessor.

The block is diffusers' ``TransformerSpatioTemporalModel``, the spatio-temporal
transformer of Stable Video Diffusion's UNet, built small with random weights (nothing is
downloaded). Its spatial and temporal self-attention get a large bias along the sequence:
Q and K projections whose bias gives every token the same large vector on a few head
dimensions (those dimensions' weight rows zero), so that every query-key product carries
the same constant, which softmax cancels but an fp16 score cannot hold (the resonance the
PASA paper found in SVD).

It runs the block on one random clip four ways and prints each output's error against
fp32: SDPA (diffusers' default processor; its kernels keep the scores in fp32), the
classic ``AttnProcessor`` (scores in fp16, as an all-fp16 attention kernel holds them)
and ``PasaAttnProcessor``.

    python examples/overflow_demo_diffusers.py                  # CPU, the torch backend
    python examples/overflow_demo_diffusers.py --device cuda    # GPU, the Triton backend
"""
from __future__ import annotations

import argparse
import copy

import torch

from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0
from diffusers.models.transformers.transformer_temporal import TransformerSpatioTemporalModel
from pasa_npu.integrations.diffusers import PasaAttnProcessor

BLOCK = dict(num_attention_heads=2, attention_head_dim=32, in_channels=64,
             cross_attention_dim=32, num_layers=1)
FRAMES, HEIGHT, WIDTH = 8, 16, 16
BIAS = 224.0
BIASED_DIMS = range(8)
FP16_MAX = 65504.0


def resonant_score() -> float:
    """The constant every scaled query-key product carries."""
    return len(BIASED_DIMS) * BIAS * BIAS * BLOCK["attention_head_dim"] ** -0.5


def demo_block(seed: int = 0) -> TransformerSpatioTemporalModel:
    """The fp32 block: random weights from ``seed`` (rounded to fp16, shared by the fp32
    and fp16 runs), Q and K of every self-attention biased by +BIAS, -BIAS, ... on
    BIASED_DIMS of each head."""
    torch.manual_seed(seed)
    block = TransformerSpatioTemporalModel(**BLOCK).eval()
    signs = torch.tensor([(-1.0) ** i for i in range(len(BIASED_DIMS))])
    with torch.no_grad():
        for name, attn in block.named_modules():
            if isinstance(attn, Attention) and name.endswith("attn1"):
                for proj in ("to_q", "to_k"):
                    setattr(attn, proj, _biased(getattr(attn, proj), BIAS * signs))
        for p in block.parameters():
            p.copy_(p.half().float())
    return block


def _biased(linear: torch.nn.Linear, pattern: torch.Tensor) -> torch.nn.Linear:
    """``linear`` with a bias: ``pattern`` on BIASED_DIMS of each head, 0 elsewhere, and
    zero weight rows on BIASED_DIMS."""
    head_dim = BLOCK["attention_head_dim"]
    heads = linear.out_features // head_dim
    out = torch.nn.Linear(linear.in_features, linear.out_features, bias=True)
    out.weight.copy_(linear.weight)
    out.bias.zero_()
    out.weight.view(heads, head_dim, -1)[:, BIASED_DIMS] = 0.0
    out.bias.view(heads, head_dim)[:, BIASED_DIMS] = pattern
    return out


def clip(seed: int = 0) -> dict:
    """One random clip's inputs: latents (frames, C, H, W), an image embedding per frame."""
    g = torch.Generator().manual_seed(seed)
    return dict(hidden_states=torch.randn(FRAMES, BLOCK["in_channels"], HEIGHT, WIDTH,
                                          generator=g),
                encoder_hidden_states=torch.randn(FRAMES, 1, BLOCK["cross_attention_dim"],
                                                  generator=g),
                image_only_indicator=torch.zeros(1, FRAMES))


def run(block, inputs: dict, dtype: torch.dtype, processor, device: str) -> torch.Tensor:
    """The block's output (float32, CPU) in ``dtype`` with ``processor`` on every attention."""
    block = copy.deepcopy(block).to(device=device, dtype=dtype)
    for module in block.modules():
        if isinstance(module, Attention):
            module.set_processor(processor)
    args = {k: v.to(device=device, dtype=dtype) if k != "image_only_indicator" else v.to(device)
            for k, v in inputs.items()}
    with torch.no_grad():
        return block(**args, return_dict=False)[0].float().cpu()


VARIANTS = (("SDPA (AttnProcessor2_0)", torch.float32, AttnProcessor2_0),
            ("SDPA (AttnProcessor2_0)", torch.float16, AttnProcessor2_0),
            ("fp16 scores (AttnProcessor)", torch.float16, AttnProcessor),
            ("PASA (PasaAttnProcessor)", torch.float16, PasaAttnProcessor))


def run_demo(device: str = "cpu", seed: int = 0) -> list[tuple[str, torch.dtype, torch.Tensor]]:
    """Every variant's output, the fp32 reference first."""
    block, inputs = demo_block(seed), clip(seed)
    return [(name, dtype, run(block, inputs, dtype, processor(), device))
            for name, dtype, processor in VARIANTS]


def report(results, inputs: dict) -> str:
    """The printed comparison: non-finite outputs and the error against fp32, relative to
    what the block adds to its input (its residual)."""
    ref = results[0][2]
    update = float((ref - inputs["hidden_states"]).abs().max())
    lines = [f"SVD spatio-temporal transformer block (diffusers TransformerSpatioTemporalModel), "
             f"random weights: {FRAMES} frames of {HEIGHT} x {WIDTH} tokens, "
             f"{BLOCK['num_attention_heads']} heads of {BLOCK['attention_head_dim']}",
             f"spatial and temporal self-attention: Q and K share a bias of +-{BIAS:g} on "
             f"{len(BIASED_DIMS)} head dims, every scaled q.k carries {resonant_score():.0f} > "
             f"fp16 max {FP16_MAX:g}",
             f"  {'attention':<30} {'dtype':<8} {'non-finite':>10}  max |out - fp32| / max "
             f"|fp32 - input| ({update:.3g})"]
    for i, (name, dtype, out) in enumerate(results):
        bad = int((~torch.isfinite(out)).sum())
        err = ("reference" if i == 0 else "-" if bad else
               f"{float((out - ref).abs().max()) / update:.2e}")
        lines.append(f"  {name:<30} {str(dtype).replace('torch.', ''):<8} {bad:>10}  {err}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu (torch backend) or cuda (Triton)")
    args = parser.parse_args(argv)
    print(report(run_demo(args.device), clip()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
