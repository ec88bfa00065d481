// Instruction-level timing of one core, from the per-instruction record (sim_pipes.h), with the
// parameters of the emulation's timing model (emu_timing.h's TimingParams: the names and
// sources of pasa_npu/npu_params.py). A model, not a measurement.
//
// Contract (the rules of ascend_kernels/TIMING_MODEL.md, applied to what Huawei's
// implementation issues rather than to the API calls).
// * The scalar unit issues every instruction in program order, paying scalar_issue_cycles
//   each (a scalar register instruction costs that and nothing more). An instruction starts on
//   its pipe at max(issue time, the pipe free); each pipe runs its instructions in order, one at
//   a time. A pipe's queue holds queue_depth instructions: the scalar unit stalls until the
//   oldest has started.
// * Cycles: MTE2 GM -> UB / L1 mte2_head + bytes / mte2_bytes_per_cycle, completing
//   gm_read_latency later; MTE3 to GM mte3_head + bytes / mte3_bytes_per_cycle (+
//   gm_write_latency); L1 fills (MTE2) and L1 -> L0A mte1_head + bytes / mte1_l0a, L0B
//   mte1_l0b; mad mmad_head + fractal steps x 4096 / cube_macs_per_cycle; fixpipe fix_head +
//   output bytes / fix_bytes_per_cycle (+ gm_write_latency to GM); a vector instruction
//   vec_head + repeats x its published cycles per repeat.
// * set_flag(src, ...) fires when src's earlier instructions have completed, latency included,
//   and src holds its next instruction until then; wait_flag(src, dst, e) holds dst's next
//   instruction until the oldest such firing (dst = S: stops the scalar unit, plus
//   vs_sync_cycles when src is V, MTE2 or MTE3). pipe_barrier(PIPE_ALL) holds everything until
//   every pipe has completed; pipe_barrier(P) holds P until P has completed. A cross-core set
//   fires as a set_flag on its pipe; the waiting core's scalar unit stops until
//   cross_core_latency_cycles after the set it consumes (sim_launch.h carries the time).
// * Report: the core's cycles (latest completion), each pipe's busy cycles and instruction
//   count, and the GM bytes each pipe moved.
#ifndef PASA_SIM_TIMING_H
#define PASA_SIM_TIMING_H

#include <deque>

#include "sim_pipes.h"

namespace pasa_sim {

inline AscendC::emu::TimingParams& Params()
{
    static AscendC::emu::TimingParams p = [] {
        AscendC::emu::TimingParams t;  // every entry 1 until the program sets them (params.txt)
        for (const char* n : {"cube_macs_per_cycle", "mmad_head_cycles", "mte1_l0a_bytes_per_cycle",
                              "mte1_l0b_bytes_per_cycle", "mte1_head_cycles", "mte2_bytes_per_cycle",
                              "mte2_head_cycles", "gm_read_latency_cycles", "mte3_bytes_per_cycle",
                              "mte3_head_cycles", "core_write_bytes_per_cycle", "gm_write_latency_cycles",
                              "fix_bytes_per_cycle", "fix_head_cycles", "vec_head_cycles", "scalar_issue_cycles",
                              "scalar_ub_access_cycles", "vs_sync_cycles", "scalar_gm_access_cycles",
                              "queue_depth", "cross_core_latency_cycles", "l2_aggregate_bytes_per_cycle",
                              "hbm_aggregate_bytes_per_cycle", "launch_overhead_cycles"}) {
            t.Set(n, 1.0);
        }
        return t;
    }();
    return p;
}

struct PipeLine {
    double free = 0;  // the pipe may start its next instruction
    double done = 0;  // everything issued to it has completed, latency included
    double busy = 0;
    uint64_t count = 0;
    uint64_t gmRead = 0, gmWrite = 0;
    std::deque<double> queued;  // start times of its last queue_depth instructions
};

struct CoreClock {
    double scalar = 0;
    PipeLine pipe[kSlots];
    std::deque<double> flags[kSlots][kSlots][8];

    double End() const
    {
        double t = scalar;
        for (const PipeLine& p : pipe) t = t > p.done ? t : p.done;
        return t;
    }
};

inline CoreClock& Clock()
{
    static CoreClock c;
    return c;
}

inline void ResetClock() { Clock() = CoreClock(); }

inline double Max(double a, double b) { return a > b ? a : b; }

inline void ScalarCycles(double cycles)
{
    CoreClock& c = Clock();
    c.scalar += cycles;
    c.pipe[kS].busy += cycles;
}

// Cycles `in` occupies its pipe, and the latency after which it completes.
inline void Occupancy(const Instr& in, double* occupancy, double* latency)
{
    const AscendC::emu::TimingParams& p = Params();
    *latency = 0;
    switch (in.work) {
    case Work::kGmRead:
        *occupancy = p.mte2_head_cycles + in.units / p.mte2_bytes_per_cycle;
        *latency = p.gm_read_latency_cycles;
        return;
    case Work::kGmWrite:
        *occupancy = p.mte3_head_cycles + in.units / p.mte3_bytes_per_cycle;
        *latency = p.gm_write_latency_cycles;
        return;
    case Work::kFillL1:
    case Work::kToL0A: *occupancy = p.mte1_head_cycles + in.units / p.mte1_l0a_bytes_per_cycle; return;
    case Work::kToL0B: *occupancy = p.mte1_head_cycles + in.units / p.mte1_l0b_bytes_per_cycle; return;
    case Work::kMad: *occupancy = p.mmad_head_cycles + in.units * 4096.0 / p.cube_macs_per_cycle; return;
    case Work::kFix:
        *occupancy = p.fix_head_cycles + in.units / p.fix_bytes_per_cycle;
        if (in.gmWrite > 0) *latency = p.gm_write_latency_cycles;
        return;
    case Work::kVec: *occupancy = p.vec_head_cycles + in.units * in.perRepeat; return;
    case Work::kNone: *occupancy = 0; return;
    }
    *occupancy = 0;
}

inline void TimeInstr(const Instr& in)
{
    CoreClock& c = Clock();
    const AscendC::emu::TimingParams& p = Params();
    PipeLine& q = c.pipe[in.slot];
    q.count++;
    q.gmRead += in.gmRead;
    q.gmWrite += in.gmWrite;
    if (in.slot == kS) {
        ScalarCycles(p.scalar_issue_cycles);
        q.free = q.done = c.scalar;
        return;
    }
    double occupancy = 0, latency = 0;
    Occupancy(in, &occupancy, &latency);
    const size_t depth = static_cast<size_t>(Max(1.0, p.queue_depth));
    if (q.queued.size() >= depth) {
        c.scalar = Max(c.scalar, q.queued.front());
        q.queued.pop_front();
    }
    const double start = Max(c.scalar, q.free);
    q.free = start + occupancy;
    q.done = Max(q.done, q.free + latency);
    q.busy += occupancy;
    q.queued.push_back(start);
    ScalarCycles(p.scalar_issue_cycles);
}

// A flag raised on pipe `slot`: the time it fires.
inline double TimeRaise(int slot)
{
    CoreClock& c = Clock();
    if (slot == kS) return c.scalar;
    PipeLine& q = c.pipe[slot];
    const double at = Max(c.scalar, q.done);
    q.free = Max(q.free, at);
    ScalarCycles(Params().scalar_issue_cycles);
    return at;
}

// The wait of pipe `slot` for a flag fired at `at` from pipe `from`.
inline void TimeWait(int slot, double at, int from)
{
    CoreClock& c = Clock();
    const AscendC::emu::TimingParams& p = Params();
    if (slot == kS) {
        const bool vectorSide = from == kV || from == kMte2 || from == kMte3;
        c.scalar = Max(c.scalar, at) + (vectorSide ? p.vs_sync_cycles : 0.0);
        return;
    }
    PipeLine& q = c.pipe[slot];
    q.free = Max(q.free, Max(at, c.scalar));
    q.done = Max(q.done, q.free);
    ScalarCycles(p.scalar_issue_cycles);
}

inline void TimeSetFlag(int src, int dst, int event) { Clock().flags[src][dst][event].push_back(TimeRaise(src)); }

inline void TimeWaitFlag(int src, int dst, int event)
{
    auto& q = Clock().flags[src][dst][event];
    if (q.empty()) return;  // sim_sync.h fails such a wait
    const double at = q.front();
    q.pop_front();
    TimeWait(dst, at, src);
}

inline void TimeBarrier(int slot)
{
    CoreClock& c = Clock();
    if (slot < 0) {
        double t = c.scalar;
        for (const PipeLine& q : c.pipe) t = Max(t, q.done);
        c.scalar = t;
        for (PipeLine& q : c.pipe) q.free = Max(q.free, t);
        return;
    }
    if (slot == kS) return;
    PipeLine& q = c.pipe[slot];
    q.free = Max(q.free, Max(q.done, c.scalar));
    ScalarCycles(Params().scalar_issue_cycles);
}

// The waiting core sees a cross-core set fired at `at` (the setting core's time).
inline void TimeCrossWait(double at) { Clock().scalar = Max(Clock().scalar, at + Params().cross_core_latency_cycles); }

}  // namespace pasa_sim

#endif
