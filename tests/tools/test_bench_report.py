"""pasa-bench's report and plot, from a saved result (no GPU needed): the ratios in the
Markdown table, failed candidates shown as errors, and a PNG with the prefill panels
and the decode panel, also for a run with only one of the two."""
from __future__ import annotations

import itertools
import json

import pytest
import torch

from pasa_npu.tools import bench, bench_check, bench_report

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
    text = bench_report.markdown(_result())
    assert "| 128 | 4096 | none | 300 (1.20 / 0.60) | 250 | 500 |" in text
    assert "| 128 | 16384 | none | error | 250 | 500 |" in text
    assert "| 8192 | 4:1 | 2400 (80%) [1200 (40%)] | 2700 (90%) [2500 (83%)] | error " \
           "[2600 (87%)] |" in text


def test_progress_line_names_the_mask_as_the_tables_do():
    row = _result()["rows"][0]
    assert bench_report.row_text(row, ["pasa-exact"]).startswith("d=128  S=4096   none ")
    assert bench_report.case_text(row) == "d=128 S=4096 none"
    assert bench_report.row_text(dict(row, causal=True), ["pasa-exact"]).split()[2] == "causal"


@pytest.mark.parametrize("kinds", [("prefill",), ("decode",)])
def test_markdown_of_a_run_with_one_kind_has_only_its_table(kinds):
    result = _result()
    result["rows"] = [row for row in result["rows"] if row["kind"] in kinds]
    text = bench_report.markdown(result)
    assert ("Prefill, fp16" in text) == ("prefill" in kinds)
    assert ("Decode (query length 1)" in text) == ("decode" in kinds)


@pytest.mark.parametrize("kinds", [("prefill", "decode"), ("prefill",), ("decode",)])
def test_plot_has_a_panel_per_mask_and_one_for_decode(kinds, tmp_path):
    import matplotlib.image

    result = _result()
    result["rows"] = [r for r in result["rows"] if r["kind"] in kinds]
    path = tmp_path / "bench.png"
    assert bench_report.plot(result, path)
    height, width = matplotlib.image.imread(path).shape[:2]
    # 4.2 inches per panel at 120 dpi (at least 6, for the title): one prefill panel
    # (d=128, no mask) and one decode
    assert width == round(max(6.0, 4.2 * len(kinds)) * 120) and height == round(3.8 * 120)


def test_plot_of_a_saved_run_and_its_errors(tmp_path, capsys):
    saved = tmp_path / "bench.json"
    saved.write_text(json.dumps(_result()))
    assert bench.main(["--plot", str(saved), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "bench.png").stat().st_size > 0
    assert bench.main(["--plot", str(tmp_path / "missing.json"), "--out", str(tmp_path)]) == 2
    assert "cannot read" in capsys.readouterr().err
    empty = dict(_result(), rows=[])
    assert not bench_report.plot(empty, tmp_path / "none.png")
    assert "no prefill or decode rows" in capsys.readouterr().err


def test_paged_table_shows_share_of_copy_and_ratio_to_contiguous():
    result = _result()
    decode = result["rows"][-1]
    decode["pasa-exact paged"] = {"gbs": 2160.0, "eager_gbs": 900.0}
    result["rows"][0]["pasa-exact paged"] = {"tflops": 285.0}
    result["rows"][1]["pasa-exact paged"] = {"error": "RuntimeError: x"}
    result["paged_cache"] = "3d"
    text = bench_report.markdown(result)
    assert "Paged KV (3d cache, block_size 128" in text
    assert "| decode S2=8192 GQA 4:1 | 2160 (72%); 0.90 |" in text
    assert "| prefill d=128 S=4096 none | 285; 0.95 |" in text
    assert "| prefill d=128 S=16384 none | error |" in text


def test_decode_ratio_to_cudnn_in_three_decimals_paged_against_contiguous():
    result = _result()
    decode = result["rows"][-1]
    text = bench_report.markdown(result)
    assert "| 8192 | 4:1 | error |" in text  # cuDNN's graph replay failed
    decode["sdpa-cudnn"] = {"gbs": 2410.0, "eager_gbs": 2600.0}
    decode["pasa-exact paged"] = {"gbs": 2398.0}
    text = bench_report.markdown(result)
    assert "| S2 | GQA | pasa-exact | pasa-exact paged |" in text
    assert "| 8192 | 4:1 | 0.996 | 0.995 |" in text


@pytest.mark.parametrize("cache_shape", ["4d", "3d"])
def test_paged_bench_inputs_hold_the_same_keys(cache_shape):
    """bench_paged's cache and table give back the contiguous K/V, and its call computes
    what the contiguous call does (Triton backend; under the interpreter without a GPU)."""
    import torch

    import pasa_npu
    from pasa_npu.tools import bench_paged

    gen = torch.Generator().manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = (torch.randn(2, n, s, 16, generator=gen).half().to(device)
               for n, s in ((2, 1), (1, 256), (1, 256)))
    k_cache, v_cache, table = bench_paged.paged_kv(
        k, v, torch.Generator(device=device).manual_seed(1), cache_shape)
    assert sorted(table.flatten().tolist()) == list(range(4))
    four_d = k_cache if cache_shape == "4d" else k_cache.unflatten(2, (1, 16)).transpose(1, 2)
    gathered = four_d[table.long()].permute(0, 2, 1, 3, 4).flatten(2, 3)
    assert torch.equal(gathered, k)
    out = bench_paged.paged_call("fa-fp32", None, table, 2, 1, 16)(q, k_cache, v_cache, False,
                                                                   True)
    want = pasa_npu.fused_attention(q, k, v, num_heads=2, num_key_value_heads=1,
                                    input_layout="BNSD", scale=0.25, algorithm="fa-fp32",
                                    backend="triton")[0]
    assert torch.equal(out, want)


def _check_runs(values: dict) -> list:
    """Runs of one prefill case: ``values`` maps a candidate to its TFLOP/s per run."""
    n = len(next(iter(values.values())))
    return [[dict(kind="prefill", d=64, s=4096, causal=True, b=4, h=32,
                  **{name: {"tflops": v[r]} for name, v in values.items()})]
            for r in range(n)]


def test_check_comparison_within_the_unchecked_runs_spread():
    off = _check_runs({"pasa": [300.0, 310.0, 305.0], "sdpa-flash": [270.0, 280.0, 275.0]})
    on = _check_runs({"pasa": [299.0, 296.0, 298.0], "sdpa-flash": [281.0, 270.0, 276.0]})
    on[1][0]["fa-fp32"] = {"error": "RuntimeError: out of resources"}  # not in every run
    rows = {row["name"]: row for row in bench_check.check_comparison(off, on)}
    assert set(rows) == {"pasa", "sdpa-flash"}
    # checked median 298 below the unchecked runs' smallest, 300
    assert not rows["pasa"]["within"] and rows["pasa"]["ratio"] == pytest.approx(298 / 305)
    assert rows["sdpa-flash"]["within"] and rows["sdpa-flash"]["ratio"] == pytest.approx(276 / 275)
    result = {"device": "test GPU", "torch": "x", "triton": "y", "runs": 3,
              "comparison": bench_check.check_comparison(off, on)}
    text = bench_check.check_markdown(result)
    assert ("| d=64 S=4096 causal | pasa | TFLOP/s | 305 [300, 310] | 298 [296, 299] | 0.977 "
            "| no |") in text
    assert "| d=64 S=4096 causal | sdpa-flash | TFLOP/s | 275 [270, 280] | 276 [270, 281] " \
           "| 1.004 | yes |" in text
    # 3 runs: a cell that the check leaves alone is outside with probability 0.4
    assert "misses with probability 40.0%" in text
    assert ("- ours: 1 of 1 cells outside the spread, chance alone 0.4 (at least 1 with "
            "probability 40%: as many as chance gives); checked / unchecked 0.9770") in text
    assert "- SDPA peers: 0 of 1 cells outside the spread, chance alone 0.4 (at least 0 " \
           "with probability 100%" in text


@pytest.mark.parametrize("runs", [3, 5, 7])
def test_chance_outside_counts_every_order_of_the_runs(runs):
    """Identical code: each choice of which of the 2 runs ranked values are the checked
    runs is equally likely; count the choices whose checked median leaves the unchecked
    range."""
    orders = list(itertools.combinations(range(2 * runs), runs))
    outside = 0
    for checked in orders:
        unchecked = sorted(set(range(2 * runs)) - set(checked))
        median = sorted(checked)[runs // 2]
        outside += not unchecked[0] <= median <= unchecked[-1]
    assert bench_check.chance_outside(runs) == pytest.approx(outside / len(orders), rel=1e-12)


@pytest.mark.parametrize("runs", [2, 4, 1])
def test_chance_outside_needs_a_middle_run(runs):
    with pytest.raises(ValueError, match="odd number of at least 3, so that the checked "
                                         f"median is one run, got {runs}"):
        bench_check.chance_outside(runs)


def test_check_summary_tells_a_real_cost_from_chance():
    """Nine runs: 2.9% per cell by chance. Four of eight cells outside is far more than
    that; one of eight is not."""
    def rows(outside, ratio, name):
        return [dict(name=name, ratio=ratio, within=i >= outside) for i in range(8)]
    comparison = rows(4, 0.98, "pasa") + rows(1, 1.0, "sdpa-flash")
    ours, peers = bench_check.check_summary(comparison, 9)
    assert (ours["group"], ours["cells"], ours["outside"]) == ("ours", 8, 4)
    assert ours["expected"] == pytest.approx(8 * bench_check.chance_outside(9))
    assert ours["p_value"] < 1e-4 and not ours["consistent"]
    assert ours["ratio"] == pytest.approx(0.98)
    assert peers["outside"] == 1 and peers["consistent"]
    p = bench_check.chance_outside(9)
    assert peers["p_value"] == pytest.approx(1 - (1 - p) ** 8)


@pytest.mark.parametrize("argv, message", [
    (["--runs", "3"], "--runs applies to --overflow-check compare"),
    (["--overflow-check", "compare", "--runs", "1"], "odd number of at least 3, so that the "
                                                     "checked median is one run, got 1"),
    (["--overflow-check", "compare", "--runs", "4"], "got 4"),
])
def test_check_comparison_options_are_refused_where_they_mean_nothing(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_host_table_shows_microseconds_ratio_to_flash_and_eager_minus_graph():
    result = _result()
    result["rows"][0]["pasa-exact"].update(host_us=60.0)
    result["rows"][0]["sdpa-flash"].update(host_us=20.0)
    result["rows"][2]["pasa-exact"].update(host_us=45.0, ms=0.150, graph_ms=0.110)
    result["rows"][2]["sdpa-flash"].update(host_us=30.0, ms=0.100, graph_ms=0.095)
    text = bench_report.markdown(result)
    assert "| d=128 S=4096 none | 60 (3.0) | 20 (1.0) | - |" in text
    assert "| decode d=128 S2=8192 GQA 4:1 | 45 (1.5) / 40 | 30 (1.0) / 5 | - |" in text
    assert "d=128 S=16384" not in text.split("Host time")[1]  # no host times in that row


def test_host_table_counts_our_launches_per_kind_and_states_the_empty_launch():
    result = _result()
    result["empty_launch_us"] = 7.3
    result["rows"][0]["pasa-exact"].update(host_us=60.0, host_us_new=75.0, launches=3,
                                           graph=True)
    result["rows"][1]["pasa-exact"] = {"tflops": 390.0, "host_us": 61.0, "launches": 2,
                                       "graph": True}
    result["rows"][0]["sdpa-flash"].update(host_us=20.0, host_us_new=25.0)
    result["rows"][2]["pasa-exact"].update(host_us=45.0, ms=0.150, graph_ms=0.110, launches=1,
                                           graph=True)
    text = bench_report.markdown(result)
    assert "| d=128 S=4096 none | 60 (3.0) · 75 (3.0) | 20 (1.0) · 25 (1.0) | - |" in text
    assert ("Triton kernels per call: prefill: pasa-exact 2-3; "
            "decode: pasa-exact 1. From a plan's second call on, a call at new addresses "
            "replays its kernels as one CUDA graph, their address arguments rewritten for its "
            "tensors. One launch of an empty kernel, made as a recorded call makes its "
            "launches, takes 7.3 µs of host time here.") in text
    result["rows"][2]["pasa-exact"]["graph"] = False
    assert "Some calls at new addresses" in bench_report.markdown(result)


def test_inputs_at_new_addresses_keep_the_layout_and_never_repeat_within_a_candidates_calls():
    t = torch.empty(2, 3, 5, 8, dtype=torch.float16)
    views = bench.views_at_new_addresses(t)
    at = bench.in_turn(views)
    got = [at() for _ in range(bench.NEW_ADDRESSES + 1)]
    assert all(g.shape == t.shape and g.stride() == t.stride() and g.dtype == t.dtype
               and g.data_ptr() % 16 == 0 for g in got)
    addresses = [g.data_ptr() for g in got]
    assert len(set(addresses[:-1])) == bench.NEW_ADDRESSES > 51  # host_us: 51 calls each
    assert addresses[-1] == addresses[0]
    assert bench.in_turn(views)().data_ptr() == addresses[0]  # each candidate its own turn
