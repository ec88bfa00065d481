"""The parameter table of the NPU timing model (Atlas A2 / Ascend 910B1): the one definition.

The AscendC emulation (``pasa_npu._ascendc_emu``) times every launch with these numbers
(``ascend_kernels/TIMING_MODEL.md`` describes the model). Each entry carries its value, its
unit, where it comes from and, for the entries that no public document gives, a range: such an
entry is an assumption, and ``corner("fast")`` / ``corner("slow")`` move every assumption to
the end of its range that makes the model faster or slower (the band ``pasa-npu-model``
reports). Nothing here was measured on an NPU by this project.

Source keys (read in the public documents named; cited here in our own words):

* ``INI``: CANN platform file ``Ascend910B1.ini`` (mirror ``leideng/CANN-8.1.RC1``,
  ``data/platform_config``): core counts, clock, per-core memory rates.
* ``CUBE``: asc-devkit documentation, appendix "Cube指令理论性能汇总" (Atlas A2 tables).
* ``VEC``: asc-devkit documentation, appendix "Vector指令理论性能汇总" (Atlas A2 tables); the
  per-instruction rates live next to the code that uses them (``emu/emu_timing.h``).
* ``L2DOC``: asc-devkit guide, "L2 Cache切分" (an example that assumes about 7 TB/s of mixed
  L2 bandwidth and about 1.6 TB/s to GM).
* ``HWC``: Ascend C programming guide, hardware constraints (instruction queue depth).
* ``GEMM``: CANN's matmul cache-tiling cost model constants (L2/HBM latencies and rates;
  aggregate L2 2550 B/cycle, per-core L2 128 B/cycle).
* ``FAFIT``: a cycle model of a hand-written FlashAttention kernel for A2 fitted to simulator
  and board traces (``kernels/manual/common/flash_atten/scripts/fa_cost_model.py`` of the
  PTO-ISA mirror): launch overhead and cross-core hand-off costs.
* ``ADD``: asc-devkit's high-performance Add example (measured on a 910B1): scalar loop cost.

An entry whose source reads "no public source" is an assumption through and through; its
range is our guess at what is plausible, and ``pasa-npu-model --sensitivity`` shows what each
end does to the result.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Param:
    """One entry: ``value`` in ``unit``; ``low``/``high`` bound an uncertain value (no public
    source, or sources that disagree; None: one source gives it).
    ``faster``: which end of the range makes the model faster ("high" for rates)."""

    name: str
    value: float
    unit: str
    source: str
    low: Optional[float] = None
    high: Optional[float] = None
    faster: str = "low"

    @property
    def assumption(self) -> bool:
        return self.low is not None


def _rate(name, value, unit, source, low=None, high=None):
    return Param(name, value, unit, source, low, high, faster="high")


def _cost(name, value, unit, source, low=None, high=None):
    return Param(name, value, unit, source, low, high, faster="low")


#: The platform: how many AI Cores the host tiles for, and the clock that turns cycles into time.
PLATFORM = (
    Param("core_num", 24, "AI Cores (1 AIC + 2 AIV each)", "INI: ai_core_cnt=24, vector_core_cnt=48"),
    Param("clock_mhz", 1850, "MHz", "INI: cube_freq=1850"),
)

#: The timing model proper (every name is a field of emu::TimingParams).
TIMING = (
    _rate("cube_macs_per_cycle", 4096, "fp16 MAC/cycle per AIC",
          "CUBE table 1: half Mmad 16 x 16 x 16 per cycle; INI cube_m/n/k_size=16"),
    _cost("mmad_head_cycles", 20, "cycles per Mmad",
          "no public source: CUBE gives the formula's fixed term (Δt) without a value", 8, 64),
    _rate("mte1_l0a_bytes_per_cycle", 256, "B/cycle", "CUBE table 3: LoadData 2D, L1 -> L0A"),
    _rate("mte1_l0b_bytes_per_cycle", 128, "B/cycle", "CUBE table 3: LoadData 2D, L1 -> L0B"),
    _cost("mte1_head_cycles", 16, "cycles per LoadData/Fill",
          "no public source: CUBE gives the transfer's fixed term (ΔT) without a value", 8, 48),
    _rate("mte2_bytes_per_cycle", 110, "B/cycle per AI Core (its 3 MTE2 engines share it)",
          "INI l2_read_rate=110 per AI Core (L2-resident data; unit not stated in the file, read as "
          "B/cycle); GEMM: 128 per core from L2; range: half the file's rate to GEMM's", 55, 128),
    _cost("mte2_head_cycles", 16, "cycles per GM read", "no public source", 8, 64),
    _cost("gm_read_latency_cycles", 236, "cycles", "GEMM: L2 read latency 236 (HBM 347)", 150, 347),
    _rate("mte3_bytes_per_cycle", 64, "B/cycle per engine",
          "INI ub_to_l2_rate=64 (per AI Core in the file, here one engine alone); range: half to all "
          "of the AI Core's write rate (assumption)", 43, 86),
    _rate("core_write_bytes_per_cycle", 86, "B/cycle per AI Core (MTE3 x 2 and Fixpipe share it)",
          "INI l2_write_rate=86 per AI Core; range: half the file's rate to its read rate", 43, 110),
    _cost("mte3_head_cycles", 16, "cycles per GM write", "no public source", 8, 64),
    _cost("gm_write_latency_cycles", 96, "cycles", "GEMM: L2 write latency 96 (HBM 203)", 96, 203),
    _rate("fix_bytes_per_cycle", 128, "output B/cycle",
          "no public source for L0C -> GM; CUBE table 7 gives 64 elements (128 B)/cycle for "
          "L0C -> L1 with F322F16", 64, 128),
    _cost("fix_head_cycles", 16, "cycles per Fixpipe", "no public source", 8, 64),
    _cost("vec_head_cycles", 12, "cycles per vector instruction",
          "no public source: fixed start-up of an instruction whose result the next one reads "
          "(VEC gives rates only)", 4, 32),
    _cost("scalar_issue_cycles", 1, "scalar cycles per dispatched instruction", "no public source", 1, 4),
    _cost("scalar_ub_access_cycles", 10, "cycles per GetValue/SetValue on UB",
          "ADD case 0 (an estimate from it): about 34 cycles per element for a loop of two scalar reads, "
          "one write and the arithmetic", 5, 20),
    _cost("vs_sync_cycles", 30, "cycles per vector -> scalar synchronisation",
          "no public source", 20, 50),
    _cost("scalar_gm_access_cycles", 20, "cycles per scalar GM access that hits the data cache",
          "no public source for a hit in the scalar unit's data cache (HWC: 32 KB; 64-byte lines as "
          "DataCacheCleanAndInvalid's documentation has them; a miss costs gm_read_latency_cycles); "
          "range: assumption, from the UB scalar access's low end to twice the nominal", 5, 40),
    Param("queue_depth", 32, "instructions", "HWC: the MTE1 and MMAD instruction queues hold 32 "
          "(the other pipes assumed alike)"),
    _cost("cross_core_latency_cycles", 200, "cycles from CrossCoreSetFlag to the wait",
          "no public source for the flag alone; FAFIT's whole hand-off (Fixpipe, flag, MTE2) fits 220 (simulator) to 1000 "
          "(board) cycles per tile", 100, 1000),
    _rate("l2_aggregate_bytes_per_cycle", 2550, "B/cycle, all cores",
          "GEMM: L2_RO=2550 (CANN's matmul cost model); range up to L2DOC's assumed 7 TB/s "
          "(3784) and a third-party 8 TB/s profiler roofline (4324)", 2550, 4324),
    _rate("hbm_aggregate_bytes_per_cycle", 865, "B/cycle, all cores",
          "L2DOC: about 1.6 TB/s (1.6e12 / 1.85e9); GEMM: 850; 1.27 TB/s measured copy, "
          "1.8 TB/s roofline", 686, 973),
    _cost("launch_overhead_cycles", 10905, "cycles per launch",
          "FAFIT: fitted launch overhead 10905 cycles; range: assumption", 5000, 20000),
)

ALL = PLATFORM + TIMING
_BY_NAME = {p.name: p for p in ALL}


def _check(overrides: dict) -> None:
    unknown = sorted(set(overrides) - set(_BY_NAME))
    if unknown:
        raise ValueError(f"unknown NPU model parameter(s) {unknown}; known: {sorted(_BY_NAME)}")
    for name, value in overrides.items():
        param = _BY_NAME[name]
        positive = param.faster == "high" or param in PLATFORM or name == "queue_depth"
        if not isinstance(value, (int, float)) or not (value > 0 if positive else value >= 0):
            need = "a positive number" if positive else "a number >= 0"
            raise ValueError(f"NPU model parameter {name!r} must be {need}, got {value!r}")


def values(**overrides: float) -> dict:
    """Every parameter's value (platform and timing), with ``overrides`` applied."""
    _check(overrides)
    return {p.name: float(overrides.get(p.name, p.value)) for p in ALL}


def corner(which: str, **overrides: float) -> dict:
    """Every assumption at the end of its range that makes the model ``"fast"`` or ``"slow"``."""
    if which not in ("fast", "slow"):
        raise ValueError(f"corner must be 'fast' or 'slow', got {which!r}")
    out = values()
    for p in ALL:
        if p.assumption:
            fast_end = p.high if p.faster == "high" else p.low
            slow_end = p.low if p.faster == "high" else p.high
            out[p.name] = float(fast_end if which == "fast" else slow_end)
    _check(overrides)
    out.update({k: float(v) for k, v in overrides.items()})
    return out


def timing_only(params: dict) -> dict:
    """The subset the emulation's timing model takes (``emu::TimingParams``)."""
    return {p.name: params[p.name] for p in TIMING}


def cube_peak_tflops(params: dict) -> float:
    """Dense fp16 cube peak of the chip: cores x MACs/cycle x 2 FLOP x clock."""
    return params["core_num"] * params["cube_macs_per_cycle"] * 2 * params["clock_mhz"] * 1e6 / 1e12
