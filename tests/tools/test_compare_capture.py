"""``pasa-compare capture`` on a tiny Llama built from a config (no download)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                   "(pip install 'pasa-npu[compare]')")

from _support import assert_measured, naive_attention  # noqa: E402

from pasa_npu.tools.compare.capture import items_from_captures, record_attention  # noqa: E402
from pasa_npu.tools.compare.cli import main  # noqa: E402

WORDS = "the quick brown fox jumps over lazy dog . a an of to and in".split()


def _tiny_llama(layers=2):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(WORDS) + 1, hidden_size=64, intermediate_size=128,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256)
    return transformers.LlamaForCausalLM(config).eval()


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    _tiny_llama().save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return path


def test_captured_inputs_reproduce_the_models_attention():
    """What was recorded is what attention computed on: an independent fp64 attention of
    the captured Q/K/V (causal, GQA, the model's scale) gives the model's own output."""
    model = _tiny_llama()
    ids = torch.randint(1, len(WORDS) + 1, (1, 37), generator=torch.Generator().manual_seed(1))
    captures = record_attention(model, ids, [0, 1])
    assert [c.layer for c in captures] == [0, 1]
    assert model.config._attn_implementation != "pasa_compare_capture"   # switched back
    for c in captures:
        assert c.query.shape == (1, 4, 37, 16) and c.key.shape == (1, 2, 37, 16)
        assert c.scale == 16 ** -0.5
        visible = ~c.masked
        assert torch.equal(visible[0], torch.tril(torch.ones(37, 37, dtype=torch.bool)))
        ref = naive_attention(c.query, c.key, c.value, c.scale, visible)
        err = float((c.output.double() - ref).norm() / ref.norm())   # the model runs in fp32
        assert_measured(err, "compare-rmse", f"cpu/capture-layer-{c.layer}/model", 2)
    # the capture leaves the model's forward pass unchanged
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    captures_again = record_attention(model, ids, [1])
    assert torch.equal(captures_again[0].key, captures[1].key)
    items = items_from_captures(captures)
    assert items[0].dtype == torch.float16 and items[0].mask is not None
    assert torch.isfinite(plain).all()


def test_capture_end_to_end(model_dir, tmp_path):
    out = tmp_path / "out"
    rc = main(["capture", str(model_dir), "--prompt", "the quick brown fox jumps over the lazy "
               "dog . " * 4, "--layers", "0", "1", "--allocations", "fa-fp32", "fa-fp16s", "pasa",
               "pasa-exact", "--quiet", "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    assert [it["name"] for it in doc["items"]] == ["layer 0", "layer 1"]
    assert doc["items"][0]["shape"] == [1, 4, 40, 16] and doc["items"][0]["kv_heads"] == 2
    assert doc["items"][0]["masked"] is True
    labels = {r["candidate"] for r in doc["records"]}
    assert labels == {"fa-fp32", "fa-fp16s", "pasa", "pasa-exact", "sdpa"}
    for r in doc["records"]:
        assert r["status"] == "ok" and r["metrics"]["nonfinite_pct"] == 0
        assert_measured(r["metrics"]["rel_rmse"], "compare-rmse",
                        f"cpu/capture-{r['item']}/{r['candidate']}", 1.5)
        assert len(r["heads"]["rel_rmse"]) == 4
    for name in ("results.csv", "per_head.csv", "summary.md", "rmse_by_head.png",
                 "rmse_by_item.png"):
        assert (out / name).stat().st_size > 0


def test_capture_with_token_ids_and_bad_layers(model_dir, tmp_path, capsys):
    rc = main(["capture", str(model_dir), "--token-ids", "1", "2", "3", "4", "5", "6",
               "--layers", "1", "--allocations", "fa-fp32", "--third-party", "--no-plots",
               "--quiet", "--out", str(tmp_path / "o")])
    assert rc == 0
    capsys.readouterr()
    for argv, needle in (
        (["--layers", "2"], "--layers 2: out of range; the model has 2 layers (0 to 1)"),
        (["--layers", "-1"], "--layers -1: out of range"),
        (["--token-ids", "99"], f"--token-ids must lie in [0, {len(WORDS) + 1})"),
    ):
        rc = main(["capture", str(model_dir)] + argv + ["--quiet", "--out", str(tmp_path / "e")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and needle in err[0], err
    rc = main(["capture", str(tmp_path / "no-model")])
    assert rc == 2 and "model directory not found" in capsys.readouterr().err


def test_a_model_folder_without_tokenizer_files_asks_for_token_ids(tmp_path, capsys):
    """transformers may build an empty tokenizer for a folder without tokenizer files (a
    Qwen2 config does): the error says no tokenizer was found, not that the prompt is empty."""
    config = transformers.Qwen2Config(
        vocab_size=len(WORDS) + 1, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, bos_token_id=None, eos_token_id=None)
    path = tmp_path / "no-tokenizer"
    transformers.Qwen2ForCausalLM(config).save_pretrained(path)
    capsys.readouterr()
    rc = main(["capture", str(path), "--quiet", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert f"{path}: no tokenizer found in the folder" in err[0] and "--token-ids" in err[0]
    assert not (tmp_path / "out").exists()


def _tiny_gpt_oss():
    """gpt-oss with GQA 4:2, a window of 6 keys in its first layer and attention sinks drawn
    large enough to take a visible share of each row."""
    torch.manual_seed(0)
    config = transformers.GptOssConfig(
        vocab_size=len(WORDS) + 1, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=6, max_position_embeddings=4096 * 32)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    return model


def _attention_with_sinks(q, k, v, scale, visible, sink):
    """fp64 attention whose softmax has one more column per head, the sink, with a zero
    value (gpt-oss's definition), written out independently of the tool."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("bnid,bnjd->bnij", q, k) * scale
    s = s.masked_fill(~visible[:, None], float("-inf"))
    column = sink.double()[None, :, None, None].expand(s.shape[0], -1, s.shape[2], 1)
    p = torch.softmax(torch.cat([s, column], dim=-1), dim=-1)[..., :-1]
    return p @ v


def test_gpt_oss_sinks_are_captured_and_compared_with_them(tmp_path):
    """The sinks (``s_aux``) are recorded with Q/K/V and reproduce the model's attention;
    the tool's golden and every candidate (allocations, SDPA) compute with them: an fp16
    output's error, where leaving the sinks out errs by their share of each row."""
    from pasa_npu.tools.compare.candidates import build
    from pasa_npu.tools.compare.evaluate import compare

    model = _tiny_gpt_oss()
    ids = torch.randint(1, len(WORDS) + 1, (1, 29), generator=torch.Generator().manual_seed(2))
    captures = record_attention(model, ids, [0, 1])
    for c in captures:
        assert torch.equal(c.sink, model.model.layers[c.layer].self_attn.sinks.detach())
        want = _attention_with_sinks(c.query, c.key, c.value, c.scale, ~c.masked, c.sink)
        err = float((c.output.double() - want).norm() / want.norm())
        assert err < 1e-5, err  # the model computes in fp32
    assert not captures[0].masked[0].equal(captures[1].masked[0])  # the window and causal
    items = items_from_captures(captures)
    candidates, skipped = build(["fa-fp32", "pasa", "pasa-exact"], ["torch"], ["sdpa"])
    assert not skipped
    result = compare(items, candidates, skipped)
    assert all(item["sinks"] is True for item in result.items)
    for record in result.records:
        assert record.status == "ok", record.reason
        # fp16 inputs and output: a few units of fp16's 2^-11 (the sink's share left out
        # would err by tens of percent)
        assert record.metrics["rel_rmse"] < 4e-3, (record.item, record.candidate, record.metrics)
    no_sinks = items_from_captures([dataclasses.replace(c, sink=None) for c in captures])
    for with_sinks, without in zip(items, no_sinks):
        out, plain = (candidates[0].run(item).out.double() for item in (with_sinks, without))
        assert float((out - plain).norm() / plain.norm()) > 0.1
    assert all(r.status == "ok" for r in compare(no_sinks, candidates[:1], {}).records)
    path = tmp_path / "gpt-oss"
    model.save_pretrained(path)
    rc = main(["capture", str(path), "--token-ids", *map(str, ids[0].tolist()), "--layers", "0",
               "--allocations", "fa-fp32", "pasa", "--backends", "torch", "--no-plots",
               "--quiet", "--out", str(tmp_path / "out")])
    assert rc == 0
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["items"][0]["sinks"] is True
    assert {r["candidate"] for r in doc["records"]} == {"fa-fp32", "pasa", "sdpa"}
    assert all(r["status"] == "ok" and r["metrics"]["rel_rmse"] < 4e-3 for r in doc["records"])
