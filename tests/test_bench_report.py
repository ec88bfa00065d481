"""pasa-bench's report and plot, from a saved result (no GPU needed): the ratios in the
Markdown table, failed candidates shown as errors, and a PNG with the prefill panels
and the decode panel, also for a run with only one of the two."""
from __future__ import annotations

import json

import pytest

from pasa_npu.tools import bench

pytest.importorskip("matplotlib", reason="matplotlib is not installed")


def _result():
    prefill = [dict(kind="prefill", d=128, s=s, causal=False, b=1, h=16,
                    **{"pasa-exact": {"tflops": t}, "sdpa-flash": {"tflops": 250.0},
                       "sdpa-cudnn": {"tflops": 500.0}})
               for s, t in ((4096, 300.0), (16384, 400.0))]
    prefill[1]["pasa-exact"] = {"error": "RuntimeError: out of resources"}
    decode = [dict(kind="decode", d=128, s=8192, ratio=4, b=8, h=32, hkv=8,
                   **{"pasa-exact": {"gbs": 2400.0, "eager_gbs": 1200.0},
                      "sdpa-flash": {"gbs": 2700.0, "eager_gbs": 2500.0},
                      "sdpa-cudnn": {"graph_error": "RuntimeError: capture failed",
                                     "eager_gbs": 2600.0}})]
    return {"device": "test GPU", "torch": "x", "triton": "y", "algorithms": ["pasa-exact"],
            "tuning": {}, "decode_algorithms": ["pasa-exact"], "copy_gbs": 3000.0,
            "rows": prefill + decode}


def test_markdown_ratios_and_errors():
    text = bench.markdown(_result())
    assert "| 128 | 4096 | none | 300 (1.20 / 0.60) | 250 | 500 |" in text
    assert "| 128 | 16384 | none | error | 250 | 500 |" in text
    assert "| 8192 | 4:1 | 2400 (80%) [1200 (40%)] | 2700 (90%) [2500 (83%)] | error " \
           "[2600 (87%)] |" in text


@pytest.mark.parametrize("kinds", [("prefill",), ("decode",)])
def test_markdown_of_a_run_with_one_kind_has_only_its_table(kinds):
    result = _result()
    result["rows"] = [row for row in result["rows"] if row["kind"] in kinds]
    text = bench.markdown(result)
    assert ("Prefill, fp16" in text) == ("prefill" in kinds)
    assert ("Decode (query length 1)" in text) == ("decode" in kinds)


@pytest.mark.parametrize("kinds", [("prefill", "decode"), ("prefill",), ("decode",)])
def test_plot_has_a_panel_per_mask_and_one_for_decode(kinds, tmp_path):
    import matplotlib.image

    result = _result()
    result["rows"] = [r for r in result["rows"] if r["kind"] in kinds]
    path = tmp_path / "bench.png"
    assert bench.plot(result, path)
    height, width = matplotlib.image.imread(path).shape[:2]
    # 4.2 inches per panel at 120 dpi: one prefill panel (d=128, no mask) and one decode
    assert width == round(4.2 * 120 * len(kinds)) and height == round(3.8 * 120)


def test_plot_of_a_saved_run_and_its_errors(tmp_path, capsys):
    saved = tmp_path / "bench.json"
    saved.write_text(json.dumps(_result()))
    assert bench.main(["--plot", str(saved), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "bench.png").stat().st_size > 0
    assert bench.main(["--plot", str(tmp_path / "missing.json"), "--out", str(tmp_path)]) == 2
    assert "cannot read" in capsys.readouterr().err
    empty = dict(_result(), rows=[])
    assert not bench.plot(empty, tmp_path / "none.png")
    assert "no prefill or decode rows" in capsys.readouterr().err
