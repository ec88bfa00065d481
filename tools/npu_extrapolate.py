"""Modelled Atlas A2 time of a full-size attention call, from emulations of small ones.

Emulating a full shape is slow (every score and product is computed on the CPU), so the
model is applied in two steps:

1. **Calibration.** Small problems of the same allocation, head dim, group size, mask and
   query kind run under the emulation on one AI Core (``core_num=1``): one task of N kv
   blocks, one of 2N, four of N and, with a causal mask, a causal problem of N kv blocks
   square, where N is the shape's kv blocks a task, at most 8 (a task of few blocks cannot
   hide the next task's start behind its own pipeline, so it costs more a block). Each
   quantity Q (the core's modelled cycles, each pipe's busy cycles, the AI Core's GM read and
   write port bounds, the GM bytes, the cube <-> vector bytes, the vector instructions and
   scalar UB accesses) is fitted exactly
   by ``Q = c0 + a * tasks + b * blocks + m * masked_blocks`` (least squares over the runs).
2. **Extrapolation.** The kernel's own task iterator deals the full problem's tasks to the 24
   AI Cores (``_ascendc_emu.attention_tasks``: rows, kv blocks, fully visible blocks per task);
   each AI Core's cycles are the largest of its fitted timeline and GM port bounds summed
   over its tasks, the launch takes
   ``overhead + max(slowest core, GM bytes / L2 bandwidth, I/O bytes / HBM bandwidth)`` as the
   emulation itself does. The key preprocessing (pasa, pasa-exact) is fitted over the kv blocks
   of its busiest core from calibration runs that give it a launch of its own, its constant
   from the first run made once more with it inside the attention launch. In the full
   call it runs at the start of the attention launch, as the host arranges: its timeline, then
   SyncAll's three cross-core hops, and its port bounds come before each AI Core's attention,
   and its GM bytes join the L2 bound.
   A checked call's overflow repair (the PASA allocations) is a pass of the attention launch
   (no split kv): with no row flagged its cores read their tasks' flag bytes, which the
   attention fits include.

Every emulated run is checked against the fp64 golden (``emulate``): a run whose output is
wrong raises WrongRunError, and no figure is reported from it.

The fit is exact where a task's cost is linear in its block counts, which the deep pipeline
makes true past its first blocks; ``validate`` compares it with a direct emulation.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import numpy as np
import torch

import pasa_npu
from pasa_npu import ascendc_emu, npu_params

KV_BLOCK = 128
Q_TILE = 128
#: kv blocks a task of the calibration's runs, or the shape's blocks a task where fewer
CALIBRATION_BLOCKS = 8
#: tasks of the calibration run that fits a task's cost: the mean of the second to the fourth
#: task's (a task stream settles within them; a core of a short-task shape runs about four)
CALIBRATION_TASKS = 4
#: the AI Core's port bounds: its GM reads and writes over its read and write rates
PORTS = ("RD", "WR")
#: the AI Core quantities whose largest is its cycles (:func:`_core_cycles`)
CORE_BOUNDS = ("timeline_cycles", "busy_RD", "busy_WR")
#: the key preprocessing's fitted quantities: its AI Core's timelines and port bounds, each
#: added to the attention's own in the same launch, its GM bytes, and its cube's busy cycles
#: (read by the corner budget, not added anywhere)
PREP_QUANTITIES = CORE_BOUNDS + ("gm_bytes", "busy_M")
QUANTITIES = ("core_cycles", "timeline_cycles", "gm_bytes", "exchange_bytes", "vector_instructions",
              "scalar_ub_accesses") + tuple(f"busy_{p}" for p in ascendc_emu.PIPES + PORTS)


@dataclass(frozen=True)
class Config:
    """What a calibration depends on: allocation, head dim, query heads per kv head, causal
    mask, whether the query is one token (decode), the tiling: ``q_block`` query rows by
    ``kv_block`` keys, and the kv blocks a task of its calibration runs (``blocks``);
    ``vector_prob_sums`` (pasa): its row sums of P' on the vector cores, not on the cube (the
    host's tiling choice of that name)."""

    algorithm: str
    d: int
    group: int = 1
    causal: bool = False
    decode: bool = False
    q_block: int = Q_TILE
    kv_block: int = KV_BLOCK
    rows: int = 0  # a prefill task of fewer rows (a query's last tile, a tail piece); 0: full tiles
    blocks: int = CALIBRATION_BLOCKS
    vector_prob_sums: bool = False

    def with_rows(self, rows: int) -> "Config":
        """The config of this tiling's one-head prefill tasks of ``rows`` rows."""
        return replace(self, group=1, decode=False, rows=rows)

    @property
    def tile(self) -> str:
        """The tiling as the reports name it (:func:`tile_name`)."""
        return tile_name(self.q_block, self.kv_block, vector_prob_sums=self.vector_prob_sums)

    @property
    def forced(self) -> dict:
        """The host tiling choices its runs force beyond the tile (``ascendc_emu.forcing_tiling``)."""
        return dict(vector_prob_sums=1) if self.vector_prob_sums else {}


#: the reports' mark of a pasa tiling with its row sums of P' on the vector cores
VECTOR_SUMS_MARK = "vsums"


def tile_name(q_block: int, kv_block: int, tail_pieces: int = 0, vector_prob_sums: bool = False) -> str:
    """A tiling as the reports name it: q_block x kv_block, `whole` where the host's
    ``tail_pieces`` choice is 1 (no task of a part-filled last round cut into pieces), and
    VECTOR_SUMS_MARK where pasa sums P' on the vector cores."""
    return (f"{q_block}x{kv_block}" + (" whole" if tail_pieces == 1 else "")
            + (f" {VECTOR_SUMS_MARK}" if vector_prob_sums else ""))


@dataclass
class Fit:
    """Per quantity: coefficients (c0, per task, per block, per masked block); preprocessing:
    (c0, per kv block) of each of PREP_QUANTITIES."""

    config: Config
    coef: dict = field(default_factory=dict)
    prep: dict = field(default_factory=dict)
    golden_rmse: float = 0.0  # the largest relative RMSE against the fp64 golden of the runs fitted

    def per_block(self, quantity: str) -> float:
        return float(self.coef[quantity][2])

    def block_cycles(self) -> float:
        """One kv block's cycles on one AI Core: the largest of its CORE_BOUNDS per block."""
        return max(self.per_block(q) for q in CORE_BOUNDS)


def _inputs(b, h, hkv, sq, skv, d, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, d, generator=gen).half()
    k = torch.randn(b, hkv, skv, d, generator=gen).half()
    v = torch.randn(b, hkv, skv, d, generator=gen).half()
    return q, k, v


class WrongRunError(RuntimeError):
    """An emulated run whose output misses the fp64 golden: its timing is not reported."""


#: a timed run counts when its relative RMSE against the fp64 golden is within this factor of
#: the torch backend's for the same allocation, the golden matrix's (tests/test_golden.py): the
#: kernels round where that backend rounds, in another order of fp32 sums, so the two errors
#: differ by the fp16 roundings that order flips (their ratio moves by some percent from one
#: CPU and torch build to another), while a wrong schedule's output misses by orders of magnitude
GOLDEN_FACTOR = 1.5


def _problem(b, h, hkv, sq, skv, d, causal):
    """The inputs and torch_npu arguments of one modelled problem."""
    args = dict(num_heads=h, num_key_value_heads=hkv, input_layout="BNSD", scale=d ** -0.5)
    if causal:
        args.update(sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask())
    return _inputs(b, h, hkv, sq, skv, d), args


def _rmse(x: torch.Tensor, gold: torch.Tensor) -> float:
    return float((x.double() - gold).norm() / gold.norm())


@functools.lru_cache(maxsize=8)
def _references(algorithm, b, h, hkv, sq, skv, d, causal, kv_block=KV_BLOCK):
    """(fp64 golden, the torch backend's relative RMSE against it at ``kv_block``) of one
    problem: the same for every parameter corner a problem is emulated under, so computed once."""
    (q, k, v), args = _problem(b, h, hkv, sq, skv, d, causal)
    gold, _ = pasa_npu.reference_attention(q, k, v, **args)
    ref, _ = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="torch", kv_block=kv_block, **args)
    return gold, _rmse(ref, gold)


def emulate(algorithm, b, h, hkv, sq, skv, d, causal, params, q_block=Q_TILE, kv_block=KV_BLOCK,
            **tiling) -> dict:
    """Run one problem under the emulation with ``params``, ``q_block``, ``kv_block`` and the forced host
    tiling choices ``tiling`` (``ascendc_emu.forcing_tiling``); its last_run_stats() plus
    ``golden_rmse`` and ``torch_rmse``: the relative RMSE of its output, and of the torch
    backend's, against the fp64 golden. Raises WrongRunError when the run's error exceeds
    GOLDEN_FACTOR times the torch backend's."""
    (q, k, v), args = _problem(b, h, hkv, sq, skv, d, causal)
    with ascendc_emu.using_model_parameters(params), ascendc_emu.forcing_tiling(**tiling):
        out, _ = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="ascendc-emu", q_block=q_block,
                                          kv_block=kv_block, **args)
    stats = ascendc_emu.last_run_stats()
    gold, torch_rmse = _references(algorithm, b, h, hkv, sq, skv, d, causal, kv_block)
    stats.update(golden_rmse=_rmse(out, gold), torch_rmse=torch_rmse)
    if not stats["golden_rmse"] <= GOLDEN_FACTOR * stats["torch_rmse"] + 1e-6:
        raise WrongRunError(
            f"{algorithm} ({b}, {h}, {hkv}, {sq}, {skv}, {d}{', causal' if causal else ''}, tile {q_block}x{kv_block}) on "
            f"{int(params['core_num'])} emulated AI Cores: relative RMSE {stats['golden_rmse']:.3g} "
            f"against the fp64 golden, torch backend {stats['torch_rmse']:.3g}; its timing is not reported")
    return stats


def _kernel_params(algorithm, b, h, hkv, sq, skv, d, causal, params, q_block, kv_block) -> dict:
    return dict(tiling_key=ascendc_emu.TILING_KEYS[algorithm], batch=b, num_heads=h,
                num_kv_heads=hkv, seq_q=sq, seq_kv=skv, head_dim=d, head_dim_v=d, q_layout=0,
                kv_layout=0, out_layout=0, out_dtype=0, in_dtype=0, mask_mode=int(causal),
                scale=d ** -0.5, beta=-1.0, q_block=q_block, kv_block=kv_block,
                core_num=int(params["core_num"]), timing=npu_params.timing_only(params))


def tasks(algorithm, b, h, hkv, sq, skv, d, causal, params, q_block=Q_TILE, kv_block=KV_BLOCK,
          tail_pieces=0) -> list:
    """Per AI Core, the (rows, blocks, fully visible blocks) of its tasks, as the kernel deals
    them (sparse mode 3: the causal band aligned to the bottom right); ``tail_pieces``: the
    host's tiling choice (0: its own, 1: no task cut into pieces). NotImplementedError where the
    host refuses the tiling."""
    lens = lambda n: np.full(b, n, dtype=np.int32)  # noqa: E731
    nxt = np.full(b, skv - sq if causal else 0, dtype=np.int32)
    p = _kernel_params(algorithm, b, h, hkv, sq, skv, d, causal, params, q_block, kv_block)
    p.update(tail_pieces=tail_pieces)
    try:
        return pasa_npu._ascendc_emu.attention_tasks(
            p, dict(q_lens=lens(sq), kv_lens=lens(skv), next_tokens=nxt, pre_tokens=lens(2 ** 31 - 1)))
    except ValueError as exc:  # a tiling the kernels cannot hold
        raise NotImplementedError(str(exc)) from None


def _quantities(att: dict) -> dict:
    out = dict(core_cycles=att["core_cycles"], timeline_cycles=att["timeline_cycles"],
               gm_bytes=att["gm_to_l1_bytes"] + att["gm_to_ub_bytes"] + att["ub_to_gm_bytes"]
               + att["l0c_to_gm_bytes"],
               exchange_bytes=att["l0c_to_gm_bytes"] + att["ub_to_gm_bytes"],
               vector_instructions=att["vector_instructions"],
               scalar_ub_accesses=att["scalar_ub_accesses"])
    out.update({f"busy_{p}": att["pipe_busy_cycles"][p] for p in ascendc_emu.PIPES})
    out.update(busy_RD=att["core_read_bound_cycles"], busy_WR=att["core_write_bound_cycles"])
    return out


def _features(task_list) -> list:
    flat = [t for core in task_list for t in core]
    return [1.0, float(len(flat)), float(sum(t[1] for t in flat)),
            float(sum(t[1] - t[2] for t in flat))]


#: the calibration runs' forced tiling: the key preprocessing in a launch of its own, so that
#: its cost per kv block is fitted apart from the attention's per task and block. The first run
#: is made once more as the kernels run it, the preprocessing inside the attention launch, for
#: what the preprocessing adds there (its own launch also starts up and reads the tiling, which
#: the attention launch does once for both; :func:`fit_runs`'s ``fused``)
CALIBRATION_TILING = dict(prep_launch=1)


def calibration_runs(c: Config, blocks: int = 0):
    """The calibration problems: (b, h, hkv, sq, skv, causal) on one AI Core, of ``blocks``
    kv blocks a task (0: ``c.blocks``)."""
    blocks = blocks or c.blocks
    sq = 1 if c.decode else max(1, c.q_block // c.group) if c.group > 1 else c.q_block
    n = c.kv_block
    if c.rows:  # one tile of c.rows rows a task; causal: its last kv block masked
        sq = c.rows
    runs = [(1, c.group, 1, sq, blocks * n, False), (1, c.group, 1, sq, 2 * blocks * n, False),
            (CALIBRATION_TASKS, c.group, 1, sq, blocks * n, False)]
    if c.causal and not c.decode:
        runs.append((1, c.group, 1, sq if c.rows else blocks * n, blocks * n, True))
    return runs


def calibrate(c: Config, params: dict, progress=None) -> Fit:
    """Fit every quantity of ``c`` under ``params`` (core_num forced to 1)."""
    one = dict(params, core_num=1)
    runs, stats = calibration_runs(c), []
    for i, (b, h, hkv, sq, skv, causal) in enumerate(runs):
        if progress:
            progress(i)
        stats.append(emulate(c.algorithm, b, h, hkv, sq, skv, c.d, causal, one, c.q_block, c.kv_block,
                             **CALIBRATION_TILING, **c.forced))
    fused = None
    if stats[0]["preprocess"] is not None:
        b, h, hkv, sq, skv, causal = runs[0]
        fused = emulate(c.algorithm, b, h, hkv, sq, skv, c.d, causal, one, c.q_block, c.kv_block, **c.forced)
    return fit_runs(c, runs, stats, one, fused)


def calibration_or_refusal(config: Config, params: dict):
    """:func:`calibrate`'s fit, or the NotImplementedError of a tiling the kernels refuse, as
    :func:`cached_calibration` keeps it."""
    try:
        return calibrate(config, params)
    except NotImplementedError as refused:
        return refused


def cached_calibration(cache: dict, key, config: Config, params: dict) -> Fit:
    """``cache[key]``, made by :func:`calibrate` at its first ask; a tiling the kernels refuse
    (NotImplementedError) is remembered as refused and raised again at every ask."""
    if key not in cache:
        cache[key] = calibration_or_refusal(config, params)
    if isinstance(cache[key], NotImplementedError):
        raise cache[key]
    return cache[key]


def fit_runs(c: Config, runs, stats, params: dict, fused: dict = None) -> Fit:
    """The fit of ``c`` from the last_run_stats()-shaped ``stats`` of the calibration ``runs``
    (with ``golden_rmse``), the tasks dealt under ``params`` (one AI Core). ``fused``: the first
    run with the key preprocessing inside the attention launch; the preprocessing's constant
    timeline is then what it adds there (the fused launch's timeline less the attention's own,
    the per-block part and the barrier's hops that :func:`extrapolate` adds)."""
    rows, values, prep_rows, prep_values = [], [], [], []
    golden = 0.0
    for (b, h, hkv, sq, skv, causal), st in zip(runs, stats):
        golden = max(golden, st["golden_rmse"])
        rows.append(_features(tasks(c.algorithm, b, h, hkv, sq, skv, c.d, causal, params, c.q_block,
                                    c.kv_block)))
        values.append(_quantities(st["attention"]))
        if st["preprocess"] is not None:
            pre = _quantities(st["preprocess"])
            prep_rows.append([1.0, float(b * hkv * -(-skv // c.kv_block))])
            prep_values.append([pre[q] for q in PREP_QUANTITIES])
        if st["repair"] is not None:  # a launch of its own only where forced (merge_launch)
            raise ValueError(f"{c}: a calibration run split its kv; the model has no merge or "
                             f"repair launch")
    a = np.array(rows)
    if not c.causal or c.decode:
        a = a[:, :3]
    fit = Fit(c, golden_rmse=golden)
    for q in QUANTITIES:
        y = np.array([v[q] for v in values])
        sol = np.linalg.lstsq(a, y, rcond=None)[0]
        fit.coef[q] = tuple(float(x) for x in sol) + ((0.0,) if a.shape[1] == 3 else ())
    if prep_rows:
        sol = np.linalg.lstsq(np.array(prep_rows), np.array(prep_values), rcond=None)[0]
        fit.prep = {q: tuple(sol[:, i]) for i, q in enumerate(PREP_QUANTITIES)}
        if fused is not None:
            per_block = fit.prep["timeline_cycles"][1]
            added = (fused["attention"]["timeline_cycles"] - stats[0]["attention"]["timeline_cycles"]
                     - per_block * prep_rows[0][1] - 3 * params["cross_core_latency_cycles"])
            fit.prep["timeline_cycles"] = (added, per_block)
    return fit


def _sum_fit(fit: Fit, quantity: str, task_list, parts: dict = None) -> float:
    """``quantity`` over ``task_list`` on one AI Core: the fit's constant, then each task's
    share from the fit of its row count (``parts``: rows -> Fit; else ``fit``'s)."""
    parts = parts or {}
    total = fit.coef[quantity][0]
    for rows, blocks, full in task_list:
        _, a, b, m = parts[rows].coef[quantity] if rows in parts else fit.coef[quantity]
        total += a + b * blocks + m * (blocks - full)
    return total


def _core_cycles(fit: Fit, task_list, before: dict = None, parts: dict = None) -> float:
    """One AI Core's cycles over ``task_list``: its timelines, or its GM read or write port
    bound where that is later (each fitted on its own, so the fit holds where the binding one
    changes between the calibration sizes and the full shape); ``before``: each of the three
    spent earlier in the same launch (the key preprocessing)."""
    before = before or {}
    return max(before.get(q, 0.0) + _sum_fit(fit, q, task_list, parts) for q in CORE_BOUNDS)


@dataclass
class Shape:
    """One full-size call: batch, query heads, kv heads, query length, kv length, head dim."""

    name: str
    b: int
    h: int
    hkv: int
    sq: int
    skv: int
    d: int
    causal: bool = False

    @property
    def decode(self) -> bool:
        return self.sq == 1

    @property
    def flops(self) -> float:
        """4 B H Sq Skv d, half of it with a causal mask (pasa-bench's convention)."""
        return 4.0 * self.b * self.h * self.sq * self.skv * self.d * (0.5 if self.causal else 1.0)

    @property
    def io_bytes(self) -> float:
        """Q, K, V, the output (fp16) and LSE (fp32): what must cross HBM at least once."""
        return (2 * self.b * self.h * self.sq * self.d * 2 + 2 * self.b * self.hkv * self.skv * self.d * 2
                + 4 * self.b * self.h * self.sq)

    def config(self, algorithm: str, q_block: int = Q_TILE, kv_block: int = KV_BLOCK,
               vector_prob_sums: bool = False) -> Config:
        """The config ``algorithm`` is calibrated at on this shape. A query of more than half a
        tile is dealt in tiles of one head, which cost what those of a group of one do (group 1);
        decode and shorter queries stack a kv group's heads into a tile (the host's rule). Its
        calibration runs tasks of the shape's kv blocks a task, at most CALIBRATION_BLOCKS."""
        stacked = self.decode or 2 * self.sq <= q_block
        blocks = min(CALIBRATION_BLOCKS, -(-self.skv // kv_block))
        return Config(algorithm, self.d, self.h // self.hkv if stacked else 1, self.causal and not self.decode,
                      self.decode, q_block, kv_block, blocks=blocks, vector_prob_sums=vector_prob_sums)


#: the host's choices for a prefill's part-filled last round the model takes the faster of:
#: its own (0: the round's tasks cut into pieces of query rows) and every task whole (1)
TAIL_CHOICES = (0, 1)


def _dealt(shape: Shape, config: Config, params: dict, tail_pieces: int = 0) -> list:
    """Per AI Core with a task, its tasks' (rows, blocks, fully visible blocks) for ``shape``."""
    per_core = tasks(config.algorithm, shape.b, shape.h, shape.hkv, shape.sq, shape.skv, shape.d,
                     shape.causal, params, config.q_block, config.kv_block, tail_pieces)
    return [t for t in per_core if t]


def _parts_of(shape: Shape, config: Config, per_core: list) -> tuple:
    """:func:`part_configs` of the tasks ``per_core`` already dealt."""
    if shape.decode:
        return ()
    rows = {t[0] for core in per_core for t in core if t[0] < config.q_block}
    return tuple(config.with_rows(r) for r in sorted(rows))


def part_configs(shape: Shape, config: Config, params: dict, tail_pieces: int = 0) -> tuple:
    """The configs of ``shape``'s prefill tasks that hold fewer rows than a tile (a query's last
    tile, the pieces of a part-filled last round), whose costs :func:`extrapolate` takes from
    fits of their own."""
    return _parts_of(shape, config, _dealt(shape, config, params, tail_pieces))


def extrapolate(shape: Shape, fit: Fit, params: dict, fit_of=None, tail_pieces: int = 0) -> dict:
    """The modelled call of ``shape``: cycles, time, binding resource, pipe busy cycles, with the
    host's ``tail_pieces`` choice (:data:`TAIL_CHOICES`). A task of fewer rows than a tile costs
    what the fit of its row count says: ``fit_of(config, params)`` makes it (by default
    :func:`calibrate`)."""
    per_core = _dealt(shape, fit.config, params, tail_pieces)
    fit_of = fit_of or calibrate
    parts = {c.rows: fit_of(c, params) for c in _parts_of(shape, fit.config, per_core)}
    overhead = params["launch_overhead_cycles"]
    before, prep_gm = {}, 0.0
    if fit.prep:  # at the start of the attention launch, then SyncAll's three cross-core hops
        blocks = shape.b * shape.hkv * -(-shape.skv // fit.config.kv_block)
        cores = min(int(params["core_num"]), blocks)
        before = {q: fit.prep[q][0] + fit.prep[q][1] * -(-blocks // cores) for q in CORE_BOUNDS}
        before["timeline_cycles"] += 3 * params["cross_core_latency_cycles"]
        prep_gm = cores * fit.prep["gm_bytes"][0] + blocks * fit.prep["gm_bytes"][1]
    busiest = max(per_core, key=lambda t: _core_cycles(fit, t, before, parts))
    core = _core_cycles(fit, busiest, before, parts)
    busy = {p: _sum_fit(fit, f"busy_{p}", busiest, parts) for p in ascendc_emu.PIPES + PORTS}
    for port in PORTS:
        busy[port] += before.get(f"busy_{port}", 0.0)
    gm = sum(_sum_fit(fit, "gm_bytes", t, parts) for t in per_core) + prep_gm
    busy["L2"] = gm / params["l2_aggregate_bytes_per_cycle"]
    busy["HBM"] = shape.io_bytes / params["hbm_aggregate_bytes_per_cycle"]
    cycles = overhead + max(core, busy["L2"], busy["HBM"])
    binding = ascendc_emu.binding_resource(busy, core)
    us = cycles / params["clock_mhz"]
    return dict(cycles=cycles, time_us=us, tflops=shape.flops / (us * 1e-6) / 1e12, binding=binding,
                tail_pieces=tail_pieces,
                binding_share=busy.get(binding, core) / (cycles - overhead), busy=busy,
                kv_gbs=2 * shape.b * shape.hkv * shape.skv * shape.d * 2 / (us * 1e-6) / 1e9)


#: the tilings each allocation is modelled at: ``q_block`` query rows by ``kv_block`` keys a tile
#: (a kv block is also the block over which pasa and pasa-exact shift the keys); each figure is
#: the allocation's at the fastest of them that its kernels take, under the parameters it is
#: modelled with
Q_BLOCKS = (128, 256)
KV_BLOCKS = (128, 256, 512, 1024)


def tiling_choices() -> str:
    """The tilings :data:`Q_BLOCKS` x :data:`KV_BLOCKS` in words, for the reports."""
    return (f"{' or '.join(map(str, Q_BLOCKS))} query rows by "
            f"{', '.join(map(str, KV_BLOCKS[:-1]))} or {KV_BLOCKS[-1]} keys")


def tilings(shape: Shape) -> tuple:
    """The (q_block, kv_block) tilings a shape is modelled at: Q_BLOCKS x KV_BLOCKS in prefill;
    decode stacks a kv group's query heads into one tile whatever q_block is."""
    return tuple((q, kv) for q in (Q_BLOCKS[:1] if shape.decode else Q_BLOCKS) for kv in KV_BLOCKS)


def candidates(shape: Shape, algorithm: str, only: tuple = None) -> tuple:
    """The configs :func:`fastest` chooses among: ``algorithm`` on ``shape`` at each of
    tilings(shape), or at the (q_block, kv_block) tilings ``only``; pasa at each both with its
    row sums of P' on the cube and on the vector cores (the host's choice for the chip)."""
    sums = (False, True) if algorithm == "pasa" else (False,)
    return tuple(shape.config(algorithm, qb, kvb, s) for qb, kvb in (only or tilings(shape)) for s in sums)


def calibrations(shape: Shape, algorithm: str, params: dict, only: tuple = None) -> tuple:
    """Every config :func:`fastest` may calibrate for ``algorithm`` on ``shape`` (among the
    tilings ``only``): each candidate tiling's, and the configs of its tasks of fewer rows
    (:func:`part_configs`)."""
    out = []
    for config in candidates(shape, algorithm, only):
        out.append(config)
        try:
            for tail in TAIL_CHOICES:
                out += part_configs(shape, config, params, tail)
        except NotImplementedError:  # the host refuses the tiling: so does its calibration
            pass
    return tuple(dict.fromkeys(out))


def fastest(shape: Shape, algorithm: str, params: dict, fit, only: tuple = None) -> tuple:
    """(config, extrapolation) of ``algorithm`` on ``shape`` at the tiling of tilings(shape) (or
    of the tilings ``only``) and the choice of TAIL_CHOICES (the extrapolation's ``tail_pieces``)
    where it is faster under ``params``; ``fit(config, params)`` calibrates (the caller caches)
    and raises NotImplementedError for a tiling the kernels refuse (its buffers do not fit the
    AI Core), which is then not a candidate."""
    best, refused = None, []
    for config in candidates(shape, algorithm, only):
        try:
            calibrated = fit(config, params)
        except NotImplementedError as exc:
            refused.append(str(exc))
            continue
        own = _dealt(shape, config, params)
        for tail in TAIL_CHOICES:
            if tail and _dealt(shape, config, params, tail) == own:
                continue  # the host cuts no task: the same dealing
            result = extrapolate(shape, calibrated, params, fit, tail)
            if best is None or result["tflops"] > best[1]["tflops"]:
                best = (config, result)
    if best is None:
        raise NotImplementedError(f"{algorithm} on {shape.name}: the kernels take none of its tilings: "
                                  + "; ".join(refused))
    return best


def validate(algorithm="pasa", d=64, causal=True, cores=4, params=None, q_block=Q_TILE,
             kv_block=KV_BLOCK, hkv=4, seq=1024) -> dict:
    """Extrapolated vs directly emulated cycles of (1, 4, ``seq``, d), ``hkv`` kv heads, on
    ``cores`` AI Cores."""
    params = dict(params or npu_params.values(), core_num=cores)
    shape = Shape("validate", 1, 4, hkv, seq, seq, d, causal)
    fit = calibrate(shape.config(algorithm, q_block, kv_block), params)
    model = extrapolate(shape, fit, params)
    stats = emulate(algorithm, 1, 4, hkv, seq, seq, d, causal, params, q_block, kv_block)
    direct = sum(stats[launch]["cycles"] for launch in ("attention", "preprocess", "repair") if stats[launch])
    return dict(extrapolated=model["cycles"], emulated=direct, error=model["cycles"] / direct - 1.0,
                golden_rmse=max(fit.golden_rmse, stats["golden_rmse"]))
