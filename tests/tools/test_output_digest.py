"""tools/dev/output_digest: the same inputs give the same fingerprints on the deterministic
CPU backend, one changed output byte changes its call's, and the comparison names exactly the
calls that differ."""
from __future__ import annotations

import torch

from pasa_npu.tools.dev import output_digest


def test_fingerprints_repeat_and_name_the_calls_that_differ(monkeypatch):
    monkeypatch.setattr(output_digest, "CASES", {
        name: output_digest.CASES[name] for name in ("prefill-bnsd-d80-ragged", "decode-bsh-paged")})
    first = output_digest.digest("torch", "cpu", ("pasa", "fa-fp32"))
    assert len(first) == 2 * 2 * 2 and not any(v.startswith("refused") for v in first.values())
    assert output_digest.digest("torch", "cpu", ("pasa", "fa-fp32")) == first

    real = output_digest.pasa_npu.fused_attention

    def one_byte_off(*args, **kwargs):
        out, lse = real(*args, **kwargs)
        if kwargs["algorithm"] == "pasa" and args[0].shape[1] == 1:  # the decode case
            out.view(torch.int16).view(-1)[0] ^= 1
        return out, lse

    monkeypatch.setattr(output_digest.pasa_npu, "fused_attention", one_byte_off)
    changed = output_digest.digest("torch", "cpu", ("pasa", "fa-fp32"))
    assert output_digest.compare(first, changed) == [
        "decode-bsh-paged/bfloat16/pasa", "decode-bsh-paged/float16/pasa"]
