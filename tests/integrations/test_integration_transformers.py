"""attn_implementation="pasa" on tiny Llama and Qwen2 models built from configs (no
download), in fp16, against the same weights in fp32 with transformers' eager attention.
Runs on the GPU (default backend: Triton) when there is one.

Bounds: a fp16 model differs from its fp32 self wherever it rounds, attention or not, so
each comparison is against the fp16 model with SDPA (fp32 scores inside the kernel):
PASA's logits must be within twice that model's error, plus 2e-3 for the logits' own
fp16 rounding."""
from __future__ import annotations

import copy
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                   "(pip install 'pasa-npu[hf]')")

import pasa_npu.integrations.transformers as pasa_transformers  # noqa: E402
from pasa_npu.integrations import _attention  # noqa: E402
from _support import assert_measured  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB = 96


def _model(family: str, seed: int = 0):
    """A 2-layer fp32 model, weights rounded to fp16 (shared by its fp16 copies): Qwen2
    with GQA 4:2 and q/k/v biases (``qwen2-window``: a sliding window of 6 keys in every
    layer), Llama with 4 key-value heads, gpt-oss with GQA 4:2, a window of 6 keys in its
    first layer and attention sinks (drawn large enough to take a visible share)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=256)
    if family == "gpt-oss":
        common.update(intermediate_size=64, num_key_value_heads=2, head_dim=16,
                      num_local_experts=4, num_experts_per_tok=2, sliding_window=6,
                      max_position_embeddings=4096 * 32)  # YaRN's factor of 32 without a warning
        model = transformers.GptOssForCausalLM(transformers.GptOssConfig(**common))
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)
    elif family.startswith("qwen2"):
        if family == "qwen2-window":
            common.update(use_sliding_window=True, sliding_window=6, max_window_layers=0)
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=2,
                                                                       **common))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=4,
                                                                       **common))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    return model.eval().to(DEVICE)


def _as(model, dtype, attention):
    out = copy.deepcopy(model).to(dtype)
    out.set_attn_implementation(attention)
    return out


def _logits(model, ids, mask=None):
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits.float()


def _ids(batch, length, seed=1):
    return torch.randint(1, VOCAB, (batch, length),
                         generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def _fp32_eager_attention(module, query, key, value, attention_mask, **kwargs):
    """The model's own eager attention in fp32 on half inputs: an fp16 model whose attention
    does not round, for models without SDPA (gpt-oss)."""
    eager = sys.modules[type(module).__module__].eager_attention_forward
    mask = None if attention_mask is None else attention_mask.float()
    out, _ = eager(module, query.float(), key.float(), value.float(), mask, **kwargs)
    return out.to(query.dtype), None


FP32_EAGER = "test-fp32-eager"
pasa_transformers.register_attention(FP32_EAGER, _fp32_eager_attention,
                                     pasa_transformers.mask_function_of("eager"))


def _bound(model, ids, reference, mask=None, keep=slice(None)):
    """Twice the error of the fp16 model whose attention keeps fp32 scores (SDPA, or the
    model's eager attention in fp32 where it has no SDPA), plus 2e-3."""
    exact = "sdpa" if model._supports_sdpa else FP32_EAGER
    fp16 = _logits(_as(model, torch.float16, exact), ids, mask)
    return 2 * float((fp16 - reference)[keep].abs().max()) + 2e-3


@pytest.mark.parametrize("family", ["qwen2", "llama", "qwen2-window", "gpt-oss"])
def test_prefill_with_padding(family):
    """A batch of two sequences, the second left-padded by 5 tokens: the valid positions'
    logits agree with fp32 eager."""
    model = _model(family)
    ids = _ids(2, 23)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    ref = _logits(_as(model, torch.float32, "eager"), ids, mask)
    out = _logits(_as(model, torch.float16, "pasa"), ids, mask)
    keep = mask.bool()
    assert float((out - ref)[keep].abs().max()) < _bound(model, ids, ref, mask, keep)


def test_gqa_key_value_heads_are_not_repeated(monkeypatch):
    """The operator receives Qwen2's 2 key-value heads for its 4 query heads."""
    seen = []
    real = _attention.fused_attention

    def spy(query, key, value, **kw):
        seen.append((kw["num_heads"], kw["num_key_value_heads"], key.shape[1], kw["algorithm"],
                     kw["backend"]))
        return real(query, key, value, **kw)

    monkeypatch.setattr(_attention, "fused_attention", spy)
    _logits(_as(_model("qwen2"), torch.float16, "pasa"), _ids(1, 9))
    assert seen and all(s == (4, 2, 2, "pasa-exact", "auto") for s in seen)


def _generate(model, ids, mask, new_tokens):
    """Greedy tokens and their per-step logits (B, new_tokens, V)."""
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                             output_logits=True, return_dict_in_generate=True)
    return out.sequences, torch.stack(out.logits, 1).float()


@pytest.mark.parametrize("family", ["qwen2", "llama", "gpt-oss"])
def test_cached_decode_with_left_padding(family):
    """Batched generate with a KV cache, the shorter prompt left-padded: every step's logits
    (prefill, then one-token decode steps) agree with fp32 eager run without padding on the
    tokens generated, for each row on its own."""
    model = _model(family)
    new = 6
    lengths = (14, 9)
    prompts = [_ids(1, n, seed=2 + i)[0] for i, n in enumerate(lengths)]
    ids = torch.zeros(2, max(lengths), dtype=torch.long, device=DEVICE)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, -len(prompt):] = prompt
        mask[row, -len(prompt):] = 1
    sequences, step_logits = _generate(_as(model, torch.float16, "pasa"), ids, mask, new)
    fp32 = _as(model, torch.float32, "eager")
    for row, prompt in enumerate(prompts):
        alone = sequences[row:row + 1, max(lengths) - len(prompt):]   # the row without padding
        ref = _logits(fp32, alone)[0, len(prompt) - 1:-1]          # the logits of each step
        bound = _bound(model, alone, _logits(fp32, alone))
        assert float((step_logits[row] - ref).abs().max()) < bound


def test_from_pretrained_and_set_attn_implementation(tmp_path):
    _model("llama").save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float16, attn_implementation="pasa").to(DEVICE)
    assert loaded.config._attn_implementation == "pasa"
    ids = _ids(1, 11)
    pasa = _logits(loaded, ids)
    loaded.set_attn_implementation("sdpa")
    sdpa = _logits(loaded, ids)
    loaded.set_attn_implementation("pasa")
    assert torch.equal(_logits(loaded, ids), pasa)
    assert_measured(float((pasa - sdpa).abs().max()), "integration",
                    f"{DEVICE}/transformers/pasa-vs-sdpa-logits", 2.0)


def test_config_knob_chooses_the_allocation(monkeypatch):
    """configure() sets config.pasa_algorithm / pasa_backend, which every call reads;
    a value pasa_npu does not know is refused naming the config attribute."""
    model = _as(_model("qwen2"), torch.float16, "pasa")
    seen = []
    real = _attention.fused_attention

    def spy(query, key, value, **kw):
        seen.append((kw["algorithm"], kw["backend"]))
        return real(query, key, value, **kw)

    monkeypatch.setattr(_attention, "fused_attention", spy)
    backend = "triton" if DEVICE == "cuda" else "torch"
    pasa_transformers.configure(model, algorithm="fa-fp32", backend=backend)
    _logits(model, _ids(1, 5))
    assert set(seen) == {("fa-fp32", backend)}
    model.config.pasa_algorithm = "pasa-fast"
    with pytest.raises(ValueError, match="config.pasa_algorithm.*pasa-fast"):
        _logits(model, _ids(1, 5))
    with pytest.raises(ValueError, match="configure"):
        pasa_transformers.configure(model, backend="tpu")


def test_fp32_model_is_refused_with_advice():
    with pytest.raises(TypeError, match="torch.float16"):
        _logits(_as(_model("llama"), torch.float32, "pasa"), _ids(1, 4))


def test_capture_records_the_mask_through_the_same_registration():
    """pasa-compare capture registers its recorder as PASA is registered, with its
    delegate's mask function: a sliding-window model's window reaches the recorder (with
    the attention function alone, transformers hands it no mask)."""
    from pasa_npu.tools.compare.capture import record_attention

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
        sliding_window=6, max_window_layers=0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    model.set_attn_implementation("sdpa")
    captured = record_attention(model, _ids(1, 20).cpu(), [0])[0]
    i = torch.arange(20)[:, None]
    j = torch.arange(20)[None, :]
    assert torch.equal(captured.masked[0], (j > i) | (j <= i - 6))
