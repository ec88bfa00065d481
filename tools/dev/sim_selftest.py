"""The AscendC API calls our kernels make, run through both emulations and compared bit for bit.

    python tools/dev/sim_selftest.py [--keep DIR]

ascend_kernels/sim/selftest/api_selftest.cpp is built twice: against the asc-devkit headers and
the instruction-level simulator (Huawei's implementation of each API, down to the simulated
instructions), and against ascend_kernels/emu (the project's emulation). ``CASES`` are run
through both; every case whose outputs differ is printed with its first differing elements.
Exit status 0 when none differs, 1 when some do, 2 when nothing can be built here.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import numpy as np

from pasa_npu import sim_build

SOURCE = os.path.join(sim_build.SIM, "selftest", "api_selftest.cpp")
EMU = sim_build.EMU
DTYPES = {"half": np.float16, "float": np.float32, "bfloat16": np.uint16, "uint8": np.uint8,
          "uint16": np.uint16, "int16": np.int16, "int32": np.int32}
# RoundMode values (impl/basic_api/common_types.h)
CAST_NONE, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD = range(7)
# CMPMODE values
LT, GT, EQ, LE, GE, NE = range(6)


@dataclass
class Case:
    """One API call: ``op`` on operands a, b, c (UB; a also in GM), destination starting as
    ``init``; ``out_type`` the destination's element type (for comparisons and display)."""
    name: str
    op: str
    type: str
    n: int
    a: np.ndarray
    b: np.ndarray | None = None
    c: np.ndarray | None = None
    init: np.ndarray | None = None
    scalar: float = 0.0
    ints: tuple = ()
    out_type: str = field(default="")

    def __post_init__(self):
        if not self.out_type:
            self.out_type = self.type.split(">")[-1]


def _bytes(x) -> bytes:
    if x is None:
        return b""
    raw = np.ascontiguousarray(x).tobytes()
    return raw + b"\0" * (-len(raw) % 32)


def build_sim(out_dir: str) -> str:
    return sim_build.build(SOURCE, os.path.join(out_dir, "api_sim"))


def build_emu(out_dir: str) -> str:
    cmd = [sim_build.compiler() or "g++", "-std=c++17", "-O1", "-w", "-ffp-contract=off", "-DPASA_SELFTEST_EMU",
           f"-I{EMU}", SOURCE, "-pthread"]
    return sim_build.compile_cached(cmd, [SOURCE, *sim_build.sources(EMU)], os.path.join(out_dir, "api_emu"))


def case_line(case: Case, k: int, work: str) -> str:
    """The program's input line of ``case``, its operand files written into ``work`` as number
    ``k`` (its output goes to ``work``/k.out)."""
    files = []
    for part in ("a", "b", "c", "init"):
        path = os.path.join(work, f"{k}.{part}")
        with open(path, "wb") as f:
            f.write(_bytes(getattr(case, part)))
        files.append(path)
    out = os.path.join(work, f"{k}.out")
    if os.path.exists(out):
        os.remove(out)
    ints = " ".join(str(int(v)) for v in case.ints)
    return f"{case.op} {case.type} {case.n} {case.scalar!r} {' '.join(files)} {out} {ints}"


def run(program: str, cases: list[Case], work: str) -> list[bytes | None]:
    """Each case's destination bytes after the call; None where the call was rejected (an
    exception, or an abort of the program: the rest run in a new process)."""
    lines = [case_line(case, k, work) for k, case in enumerate(cases)]
    results: list[bytes | None] = [None] * len(cases)
    start = 0
    while start < len(cases):
        proc = subprocess.run([program], input="\n".join(lines[start:]) + "\n", capture_output=True, text=True,
                              timeout=600)
        done = start
        for k in range(start, len(cases)):
            out = os.path.join(work, f"{k}.out")
            if os.path.exists(out):
                results[k] = open(out, "rb").read()
                done = k + 1
        if proc.returncode >= 0:
            break
        start = done + 1  # killed by a signal (an assertion): case `done` was rejected
    return results


def as_array(raw: bytes, out_type: str) -> np.ndarray:
    return np.frombuffer(raw, DTYPES.get(out_type, np.uint8))


def differences(case: Case, x: bytes | None, y: bytes | None, limit: int = 6) -> str | None:
    """None when the two outputs are the same bytes, else a description."""
    if x is None and y is None:
        return None  # both reject the call
    if x is None or y is None:
        return f"ran on {'emu only' if x is None else 'sim only'}"
    if x == y:
        return None
    dt = DTYPES.get(case.out_type, np.uint8)
    size = np.dtype(dt).itemsize
    if len(x) % size or len(x) != len(y):
        dt, size = np.uint8, 1
    a, b = np.frombuffer(x, dt), np.frombuffer(y, dt)
    where = np.flatnonzero(a.view(f"u{size}") != b.view(f"u{size}"))
    shown = ", ".join(f"[{i}] {a[i]!r} vs {b[i]!r}" for i in where[:limit])
    return f"{where.size} of {a.size} elements differ: {shown}"


# ------------------------------------------------------------------ the cases

def _operands(dtype, n, seed, low=-1e3, high=1e3):
    rng = np.random.default_rng(seed)
    x = np.exp2(rng.uniform(-8, np.log2(high), n)) * rng.choice([-1, 1], n)
    x = np.clip(x, low, high).astype(np.float32)
    if dtype == "half":
        x = x.astype(np.float16)
        x[:64] = (1.0 + np.arange(64) * 2.0 ** -10).astype(np.float16)   # ties for 2^-11
    return x


def _init(dtype, count):
    """A destination's starting contents: a recognisable pattern, so unwritten parts show."""
    pattern = np.arange(count, dtype=np.float32) * 0.25 - 7.0
    return pattern.astype(DTYPES[dtype]) if dtype in ("half", "float") else (np.arange(count) % 251).astype(
        DTYPES[dtype])


def cases() -> list[Case]:
    """Every case, in a fixed order: the vector calls for half then float, then the pipe
    hazard, the casts, the 16-bit And, the cube's matmuls and the data movement."""
    out = []
    for dt in ("half", "float"):
        out += (_elementwise_cases(dt) + _level0_cases(dt) + _compare_cases(dt)
                + _reduce_edge_cases(dt) + _select_cases(dt))
    return (out + _hazard_cases() + _cast_cases() + _and_cases() + _matmul_cases()
            + _data_movement_cases())


def _elementwise_cases(dt) -> list[Case]:
    """Element-wise and reduction calls on ``dt`` at three lengths (full and partial repeats)."""
    out = []
    for n in (4096, 1000, 77):
        a, b = _operands(dt, n, 1), _operands(dt, n, 2)
        b[:64] = 2.0 ** -11
        if n > 70:
            a[65] = b[64] = np.nan
        init = _init(dt, n + 64)
        for op in ("Add", "Sub", "Mul", "Div", "Max"):
            out.append(Case(f"{op} {dt} n={n}", op, dt, n, a, b, init=init))
        for op, s in (("Adds", 2.0 ** -11), ("Muls", 0.1)):
            out.append(Case(f"{op} {dt} n={n}", op, dt, n, a, init=init, scalar=s))
        out.append(Case(f"Abs {dt} n={n}", "Abs", dt, n, a, init=init))
        out.append(Case(f"Duplicate {dt} n={n}", "Duplicate", dt, n, a, init=init, scalar=-2.5))
        e = np.clip(a, -11, 11).astype(a.dtype)
        out.append(Case(f"Exp {dt} n={n}", "Exp", dt, n, e, init=init))
        out.append(Case(f"Ln {dt} n={n}", "Ln", dt, n, np.abs(a) + a.dtype.type(0.5), init=init))
        r = _operands(dt, n, 3, -1.0, 1.0)
        out.append(Case(f"ReduceSum {dt} n={n}", "ReduceSum", dt, n, r, init=_init(dt, 32)))
        out.append(Case(f"ReduceMax {dt} n={n}", "ReduceMax", dt, n, r, init=_init(dt, 32)))
    return out


def _level0_cases(dt) -> list[Case]:
    """Level-0 calls on ``dt``: partial masks, strides, the kernels' row broadcasts and pair forms."""
    out = []
    lanes = 128 if dt == "half" else 64
    # level 0 with a partial mask and strides; the kernels' pair form
    n = 8 * lanes
    a, b = _operands(dt, n, 4), _operands(dt, n, 5)
    out.append(Case(f"AddL0 {dt} mask {lanes // 2 + 3}", "AddL0", dt, n, a, b, init=_init(dt, n),
                    ints=(lanes // 2 + 3, 3, 1, 1, 1, 8, 8, 8)))
    out.append(Case(f"AddL0 {dt} strided", "AddL0", dt, n, a, b, init=_init(dt, n),
                    ints=(lanes, 2, 2, 1, 2, 16, 8, 16)))
    out.append(Case(f"MaxL0 {dt} strided", "MaxL0", dt, n, a, b, init=_init(dt, n),
                    ints=(lanes, 4, 1, 2, 1, 8, 16, 8)))
    # the kernels' row broadcasts: dst row r = op(src row r, the broadcast block r), rows of
    # `cols` elements (mask cols), src1 block stride 0 and repeat stride 1
    per = 32 // (2 if dt == "half" else 4)
    for op in ("MulL0", "DivL0", "SubL0"):
        for cols in (32, 48):
            out.append(Case(f"{op} {dt} row broadcast cols={cols}", op, dt, n, a, b, init=_init(dt, n),
                            ints=(cols, 64 if cols * 64 <= n else n // cols, 1, 1, 0, cols // per, cols // per, 1)))
    out.append(Case(f"PairAdd {dt}", "PairAdd", dt, n, a, init=_init(dt, n)))
    out.append(Case(f"PairMax {dt}", "PairMax", dt, n, a, init=_init(dt, n)))
    out.append(Case(f"ReduceDataBlockSum {dt}", "ReduceDataBlockSum", dt, n, a, init=_init(dt, n),
                    ints=(lanes, 8, 1, 1, 8)))
    out.append(Case(f"ReduceDataBlockMax {dt}", "ReduceDataBlockMax", dt, n, a, init=_init(dt, n),
                    ints=(lanes, 8, 1, 1, 8)))
    out.append(Case(f"Brcb {dt}", "Brcb", dt, 64, a[:64], init=_init(dt, 64 * 32 // (2 if dt == 'half' else 4)),
                    ints=(8, 1, 8)))
    return out


def _compare_cases(dt) -> list[Case]:
    """Compares on ``dt`` in every mode, after a level-0 call, and with a partial repeat."""
    out = []
    lanes = 128 if dt == "half" else 64
    n = 8 * lanes
    # Compares and Select (bits in b)
    x = _operands(dt, n, 6)
    for mode, name in ((LT, "LT"), (GT, "GT"), (EQ, "EQ"), (LE, "LE"), (GE, "GE"), (NE, "NE")):
        y = x.copy()
        y[::7] = 3.0
        y[5] = np.nan
        out.append(Case(f"Compares {dt} {name}", "Compares", dt, n, y, init=_init(dt, n), scalar=3.0,
                        ints=(mode,)))
    out.append(Case(f"ComparesAfterL0 {dt} NE", "ComparesAfterL0", dt, n, x, init=_init(dt, n), scalar=0.0,
                    ints=(NE, lanes // 2)))
    y = x.copy()
    y[::5] = 3.0
    out.append(Case(f"Compares {dt} GE partial repeat", "Compares", dt, n - lanes // 2, y, init=_init(dt, n),
                    scalar=3.0, ints=(GE,)))
    return out


def _reduce_edge_cases(dt) -> list[Case]:
    """ReduceMax and ReduceSum on ``dt`` with a tie, NaNs, and only negative values."""
    out = []
    lanes = 128 if dt == "half" else 64
    n = 8 * lanes
    r = _operands(dt, n, 12, -1.0, 1.0)
    r[[7, 300]] = r.max() + 1            # a tie for the maximum
    out.append(Case(f"ReduceMax {dt} tie", "ReduceMax", dt, n - 5, r, init=_init(dt, 32)))
    r = r.copy()
    r[[40, 301]] = np.nan
    out.append(Case(f"ReduceMax {dt} NaN", "ReduceMax", dt, n - 5, r, init=_init(dt, 32)))
    out.append(Case(f"ReduceSum {dt} NaN", "ReduceSum", dt, n - 5, r, init=_init(dt, 32)))
    neg = -np.abs(_operands(dt, n, 13)) - 1
    out.append(Case(f"ReduceMax {dt} negative", "ReduceMax", dt, n, neg, init=_init(dt, 32)))
    return out


def _select_cases(dt) -> list[Case]:
    """Select on ``dt``, the choice bits in b."""
    out = []
    lanes = 128 if dt == "half" else 64
    n = 8 * lanes
    x = _operands(dt, n, 6)
    bits = np.random.default_rng(7).integers(0, 256, n // 8 + 32).astype(np.uint8)
    out.append(Case(f"SelectTS {dt}", "SelectTS", dt, n - lanes // 2, x, bits, init=_init(dt, n), scalar=-2.5))
    out.append(Case(f"SelectTT {dt}", "SelectTT", dt, n - lanes // 2, x, bits, _operands(dt, n, 8),
                    init=_init(dt, n)))
    return out


def _hazard_cases() -> list[Case]:
    """A call the emulations must reject as a pipe hazard."""
    out = []
    # the load's WaitFlag<MTE2_V> left out: Add reads UB that MTE2 may still be writing (both
    # emulations reject the call as a pipe hazard)
    a, b = _operands("half", 1000, 1), _operands("half", 1000, 2)
    out.append(Case("AddNoWait half missing WaitFlag", "AddNoWait", "half", 1000, a, b, init=_init("half", 1064)))
    return out


def _cast_cases() -> list[Case]:
    """The casts the kernels make, in each rounding mode they name."""
    out = []
    # casts the kernels make
    f = (np.random.default_rng(9).standard_normal(2048) * 1e3).astype(np.float32)
    f[:4] = [1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 70000.0, np.nan]
    for mode, name in ((CAST_RINT, "RINT"), (CAST_NONE, "NONE"), (CAST_ROUND, "ROUND"), (CAST_FLOOR, "FLOOR"),
                       (CAST_CEIL, "CEIL"), (CAST_TRUNC, "TRUNC"), (CAST_ODD, "ODD")):
        out.append(Case(f"Cast float>half {name}", "Cast", "float>half", 2000, f, init=_init("half", 2048),
                        ints=(mode,)))
    g = f.copy()
    g[:2] = [1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8]
    for mode, name in ((CAST_RINT, "RINT"), (CAST_ROUND, "ROUND"), (CAST_TRUNC, "TRUNC")):
        out.append(Case(f"Cast float>bfloat16 {name}", "Cast", "float>bfloat16", 2000, g,
                        init=_init("uint16", 2048), ints=(mode,)))
    with np.errstate(over="ignore"):
        h = f.astype(np.float16)
    out.append(Case("Cast half>float NONE", "Cast", "half>float", 2000, h, init=_init("float", 2048),
                    ints=(CAST_NONE,)))
    flags = np.array([0, 1, 0.5, 1.5, 2.5, 255, 300, -1, np.nan, np.inf] * 26, np.float16)[:256]
    out.append(Case("Cast half>uint8 NONE", "Cast", "half>uint8", 256, flags, init=_init("uint8", 256),
                    ints=(CAST_NONE,)))
    u8 = (np.arange(512) % 256).astype(np.uint8)
    out.append(Case("Cast uint8>half NONE", "Cast", "uint8>half", 512, u8, init=_init("half", 512),
                    ints=(CAST_NONE,)))
    return out


def _and_cases() -> list[Case]:
    """And on 16-bit words."""
    out = []
    # And on 16-bit words (the kernels' mask arithmetic)
    w = np.random.default_rng(10).integers(0, 65536, 512).astype(np.uint16)
    v = np.random.default_rng(11).integers(0, 65536, 512).astype(np.uint16)
    out.append(Case("And uint16", "And", "uint16", 500, w, v, init=_init("uint16", 512)))
    return out


def _matmul_cases() -> list[Case]:
    """The cube's matmuls."""
    out = []
    # cube: Nd2Nz, LoadData (plain and transposed), Mmad, Fixpipe row-major
    rng = np.random.default_rng(14)
    for op, types, (m, k, n), fill in (("MatmulBT", "half>half", (16, 64, 32), 0),
                                       ("MatmulBT", "half>float", (20, 40, 24), 0),
                                       ("MatmulBT", "half>half", (32, 128, 48), 1),
                                       ("MatmulBT", "bfloat16>float", (16, 32, 16), 0),
                                       ("MatmulBT", "bfloat16>bfloat16", (48, 64, 32), 0),
                                       ("MatmulB", "half>float", (32, 48, 64), 0),
                                       ("MatmulB", "half>half", (16, 128, 128), 0),
                                       ("MatmulBzz", "half>half", (32, 128, 32), 44),
                                       ("MatmulBzz", "half>float", (16, 64, 64), 64),
                                       ("MatmulBTunit", "half>half", (32, 128, 48), 0),
                                       ("MatmulBTunit", "half>float", (48, 64, 32), 0),
                                       ("MatmulBTunitMixed", "half>float", (16, 64, 32), 0)):
        src, dst = types.split(">")
        scale = 300.0 if (m, k, n) == (16, 128, 128) else 2.0      # the last overflows fp16
        a = (rng.uniform(-scale, scale, m * k)).astype(np.float32)
        b = (rng.uniform(-scale, scale, k * n)).astype(np.float32)
        if src == "half":
            a, b = a.astype(np.float16), b.astype(np.float16)
        else:
            a, b = (a.view(np.uint32) >> 16).astype(np.uint16), (b.view(np.uint32) >> 16).astype(np.uint16)
        out.append(Case(f"{op} {types} {m}x{k}x{n}{f' fill{fill}' if fill else ''}", op, types, 0, a, b,
                        init=_init("uint16" if dst == "bfloat16" else dst, m * n + 64), ints=(m, k, n, fill)))
    return out


def _data_movement_cases() -> list[Case]:
    """DataCopy forms: counted, strided, padded in and out."""
    out = []
    # data movement
    src = np.arange(4096, dtype=np.float32)
    out.append(Case("DataCopyCount float", "DataCopyCount", "float", 1024, src, init=_init("float", 1024)))
    out.append(Case("DataCopyIn strided", "DataCopyIn", "float", 0, src, init=_init("float", 2048),
                    ints=(5, 3, 2, 1)))
    out.append(Case("DataCopyOut strided", "DataCopyOut", "float", 0, src, init=_init("float", 2048),
                    ints=(5, 3, 1, 2)))
    hs = np.arange(4096, dtype=np.float16)
    for ints, name in (((3, 38, 6, 1, 0, 0, 0), "no pad"), ((3, 38, 6, 1, 1, 2, 3), "pad 2+3"),
                       ((4, 20, 0, 0, 1, 0, 6), "pad right 6"), ((1, 2, 0, 0, 0, 0, 0), "2 bytes")):
        out.append(Case(f"DataCopyPadIn half {name}", "DataCopyPadIn", "half", 0, hs, init=_init("half", 512),
                        scalar=-3.0, ints=ints))
    for ints, name in (((3, 40, 1, 8), "rows"), ((1, 4, 0, 0), "4 bytes"), ((2, 100, 0, 12), "gaps")):
        out.append(Case(f"DataCopyPadOut float {name}", "DataCopyPadOut", "float", 0, src,
                        init=_init("float", 512), ints=ints))
    u = (np.arange(256) % 7).astype(np.uint8)
    out.append(Case("DataCopyPadOut uint8 5 bytes", "DataCopyPadOut", "uint8", 0, u, init=_init("uint8", 64),
                    ints=(1, 5, 0, 0)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", help="build and work in this directory")
    ap.add_argument("-k", dest="only", default="", help="only cases whose name contains this")
    args = ap.parse_args(argv)
    reason = sim_build.why_not()
    if reason:
        print(f"sim_selftest: {reason}", file=sys.stderr)
        return 2
    work = args.keep or tempfile.mkdtemp(prefix="pasa-sim-")
    os.makedirs(work, exist_ok=True)
    sim, emu = build_sim(work), build_emu(work)
    chosen = [c for c in cases() if args.only in c.name]
    os.makedirs(os.path.join(work, "s"), exist_ok=True)
    os.makedirs(os.path.join(work, "e"), exist_ok=True)
    got_sim = run(sim, chosen, os.path.join(work, "s"))
    got_emu = run(emu, chosen, os.path.join(work, "e"))
    bad = 0
    for case, s, e in zip(chosen, got_sim, got_emu):
        d = differences(case, s, e)
        if d:
            bad += 1
            print(f"DIFF {case.name}: sim vs emu: {d}")
    print(f"{len(chosen) - bad} of {len(chosen)} cases agree bit for bit")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
