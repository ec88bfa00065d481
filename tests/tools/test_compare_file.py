"""``pasa-compare file``: every file format and layout, end to end."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from pasa_npu.tools.compare.cli import main
from pasa_npu.tools.compare.inputs import file_item

B, NQ, NKV, S, D = 2, 4, 2, 96, 32


@pytest.fixture(scope="module")
def bnsd():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(B, NQ, S, D, generator=gen).half() + 4
    k = torch.randn(B, NKV, S, D, generator=gen).half() + 4
    v = torch.randn(B, NKV, S, D, generator=gen).half()
    return q, k, v


def _layout(t, layout):
    """BNSD -> ``layout``, written out by hand (B = 1 for the packed layouts)."""
    if layout == "BSND":
        return t.permute(0, 2, 1, 3).contiguous()
    if layout == "BSH":
        return t.permute(0, 2, 1, 3).reshape(t.shape[0], t.shape[2], -1).contiguous()
    if layout == "TND":
        return t[0].permute(1, 0, 2).contiguous()
    if layout == "NTD":
        return t[0].contiguous()
    return t


@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH", "TND", "NTD"])
def test_layouts_read_back_as_bnsd(tmp_path, bnsd, layout):
    q, k, v = bnsd if layout not in ("TND", "NTD") else (t[:1] for t in bnsd)
    path = tmp_path / "qkv.pt"
    torch.save({"query": _layout(q, layout), "key": _layout(k, layout),
                "value": _layout(v, layout)}, path)
    heads = dict(num_heads=NQ, num_kv_heads=NKV) if layout == "BSH" else {}
    item = file_item([str(path)], layout, **heads)
    assert torch.equal(item.query, q) and torch.equal(item.key, k) and torch.equal(item.value, v)
    assert item.scale == D ** -0.5


def test_formats_agree(tmp_path, bnsd):
    """.pt, .npz, .safetensors and three .npy files give the same item."""
    from safetensors.torch import save_file
    q, k, v = bnsd
    torch.save((q, k, v), tmp_path / "a.pt")
    np.savez(tmp_path / "b.npz", q=q.numpy(), k=k.numpy(), v=v.numpy())
    save_file({"q": q, "k": k, "v": v}, str(tmp_path / "c.safetensors"))
    for name, t in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", t.numpy())
    sources = [[tmp_path / "a.pt"], [tmp_path / "b.npz"], [tmp_path / "c.safetensors"],
               [tmp_path / "q.npy", tmp_path / "k.npy", tmp_path / "v.npy"]]
    for paths in sources:
        item = file_item([str(p) for p in paths])
        assert torch.equal(item.query, q) and torch.equal(item.value, v), paths
        assert item.dtype == torch.float16


def test_fp32_files_round_to_the_requested_dtype(tmp_path, bnsd):
    q, k, v = (t.float() for t in bnsd)
    torch.save({"q": q, "k": k, "v": v}, tmp_path / "f.pt")
    assert file_item([str(tmp_path / "f.pt")]).dtype == torch.float16
    item = file_item([str(tmp_path / "f.pt")], dtype=torch.bfloat16)
    assert item.dtype == torch.bfloat16 and torch.equal(item.key, k.bfloat16())


def test_file_end_to_end_with_mask(tmp_path):
    """BSH file with GQA and a causal mask. SDPA gets the mask converted to its own
    convention (True = attend), so its agreement with the golden checks the mask made it
    through: every candidate within 1.5x its measured error (tests/measured.json)."""
    from _support import assert_measured
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(B, NQ, S, D, generator=gen).half()
    k, v = (torch.randn(B, NKV, S, D, generator=gen).half() for _ in range(2))
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)   # causal, True = masked
    torch.save({"q": _layout(q, "BSH"), "k": _layout(k, "BSH"), "v": _layout(v, "BSH"),
                "atten_mask": mask}, tmp_path / "in.pt")
    out = tmp_path / "out"
    rc = main(["file", str(tmp_path / "in.pt"), "--layout", "BSH", "--num-heads", str(NQ),
               "--num-kv-heads", str(NKV), "--allocations", "fa-fp32", "pasa-exact",
               "--quiet", "--out", str(out)])
    assert rc == 0
    rows = {r["candidate"]: r for r in csv.DictReader(open(out / "results.csv"))}
    assert set(rows) == {"fa-fp32", "pasa-exact", "sdpa"}
    for name in ("fa-fp32", "pasa-exact", "sdpa"):
        assert_measured(float(rows[name]["rel_rmse"]), "compare-rmse",
                        f"cpu/file-bsh-causal/{name}", 1.5)
    assert rows["fa-fp32"]["dual_verdict"] in ("L2", "L1", "L0")
    heads = list(csv.DictReader(open(out / "per_head.csv")))
    assert len(heads) == 3 * NQ
    doc = json.loads((out / "results.json").read_text())
    assert doc["items"][0]["masked"] is True and doc["baseline"] == "sdpa"
    assert (out / "rmse_by_head.png").read_bytes()[:4] == b"\x89PNG"


def test_file_with_sinks(tmp_path, capsys):
    """A ``learnable_sink`` beside Q/K/V (one logit per query head) reaches the golden and
    every candidate: SDPA, which takes it as one more key, agrees with the golden to fp16's
    precision; a sink of another shape is refused by name."""
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(B, NQ, S, D, generator=gen).half()
    k, v = (torch.randn(B, NKV, S, D, generator=gen).half() for _ in range(2))
    sink = torch.tensor([3.0, -1.0, 0.5, 2.0])  # one per query head
    torch.save({"q": q, "k": k, "v": v, "learnable_sink": sink}, tmp_path / "in.pt")
    out = tmp_path / "out"
    rc = main(["file", str(tmp_path / "in.pt"), "--allocations", "fa-fp32", "pasa",
               "--backends", "torch", "--no-plots", "--quiet", "--out", str(out)])
    assert rc == 0
    rows = {r["candidate"]: r for r in csv.DictReader(open(out / "results.csv"))}
    assert set(rows) == {"fa-fp32", "pasa", "sdpa"}
    for row in rows.values():  # a few units of fp16's 2^-11 (the sinks' share: more)
        assert float(row["rel_rmse"]) < 4e-3, row
    assert json.loads((out / "results.json").read_text())["items"][0]["sinks"] is True
    torch.save({"q": q, "k": k, "v": v, "learnable_sink": sink[:1]}, tmp_path / "bad.pt")
    capsys.readouterr()
    rc = main(["file", str(tmp_path / "bad.pt"), "--quiet", "--out", str(tmp_path / "o2")])
    err = capsys.readouterr().err
    assert rc == 2 and f"the sinks must be floating point of shape ({NQ},)" in err, err
