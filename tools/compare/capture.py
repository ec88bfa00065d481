"""Capture the Q/K/V that reach attention in a Hugging Face model.

A recording attention function is registered with transformers' ``AttentionInterface``,
as ``pasa_npu.integrations.transformers`` registers PASA (with a mask function in
``AttentionMaskInterface``), and the model is switched to it for one forward pass.
It sees exactly what the model's attention kernel sees (after RoPE, with the
key/value heads before any GQA repetition, the softmax scale, the mask, gpt-oss's
attention sinks),
records it for the chosen layers, and delegates to the model's own
implementation (sdpa, eager, ...) so that the forward pass is unchanged.
nn.Module forward hooks cannot do this: they see the attention block's hidden
states, not its post-RoPE Q/K/V. Needs the ``compare`` extra's transformers; runs
offline (``local_files_only``) on a model directory the user has.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .errors import CompareError
from .inputs import Item

RECORDER_NAME = "pasa_compare_capture"


@dataclass
class Captured:
    """What reached attention in one layer: BNSD tensors in the model's dtype,
    ``masked`` bool (B|1, S1, S2) (True = masked) or None, the model's own
    attention output (B, N, S1, D), ``sink`` the sinks (N,) float32 (``s_aux``) or None."""

    layer: int
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    scale: float
    masked: Optional[torch.Tensor]
    output: torch.Tensor
    sink: Optional[torch.Tensor] = None


def _transformers():
    """(transformers, pasa_npu.integrations.transformers, ALL_ATTENTION_FUNCTIONS)."""
    try:
        import transformers
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        from ...integrations import transformers as integration
    except ImportError as err:
        raise CompareError(f"capture needs transformers: {err}; pip install "
                           f"'pasa-npu[compare]'") from err
    return transformers, integration, ALL_ATTENTION_FUNCTIONS


def _to_masked(mask, module, q_len: int, kv_len: int, batch: int, heads: int,
               integration) -> Optional[torch.Tensor]:
    """The mask that reached attention as bool (B|1, S1, S2), True = masked."""
    if mask is None:
        if not getattr(module, "is_causal", True) or q_len == 1:
            return None
        i = torch.arange(q_len)[:, None]
        j = torch.arange(kv_len)[None, :]
        return (j > i + (kv_len - q_len)).unsqueeze(0)   # causal, bottom-right aligned
    if mask.dim() != 4 or mask.shape[1] != 1:
        raise CompareError(f"unsupported attention mask of shape {tuple(mask.shape)} (expected "
                           f"(B, 1, S1, S2))")
    try:
        return integration.masked_positions(mask[:, :, :q_len, :kv_len].detach().cpu(), batch,
                                            heads, q_len, kv_len)
    except ValueError as err:
        raise CompareError(f"the model's attention mask: {err} (ALiBi or similar)") from err


def model_layers(config) -> int:
    """Number of decoder layers a model config declares."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.num_hidden_layers)


def check_layers(layers: Sequence[int], n: int) -> None:
    for layer in layers:
        if not 0 <= layer < n:
            raise CompareError(f"--layers {layer}: out of range; the model has {n} layers "
                               f"(0 to {n - 1})")


def record_attention(model, input_ids: torch.Tensor, layers: Sequence[int]) -> list[Captured]:
    """Run ``model(input_ids)`` once and return what reached attention in ``layers``
    (indices into the model's decoder layers, checked against its config)."""
    _, integration, ALL_ATTENTION_FUNCTIONS = _transformers()
    check_layers(layers, model_layers(model.config))
    original = model.config._attn_implementation
    if original == RECORDER_NAME:
        raise CompareError("the model is already switched to the capture recorder")
    if not hasattr(model, "set_attn_implementation"):
        raise CompareError("this transformers version cannot switch attention implementations")
    wanted = set(layers)
    captured: dict[int, Captured] = {}

    def delegate(module):
        if original in ALL_ATTENTION_FUNCTIONS:
            return ALL_ATTENTION_FUNCTIONS[original]
        if original == "eager":
            fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
            if fn is not None:
                return fn
        raise CompareError(f"cannot find the model's attention implementation {original!r}")

    def recorder(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        result = delegate(module)(module, query, key, value, attention_mask, scaling=scaling,
                                  dropout=dropout, **kw)
        idx = getattr(module, "layer_idx", None)
        if idx in wanted and idx not in captured:
            for unsupported in ("softcap", "sinks"):  # s_aux (one sink per head) is taken
                if kw.get(unsupported) is not None:
                    raise CompareError(f"layer {idx} passes {unsupported} to attention, which "
                                       f"pasa-compare's cases do not carry")
            if getattr(module, "sliding_window", None) and attention_mask is None:
                raise CompareError(f"layer {idx} uses a sliding window without an explicit mask")
            b, _, s1, d = query.shape
            s2 = key.shape[2]
            scale = float(scaling) if scaling is not None else d ** -0.5
            out = result[0].detach().cpu()
            sink = kw.get("s_aux")
            captured[idx] = Captured(
                idx, query.detach().cpu(), key.detach().cpu(), value.detach().cpu(), scale,
                _to_masked(attention_mask, module, s1, s2, b, query.shape[1], integration),
                out.transpose(1, 2), None if sink is None else sink.detach().float().cpu())
        return result

    # registered as pasa_npu's attention is: with the mask function of the implementation
    # it delegates to, so that the recorder and its delegate see the model's mask
    integration.register_attention(RECORDER_NAME, recorder, integration.mask_function_of(original))
    model.set_attn_implementation(RECORDER_NAME)
    try:
        with torch.no_grad():
            model(input_ids=input_ids)
    finally:
        model.set_attn_implementation(original)
    missing = sorted(wanted - set(captured))
    if missing:
        raise CompareError(f"layers {missing} never called attention through transformers' "
                           f"AttentionInterface; this model type cannot be captured")
    return [captured[i] for i in sorted(wanted)]


def items_from_captures(captures: list[Captured], dtype: Optional[torch.dtype] = None,
                        name: str = "layer") -> list[Item]:
    """Items of the captured layers, rounded to ``dtype`` (default: the model's
    dtype if fp16/bf16, else fp16)."""
    items = []
    for c in captures:
        dt = dtype or (c.query.dtype if c.query.dtype in (torch.float16, torch.bfloat16)
                       else torch.float16)
        q, k, v = (t.to(dt).contiguous() for t in (c.query, c.key, c.value))
        items.append(Item(f"{name} {c.layer}", q, k, v, c.scale, c.masked,
                          meta={"layer": c.layer, "captured_dtype": str(c.query.dtype)},
                          sink=c.sink))
    return items


def load_model(path: str, dtype: Optional[str] = None, layers: Sequence[int] = (),
               quiet: bool = False):
    """(model, tokenizer or None) from a local directory; no network access. ``layers``
    are checked against the config before any weight is read."""
    if os.path.isfile(path):
        raise CompareError(f"{path} is a file, not a model directory; for Q/K/V in a file run "
                           f"'pasa-compare file {path}'")
    if not os.path.isdir(path):
        raise CompareError(f"model directory not found: {path}")
    transformers, _, _ = _transformers()
    if not os.path.exists(os.path.join(path, "config.json")):
        raise CompareError(f"{path} has no config.json; expected a save_pretrained() directory")
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as err:
        raise CompareError(f"cannot read {path}/config.json: {str(err).splitlines()[0]}") from err
    check_layers(layers, model_layers(config))
    if quiet:
        transformers.utils.logging.disable_progress_bar()
    kw = dict(local_files_only=True)
    if dtype:
        kw["dtype"] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    try:
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(path, **kw)
        except ValueError:
            model = transformers.AutoModel.from_pretrained(path, **kw)
    except (OSError, ValueError) as err:
        raise CompareError(f"cannot load a model from {path}: {str(err).splitlines()[0]}") from err
    model.eval()
    tokenizer = None
    if has_tokenizer_files(path):  # without them transformers may build an empty tokenizer
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError, TypeError):
            pass
    return model, tokenizer


#: Files a saved Hugging Face tokenizer consists of (one is enough; also any *.tiktoken).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "vocab.txt", "merges.txt", "spiece.model", "sentencepiece.bpe.model")


def has_tokenizer_files(path: str) -> bool:
    """Whether the model folder ``path`` holds any file of a saved tokenizer."""
    return any(name in TOKENIZER_FILES or name.endswith(".tiktoken") for name in os.listdir(path))


def tokenize(tokenizer, prompt: Optional[str], token_ids: Optional[list[int]], path: str,
             max_tokens: int) -> torch.Tensor:
    """(1, tokens) ids of ``token_ids``, or of ``prompt`` under ``tokenizer`` (None: the
    model folder ``path`` has none that loads), cut to ``max_tokens``."""
    if token_ids:
        ids = torch.tensor([token_ids], dtype=torch.long)
    else:
        if tokenizer is None:
            found = ("its tokenizer files do not load" if has_tokenizer_files(path) else
                     "no tokenizer found in the folder (no tokenizer.json, "
                     "tokenizer_config.json, vocabulary or sentencepiece file)")
            raise CompareError(f"{path}: {found}; pass --token-ids ID [ID ...] instead of "
                               f"--prompt")
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    if ids.shape[1] == 0:
        raise CompareError(f"--prompt: the tokenizer in {path} turns it into no tokens; pass "
                           f"--token-ids ID [ID ...] instead")
    return ids[:, :max_tokens]
