"""The instruction-level simulator (ascend_kernels/sim) running Huawei's implementation of the
AscendC API (the asc-devkit headers, CPU-debug build): each API call our kernels make, run
through it and through our own emulation (ascend_kernels/emu), compared bit for bit, and the
simulator's results checked against expectations computed here from the documented semantics."""
from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import tempfile

import numpy as np
import pytest

from pasa_npu import sim_build
from pasa_npu.tools.dev import sim_selftest as st

REASON = sim_build.why_not()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"ascendc-sim: {REASON}")

# Calls the emulation refuses where Huawei's implementation runs them under state a kernel should
# not rely on (each names the test of the simulator's reading).
EMU_REFUSES = {
    "ComparesAfterL0": "Huawei's implementation issues a count-mode Compares's vcmpvs under whatever mask "
                       "the last level-0 call left; the emulation refuses such a Compares "
                       "(test_compares_runs_under_the_mask_a_level0_call_left)",
}
# Forms no kernel calls, which the emulation refuses as outside its scope: the simulator's
# readings of them are held against the documentation below instead.
EMU_OUT_OF_SCOPE = {
    "Cast float>half ROUND", "Cast float>half FLOOR", "Cast float>half CEIL", "Cast float>half TRUNC",
    "Cast float>half ODD", "Cast float>bfloat16 ROUND", "Cast float>bfloat16 TRUNC", "Cast half>uint8 NONE",
    "MatmulBT half>float 20x40x24",
}


def _build_dir():
    """One build per source state, shared by the pytest workers."""
    h = hashlib.sha256()
    for path in sorted(sim_build._sim_headers()) + sorted(
            os.path.join(st.EMU, f) for f in os.listdir(st.EMU) if f.endswith(".h")):
        h.update(path.encode())
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(open(sim_build.__file__, "rb").read())
    return os.path.join(tempfile.gettempdir(), f"pasa-ascendc-sim-{h.hexdigest()[:16]}")


@pytest.fixture(scope="session")
def outputs():
    """Every case of tools/dev/sim_selftest.py through both builds: (cases, sim, emu) by name."""
    where = _build_dir()
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sim, emu = st.build_sim(where), st.build_emu(where)
    cases = st.cases()
    work = tempfile.mkdtemp(prefix="pasa-sim-run-")
    os.makedirs(os.path.join(work, "s"))
    os.makedirs(os.path.join(work, "e"))
    got_sim = st.run(sim, cases, os.path.join(work, "s"))
    got_emu = st.run(emu, cases, os.path.join(work, "e"))
    return {c.name: (c, s, e) for c, s, e in zip(cases, got_sim, got_emu)}


def _sim(outputs, name):
    case, raw, _ = outputs[name]
    assert raw is not None, f"{name} did not run on the simulator"
    return case, st.as_array(raw, case.out_type)


COMPARED = [c.name for c in st.cases()]


@pytest.mark.parametrize("name", COMPARED)
def test_simulator_and_emulation_agree_bit_for_bit(outputs, name):
    case, sim, emu = outputs[name]
    if sim is None and emu is None:
        return  # both reject the call (Huawei's checks and the emulation's)
    assert sim is not None, f"{name}: Huawei's implementation rejects a call the emulation runs"
    if case.op in EMU_REFUSES:
        assert emu is None, f"{name}: the emulation runs a call it should refuse: {EMU_REFUSES[case.op]}"
        return
    assert (emu is None) == (name in EMU_OUT_OF_SCOPE), f"{name}: the emulation refuses a call a kernel may make"
    if emu is None:
        return
    assert st.differences(case, sim, emu) is None, st.differences(case, sim, emu)


# ------------------------------------------------------------------ expectations of our own

def _f(dtype):
    return np.float16 if dtype == "half" else np.float32


@pytest.mark.parametrize("dtype", ["half", "float"])
@pytest.mark.parametrize("n", [4096, 1000, 77])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Adds", "Muls", "Abs", "Duplicate"])
def test_elementwise_rounds_once_and_writes_only_count_elements(outputs, op, dtype, n):
    case, got = _sim(outputs, f"{op} {dtype} n={n}")
    a = case.a.astype(np.float64)
    b = case.b.astype(np.float64) if case.b is not None else None
    s = np.float64(_f(dtype)(case.scalar))
    with np.errstate(all="ignore"):
        exact = {"Add": lambda: a + b, "Sub": lambda: a - b, "Mul": lambda: a * b, "Div": lambda: a / b,
                 "Max": lambda: np.where(np.isnan(a) | np.isnan(b), np.nan, np.maximum(a, b)),
                 "Adds": lambda: a + s, "Muls": lambda: a * s, "Abs": lambda: np.abs(a),
                 "Duplicate": lambda: np.full(n, s)}[op]()
        want = exact.astype(_f(dtype))
    assert np.array_equal(got[:n], want[:n], equal_nan=True), np.flatnonzero(got[:n] != want[:n])[:5]
    assert np.array_equal(got[n:case.init.size], case.init[n:]), "elements past the count were written"


@pytest.mark.parametrize("dtype", ["half", "float"])
@pytest.mark.parametrize("n", [4096, 1000, 77])
def test_reduce_sum_is_a_pairwise_tree_per_repeat_and_reduce_max_the_maximum(outputs, dtype, n):
    t = _f(dtype)
    lanes = 256 // np.dtype(t).itemsize
    case, got = _sim(outputs, f"ReduceSum {dtype} n={n}")
    total = None
    for r in range(0, n, lanes):
        v = list(case.a[r:r + lanes].astype(t))
        while len(v) > 1:
            v = [t(np.float64(v[k]) + np.float64(v[k + 1])) for k in range(0, len(v) - 1, 2)] + \
                ([v[-1]] if len(v) % 2 else [])
        total = v[0] if total is None else t(np.float64(total) + np.float64(v[0]))
    assert got[0] == total
    case, got = _sim(outputs, f"ReduceMax {dtype} n={n}")
    assert got[0] == case.a[:n].max()


@pytest.mark.parametrize("mode", ["RINT", "NONE", "ROUND", "FLOOR", "CEIL", "TRUNC", "ODD"])
def test_cast_float_to_half_rounds_as_the_mode_says(outputs, mode):
    case, got = _sim(outputs, f"Cast float>half {mode}")
    x = case.a[:case.n].astype(np.float64)
    with np.errstate(all="ignore"):
        near = x.astype(np.float16).astype(np.float64)        # to nearest even
        lo = np.where(near > x, np.nextafter(near.astype(np.float16), np.float16(-np.inf)), near)
        lo = np.where(np.isinf(near) & (x > 0), 65504.0, np.where(np.isinf(near) & (x < 0), -np.inf, lo))
        hi = np.where(lo == x, lo, np.nextafter(lo.astype(np.float16), np.float16(np.inf)).astype(np.float64))
    lo, hi = lo.astype(np.float64), hi.astype(np.float64)
    odd_lo = (lo.astype(np.float16).view(np.uint16) & 1) == 1
    away = np.where(np.abs(x - lo) > np.abs(hi - x), hi, np.where(np.abs(x - lo) < np.abs(hi - x), lo,
                                                                  np.where(np.abs(lo) > np.abs(hi), lo, hi)))
    want = {"RINT": near, "NONE": near, "FLOOR": lo, "CEIL": hi, "TRUNC": np.where(x >= 0, lo, hi),
            "ROUND": away, "ODD": np.where(lo == x, x, np.where(odd_lo, lo, hi))}[mode]
    big = np.abs(x) > 65504
    if mode in ("TRUNC", "ODD"):
        want = np.where(big, np.sign(x) * 65504.0, want)      # directed away from infinity: largest finite
    if mode == "ROUND":
        want = np.where(np.abs(x) >= 65520, np.sign(x) * np.inf, want)   # to nearest: overflows as RINT does
    want = want.astype(np.float16)
    assert np.array_equal(got[:case.n], want, equal_nan=True), np.flatnonzero(got[:case.n] != want)[:5]


def test_cast_float_to_bfloat16_and_half_to_uint8(outputs):
    for mode in ("RINT", "ROUND", "TRUNC"):
        case, got = _sim(outputs, f"Cast float>bfloat16 {mode}")
        bits = case.a[:case.n].view(np.uint32).astype(np.uint64)
        finite = np.isfinite(case.a[:case.n])
        want = {"RINT": (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16, "ROUND": (bits + 0x8000) >> 16,
                "TRUNC": bits >> 16}[mode]
        assert np.array_equal(got[:case.n][finite], want[finite].astype(np.uint16)), mode
    case, got = _sim(outputs, "Cast half>uint8 NONE")
    x = case.a.astype(np.float64)
    want = np.where(np.isnan(x), 0, np.clip(np.rint(np.nan_to_num(x, posinf=255)), 0, 255)).astype(np.uint8)
    assert np.array_equal(got[:case.n], want)


def test_level0_masks_strides_and_the_pair_form(outputs):
    for dtype in ("half", "float"):
        t = _f(dtype)
        lanes, per = 256 // np.dtype(t).itemsize, 32 // np.dtype(t).itemsize
        case, got = _sim(outputs, f"AddL0 {dtype} mask {lanes // 2 + 3}")
        want = case.init.copy()
        for r in range(3):
            sl = slice(r * lanes, r * lanes + lanes // 2 + 3)
            want[sl] = (case.a[sl].astype(np.float64) + case.b[sl]).astype(t)
        assert np.array_equal(got, want), dtype
        case, got = _sim(outputs, f"AddL0 {dtype} strided")   # dst blk 2, src1 blk 2, dst rep 16, src1 rep 16
        want = case.init.copy()
        for r in range(2):
            for i in range(lanes):
                blk, off = divmod(i, per)
                d = (r * 16 + blk * 2) * per + off
                want[d] = t(np.float64(case.a[(r * 8 + blk) * per + off]) + case.b[(r * 16 + blk * 2) * per + off])
        assert np.array_equal(got, want), dtype
        case, got = _sim(outputs, f"PairAdd {dtype}")
        n = case.n
        pairs = case.a.reshape(-1, 2, per)
        want = case.init.copy()
        want[:n // 2] = (pairs[:, 0].astype(np.float64) + pairs[:, 1]).astype(t).reshape(-1)
        assert np.array_equal(got, want), dtype
        case, got = _sim(outputs, f"ReduceDataBlockMax {dtype}")
        want = case.init.copy()
        want[:n // per] = case.a.reshape(-1, per).max(axis=1)
        assert np.array_equal(got, want), dtype
        case, got = _sim(outputs, f"Brcb {dtype}")
        assert np.array_equal(got[:64 * per], np.repeat(case.a[:64], per)), dtype


@pytest.mark.parametrize("dtype", ["half", "float"])
def test_compares_bits_and_select(outputs, dtype):
    ops = {"LT": np.less, "GT": np.greater, "EQ": np.equal, "LE": np.less_equal, "GE": np.greater_equal,
           "NE": np.not_equal}
    for name, f in ops.items():
        case, got = _sim(outputs, f"Compares {dtype} {name}")
        with np.errstate(invalid="ignore"):
            bits = np.packbits(f(case.a, case.scalar), bitorder="little")
        raw = got.view(np.uint8)
        assert np.array_equal(raw[:bits.size], bits), name
    t = _f(dtype)
    case, got = _sim(outputs, f"SelectTS {dtype}")
    sel = np.unpackbits(case.b, bitorder="little")[:case.n].astype(bool)
    want = case.init.copy()
    want[:case.n] = np.where(sel, case.a[:case.n], t(case.scalar))
    assert np.array_equal(got, want)
    case, got = _sim(outputs, f"SelectTT {dtype}")
    want[:case.n] = np.where(sel, case.a[:case.n], case.c[:case.n])
    assert np.array_equal(got, want)


def test_data_copies_with_strides_and_padding(outputs):
    case, got = _sim(outputs, "DataCopyIn strided")          # 5 bursts of 3 blocks, src gap 2, dst gap 1
    want = case.init.copy()
    for k in range(5):
        want[k * 4 * 8:(k * 4 + 3) * 8] = case.a[k * 5 * 8:(k * 5 + 3) * 8]
    assert np.array_equal(got, want)
    case, got = _sim(outputs, "DataCopyOut strided")         # src gap 1, dst gap 2
    want = case.init.copy()
    for k in range(5):
        want[k * 5 * 8:(k * 5 + 3) * 8] = case.a[k * 4 * 8:(k * 4 + 3) * 8]
    assert np.array_equal(got, want)
    # GM -> UB with padding: rows of 32-byte blocks; padding and the rest of the row (dummy)
    # hold paddingValue, or, with no padding asked, the row's first element
    for name, (count, length, sgap, dgap, is_pad, left, right) in (
            ("no pad", (3, 38, 6, 1, 0, 0, 0)), ("pad 2+3", (3, 38, 6, 1, 1, 2, 3)),
            ("pad right 6", (4, 20, 0, 0, 1, 0, 6)), ("2 bytes", (1, 2, 0, 0, 0, 0, 0))):
        case, got = _sim(outputs, f"DataCopyPadIn half {name}")
        want = case.init.copy()
        elems = length // 2
        row = -(-(left + elems + right) // 16) * 16
        for k in range(count):
            src = case.a[k * (elems + sgap // 2):k * (elems + sgap // 2) + elems]
            at = k * (row + dgap * 16)
            fill = np.float16(case.scalar) if (left or right) else src[0]
            want[at:at + row] = fill
            want[at + left:at + left + elems] = src
        assert np.array_equal(got, want), name
    for name, (count, length, sgap, dgap) in (("rows", (3, 40, 1, 8)), ("4 bytes", (1, 4, 0, 0)),
                                              ("gaps", (2, 100, 0, 12))):
        case, got = _sim(outputs, f"DataCopyPadOut float {name}")
        want = case.init.copy()
        e, row = length // 4, -(-length // 32) * 8
        for k in range(count):
            at = k * (e + dgap // 4)
            want[at:at + e] = case.a[k * (row + sgap * 8):k * (row + sgap * 8) + e]
        assert np.array_equal(got, want), name


def _bf16_to_f32(bits):
    return (np.asarray(bits, np.uint32) << 16).view(np.float32)


def test_matmul_through_l1_l0_mmad_and_fixpipe(outputs):
    """C = A B^T (B n x k) or A B (B k x n): L1 NZ, L0A/L0B fractals, fp32 accumulation in k
    order, the fixpipe's row-major write (rounded to nearest even for 16-bit results)."""
    names = [n for n in outputs if n.startswith("Matmul") and not n.startswith("MatmulBTunitMixed")]
    assert len(names) >= 11
    for name in names:
        case, raw, _ = outputs[name]
        assert raw is not None, name
        m, k, n, _ = case.ints
        src, dst = case.type.split(">")
        a = case.a.astype(np.float32) if src == "half" else _bf16_to_f32(case.a)
        b = case.b.astype(np.float32) if src == "half" else _bf16_to_f32(case.b)
        a = a.reshape(m, k)
        bt = case.op in ("MatmulBT", "MatmulBTunit")
        b = b.reshape(n, k).T.copy() if bt else b.reshape(k, n).copy()
        if bt and case.ints[3]:
            b[:, n - 3:] = 0                                  # B's rows past n - 3 were zeroed in L1
        if case.op == "MatmulBzz":
            b[case.ints[3]:, :] = 0                           # B's rows past the valid ones are zero
        acc = np.zeros((m, n), np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            for kk in range(k):
                acc = acc + a[:, kk:kk + 1] * b[kk:kk + 1, :]
            if dst == "half":
                want = acc.astype(np.float16)
            elif dst == "bfloat16":
                bits = acc.view(np.uint32).astype(np.uint64)
                want = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            else:
                want = acc
        got = st.as_array(raw, dst if dst != "bfloat16" else "bfloat16")
        assert np.array_equal(got[:m * n], want.reshape(-1), equal_nan=True), name
        assert np.array_equal(got[m * n:case.init.size], case.init[m * n:]), name


@pytest.mark.parametrize("dtype", ["half", "float"])
def test_compares_runs_under_the_mask_a_level0_call_left(outputs, dtype):
    """Compares (level 2) sets no mask in Huawei's implementation: after a level-0 call with a
    mask of half a repeat's lanes, only those lanes of each repeat are compared (the simulator
    writes 0 for the others). The kernels' Replicate8 then Compares (pasa) meets exactly this."""
    case, got = _sim(outputs, f"ComparesAfterL0 {dtype} NE")
    lanes = 256 // np.dtype(_f(dtype)).itemsize
    active = (np.arange(case.n) % lanes) < case.ints[1]
    with np.errstate(invalid="ignore"):
        bits = np.packbits((case.a[:case.n] != case.scalar) & active, bitorder="little")
    assert np.array_equal(got.view(np.uint8)[:bits.size], bits)


def test_a_fixpipe_without_unit_flag_after_a_mad_with_it_is_rejected(outputs):
    """MatmulBTunitMixed: the mad sets its fractals' unit flags (3), the fixpipe reads them without
    unitFlag, so no later mad with unitFlag could write them: the simulator stops, naming the
    fixpipe (the emulation refuses the call too). MatmulBTunit, the same matmul handed over by unit
    flag on both, runs with no M_FIX flag and no hazard (test_matmul_through_l1_l0_mmad_and_fixpipe)."""
    case = next(c for c in st.cases() if c.op == "MatmulBTunitMixed")
    assert outputs[case.name][1] is None and outputs[case.name][2] is None
    line = st.case_line(case, 0, tempfile.mkdtemp(prefix="pasa-sim-unit-flag-"))
    proc = subprocess.run([os.path.join(_build_dir(), "api_sim")], input=line + "\n", capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "copy_matrix_cc_to_gm: reads L0C fractal at byte 0 without unitFlag" in proc.stderr, proc.stderr


def test_a_missing_wait_flag_is_reported_as_a_pipe_hazard(outputs):
    """The load's WaitFlag<MTE2_V> left out (case AddNoWait): the simulator's happens-before
    check (sim_hazards.h) stops the program, naming the GM -> UB copy on MTE2 and the vadd on V
    that reads what it writes; the same call with the wait runs (every other case)."""
    case = next(c for c in st.cases() if c.op == "AddNoWait")
    assert outputs[case.name][1] is None, "the simulator ran a call with a missing WaitFlag"
    work = tempfile.mkdtemp(prefix="pasa-sim-hazard-")
    line = st.case_line(case, 0, work)
    proc = subprocess.run([os.path.join(_build_dir(), "api_sim")], input=line + "\n", capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    message = proc.stderr
    assert "pipe hazard (read after write) on UB" in message, message
    assert "copy_gm_to_ubuf on MTE2" in message and "vadd on V" in message, message
