"""An fp16 LLM whose attention overflows, run with ``attn_implementation="pasa"``.

A small Qwen2-architecture model is built from a config with random weights (nothing is
downloaded). Its K projection gets a large bias pattern along the head dimension and its
Q projection the matching pattern, the resonance the PASA paper found in Qwen2-7B: every
query-key product carries the same large constant, which softmax cancels but an fp16
score cannot hold. The biased dimensions are the rotary embedding's slowest pairs, whose
rotation stays below fp16's resolution, and carry the bias alone.

So that every generated token depends on attention, and does so with margins far above
any fp16 model's own rounding (a random model's top two logits often lie closer than
that, and its fp16 and fp32 continuations part whatever the attention), layer 0 is made a
previous-token head and the unembedding reads what it attends to: each greedy token is
fixed by the token two positions back, through layer 0's attention.

The script greedily continues one prompt three ways and prints the tokens: the fp32
model (the reference), the fp16 model with eager attention (fp16 scores: inf, then NaN
logits), and the fp16 model with PASA, with its largest logit error against fp32 over
the prompt and the continuation.

    python examples/overflow_demo.py                  # CPU, the torch backend
    python examples/overflow_demo.py --device cuda    # GPU, the Triton backend
"""
from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass

import torch

import pasa_npu.integrations.transformers as pasa_transformers
from transformers import Qwen2Config, Qwen2ForCausalLM

CONFIG = dict(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              rope_theta=1e6, tie_word_embeddings=False)
HEAD_DIM = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
HALF = HEAD_DIM // 2  # rotate_half pairs dims d and d + HALF
BIAS = 96.0
#: the first halves of the rotary embedding's 8 slowest pairs
BIASED_DIMS = range(HALF - 8, HALF)
#: the previous-token pattern: the 4 fastest rotary pairs, amplitude 12 (q . k peaks at
#: 4 * 144 for the key one position back, 0.79 * 144 above any other: 14 after the scale)
POSITIONAL_PAIRS = range(4)
POSITIONAL_AMPLITUDE = 12.0
VALUE_GAIN = 4.0
FP16_MAX = 65504.0


def resonant_score() -> float:
    """The constant every query-key product carries: the biased dims' q . k."""
    return len(BIASED_DIMS) * BIAS * BIAS


def demo_model(seed: int = 0) -> Qwen2ForCausalLM:
    """The fp32 demo model: random weights from ``seed`` (rounded to fp16, so that the fp32
    and fp16 models share them), then

    * in every layer, K and Q biased by the pattern +BIAS, -BIAS, ... on BIASED_DIMS of
      each head, those dimensions' weight rows zeroed;
    * layer 0 a previous-token head: Q and K biases on the fastest rotary pairs make each
      query attend to the key one position back; V and O pass that key's hidden state on;
    * an unembedding that reads it through a fixed permutation of the vocabulary.

    Each greedy token is then the image of the token two positions back, read through
    layer 0's attention."""
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**CONFIG)).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                _set_bias_pattern(proj, BIASED_DIMS, BIAS * _alternating(len(BIASED_DIMS)))
        _previous_token_head(model.model.layers[0].self_attn)
        _permuted_unembedding(model, torch.Generator().manual_seed(seed))
        for p in model.parameters():
            p.copy_(p.half().float())
    return model


def _alternating(n: int) -> torch.Tensor:
    return torch.tensor([(-1.0) ** i for i in range(n)])


def _set_bias_pattern(proj: torch.nn.Linear, dims, values: torch.Tensor) -> None:
    """Every head of ``proj``: bias ``values`` on ``dims``, their weight rows zero."""
    heads = proj.out_features // HEAD_DIM
    proj.weight.view(heads, HEAD_DIM, -1)[:, dims] = 0.0
    proj.bias.view(heads, HEAD_DIM)[:, dims] = values


def _previous_token_head(attn) -> None:
    """q = (a, 0) and k = R(theta) q on each positional pair: the rotary embedding makes
    q_m . k_n = a^2 cos((m - n - 1) theta), largest for n = m - 1."""
    theta = CONFIG["rope_theta"] ** (-2.0 * torch.tensor(list(POSITIONAL_PAIRS)) / HEAD_DIM)
    first = list(POSITIONAL_PAIRS)
    second = [d + HALF for d in first]
    a = POSITIONAL_AMPLITUDE
    _set_bias_pattern(attn.q_proj, first + second, torch.cat([a * torch.ones(len(first)),
                                                              torch.zeros(len(first))]))
    _set_bias_pattern(attn.k_proj, first + second, torch.cat([a * theta.cos(),
                                                              a * theta.sin()]))
    kv_dim = attn.v_proj.out_features
    attn.v_proj.weight.zero_()
    attn.v_proj.bias.zero_()
    attn.v_proj.weight[:, :kv_dim] = torch.eye(kv_dim)  # each kv head: its slice of x
    attn.o_proj.weight.zero_()
    group = CONFIG["num_attention_heads"] // CONFIG["num_key_value_heads"]
    for kv_head in range(CONFIG["num_key_value_heads"]):  # one query head of each group
        rows = slice(kv_head * HEAD_DIM, (kv_head + 1) * HEAD_DIM)
        cols = slice(kv_head * group * HEAD_DIM, (kv_head * group + 1) * HEAD_DIM)
        attn.o_proj.weight[rows, cols] = VALUE_GAIN * torch.eye(HEAD_DIM)


def _permuted_unembedding(model, generator: torch.Generator) -> None:
    """Logit j reads the normalised embedding of token perm(j) over the dimensions that
    layer 0's attention writes."""
    emb = model.model.embed_tokens.weight
    unit = emb / emb.pow(2).mean(-1, keepdim=True).sqrt()
    kv_dim = model.model.layers[0].self_attn.v_proj.out_features
    perm = torch.randperm(CONFIG["vocab_size"], generator=generator)
    model.lm_head.weight.zero_()
    model.lm_head.weight[:, :kv_dim] = 0.05 * unit[perm, :kv_dim]


def variant(model: Qwen2ForCausalLM, dtype: torch.dtype, attention: str, device: str,
            algorithm: str | None = None) -> Qwen2ForCausalLM:
    """A copy of ``model`` in ``dtype`` on ``device`` with ``attention``."""
    copied = copy.deepcopy(model).to(device=device, dtype=dtype)
    copied.set_attn_implementation(attention)
    if algorithm is not None:
        pasa_transformers.configure(copied, algorithm=algorithm)
    return copied


@dataclass
class Run:
    """One model's greedy continuation and its logits along the reference's tokens."""

    name: str
    tokens: list[int]
    logits: torch.Tensor  # (positions, vocab) float32 on CPU


def greedy(model, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """``new_tokens`` greedy tokens after ``prompt`` (1, S), through ``generate``."""
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, prompt.shape[1]:].tolist()


def teacher_forced_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits[0].float().cpu()


def run_demo(device: str = "cpu", new_tokens: int = 40, prompt_len: int = 16, seed: int = 0,
             algorithm: str | None = None) -> dict[str, Run]:
    """Greedy continuations of fp32 eager, fp16 eager and fp16 pasa, and each one's
    logits over the prompt and the fp32 continuation."""
    reference = demo_model(seed)
    prompt = torch.randint(1, CONFIG["vocab_size"], (1, prompt_len),
                           generator=torch.Generator().manual_seed(seed)).to(device)
    models = {"fp32 eager": variant(reference, torch.float32, "eager", device),
              "fp16 eager": variant(reference, torch.float16, "eager", device),
              "fp16 pasa": variant(reference, torch.float16, "pasa", device, algorithm)}
    runs: dict[str, Run] = {}
    forced = None
    for name, model in models.items():
        tokens = greedy(model, prompt, new_tokens)
        if forced is None:  # the fp32 continuation, fed to every model
            forced = torch.cat([prompt, torch.tensor([tokens], device=device)], dim=1)
        runs[name] = Run(name, tokens, teacher_forced_logits(model, forced))
    return runs


def report(runs: dict[str, Run], algorithm: str | None = None) -> str:
    """The printed comparison."""
    ref = runs["fp32 eager"]
    lines = [f"Qwen2-architecture model, random weights: {CONFIG['num_hidden_layers']} layers, "
             f"{CONFIG['num_attention_heads']} query / {CONFIG['num_key_value_heads']} "
             f"key-value heads of {HEAD_DIM}, layer 0 a previous-token head",
             f"K and Q biased by +-{BIAS:g} on {len(BIASED_DIMS)} head dims: every q.k carries "
             f"{resonant_score():g} > fp16 max {FP16_MAX:g}",
             f"greedy continuation, {len(ref.tokens)} tokens:"]
    for run in runs.values():
        label = run.name + (f" ({algorithm})" if algorithm and "pasa" in run.name else "")
        finite = torch.isfinite(run.logits)
        if run is ref:
            note = "the reference"
        elif not bool(finite.all()):
            note = f"non-finite logits: {1 - float(finite.float().mean()):.0%}"
        else:
            err = float((run.logits - ref.logits).abs().max())
            same = sum(a == b for a, b in zip(run.tokens, ref.tokens))
            note = (f"{same}/{len(ref.tokens)} tokens equal to fp32; max |logit - fp32| = "
                    f"{err:.2g} (|logit| up to {float(ref.logits.abs().max()):.3g})")
        lines.append(f"  {label:<22} {note}")
        for i in range(0, len(run.tokens), 20):
            lines.append("      " + " ".join(f"{t:3d}" for t in run.tokens[i:i + 20]))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu (torch backend) or cuda (Triton)")
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--algorithm", default=None,
                        help="config.pasa_algorithm (default: pasa-exact)")
    args = parser.parse_args(argv)
    print(report(run_demo(args.device, args.new_tokens, algorithm=args.algorithm),
                 args.algorithm))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
