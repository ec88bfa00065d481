"""pasa-bench --distributed as a dry run on 2 CPU ranks (gloo) at a small size: every engine
and local attention runs on 1 and 2 ranks, the table is written, and the 2-rank outputs equal
one process's within the fp32 merge (the timings mean nothing on a CPU)."""
from __future__ import annotations

import json

from pasa_npu.tools import bench


def test_dry_run_on_two_cpu_ranks(tmp_path):
    rc = bench.main(["--distributed", "--backend", "gloo", "--gpus", "2", "--seqs", "256",
                     "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--runs", "1",
                     "--check-len", "256", "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    rows = json.loads((tmp_path / "distributed.json").read_text())["rows"]
    engines = {(r["engine"], r["local"], r["causal"], r["gpus"]) for r in rows}
    assert len(engines) == 3 * 2 * 2 * 2 == len(rows)
    for r in rows:
        assert r["ms"] > 0 and r["local_ms"] > 0
        if r["gpus"] == 2:  # the ring's fp32 merge against one call: a few fp16 roundings
            assert r["rmse_vs_single"] < 2e-3, r
            assert r["rmse_multi"] < 1.5 * r["rmse_single"] + 1e-3, r
    table = (tmp_path / "distributed.md").read_text()
    assert table.count("\n") == 2 + 12 and "yunchang-ulysses" in table
