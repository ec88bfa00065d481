"""examples/vllm_ascend_calls.py runs: vllm-ascend's v1, v2, .out-with-workspace and
torch.ops.npu calls through patch_torch_npu on a stand-in torch_npu, every step against dense
attention, every call reaching PASA (its own process: it registers torch.ops.npu operators)."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_vllm_ascend_calls_example_runs():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "vllm_ascend_calls.py")],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every call reached PASA and matched dense attention" in result.stdout
    for step in ("prefill (v1, no cache)", "sliding window (v1, sparse_mode 4)",
                 "sinks (v2, decode, window)", "graph capture (v2 .out, workspace, sinks)",
                 "context parallel (torch.ops.npu, LSE)"):
        assert step in result.stdout
