// Pipe-level timing model of the AscendC CPU emulation (a model: nothing here was measured on
// an NPU). Every emulated instruction occupies its pipe (S, V, M, MTE1, MTE2, MTE3, FIX) for a
// number of cycles taken from the parameter table; each pipe runs its instructions in order;
// the synchronisations the emulation checks (SetFlag/WaitFlag, queue EnQue/DeQue and
// FreeTensor/AllocTensor, PipeBarrier, cross-core flags, the scalar unit's accesses to UB) are
// the edges between the pipes' timelines. ascend_kernels/TIMING_MODEL.md describes the model,
// its parameter table (pasa_npu/npu_params.py) and what it leaves out.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <stdexcept>
#include <string>

namespace AscendC {
namespace emu {

// ------------------------------------------------------------------ the parameters
// One field per tunable entry of pasa_npu/npu_params.py (same names). A rate is per engine of
// one core unless its comment says per AI Core or the name says "aggregate".
struct TimingParams {
    double cube_macs_per_cycle = 0;        // fp16 MACs per cycle of one cube (16 x 16 x 16)
    double mmad_head_cycles = 0;           // fixed cycles per Mmad
    double mte1_l0a_bytes_per_cycle = 0;   // LoadData L1 -> L0A (and Fill of L1 and L0A)
    double mte1_l0b_bytes_per_cycle = 0;   // LoadData L1 -> L0B (and Fill of L0B)
    double mte1_head_cycles = 0;
    double mte2_bytes_per_cycle = 0;       // GM -> L1 / UB per AI Core: one engine alone runs at this rate,
                                           // the AIC's and both AIVs' reads share it (Launch bounds the AI Core)
    double mte2_head_cycles = 0;
    double gm_read_latency_cycles = 0;     // until a GM read lands (flags wait for it; a data-cache miss)
    double mte3_bytes_per_cycle = 0;       // UB -> GM of one engine
    double core_write_bytes_per_cycle = 0; // GM writes per AI Core: both AIVs' MTE3 and the AIC's Fixpipe share it
    double mte3_head_cycles = 0;
    double gm_write_latency_cycles = 0;    // until a GM write is visible (flags wait for it)
    double fix_bytes_per_cycle = 0;        // Fixpipe L0C -> GM, output bytes
    double fix_head_cycles = 0;
    double vec_head_cycles = 0;            // fixed cycles per vector instruction
    double scalar_issue_cycles = 0;        // scalar cycles to dispatch one instruction to a pipe
    double scalar_ub_access_cycles = 0;    // one GetValue/SetValue on UB, after the sync
    double vs_sync_cycles = 0;             // a vector <-> scalar synchronisation
    double scalar_gm_access_cycles = 0;    // one GetValue/SetValue on GM that hits the data cache
    double queue_depth = 0;                // instructions a pipe's queue holds before the scalar stalls
    double cross_core_latency_cycles = 0;  // a cross-core flag from set to visible
    double l2_aggregate_bytes_per_cycle = 0;   // all cores together, L2-resident traffic
    double hbm_aggregate_bytes_per_cycle = 0;  // all cores together, first touch of each byte
    double launch_overhead_cycles = 0;     // per kernel launch

    bool Set(const std::string& name, double value)
    {
        static const std::map<std::string, double TimingParams::*> fields = {
            {"cube_macs_per_cycle", &TimingParams::cube_macs_per_cycle},
            {"mmad_head_cycles", &TimingParams::mmad_head_cycles},
            {"mte1_l0a_bytes_per_cycle", &TimingParams::mte1_l0a_bytes_per_cycle},
            {"mte1_l0b_bytes_per_cycle", &TimingParams::mte1_l0b_bytes_per_cycle},
            {"mte1_head_cycles", &TimingParams::mte1_head_cycles},
            {"mte2_bytes_per_cycle", &TimingParams::mte2_bytes_per_cycle},
            {"mte2_head_cycles", &TimingParams::mte2_head_cycles},
            {"gm_read_latency_cycles", &TimingParams::gm_read_latency_cycles},
            {"mte3_bytes_per_cycle", &TimingParams::mte3_bytes_per_cycle},
            {"mte3_head_cycles", &TimingParams::mte3_head_cycles},
            {"core_write_bytes_per_cycle", &TimingParams::core_write_bytes_per_cycle},
            {"gm_write_latency_cycles", &TimingParams::gm_write_latency_cycles},
            {"fix_bytes_per_cycle", &TimingParams::fix_bytes_per_cycle},
            {"fix_head_cycles", &TimingParams::fix_head_cycles},
            {"vec_head_cycles", &TimingParams::vec_head_cycles},
            {"scalar_issue_cycles", &TimingParams::scalar_issue_cycles},
            {"scalar_ub_access_cycles", &TimingParams::scalar_ub_access_cycles},
            {"vs_sync_cycles", &TimingParams::vs_sync_cycles},
            {"scalar_gm_access_cycles", &TimingParams::scalar_gm_access_cycles},
            {"queue_depth", &TimingParams::queue_depth},
            {"cross_core_latency_cycles", &TimingParams::cross_core_latency_cycles},
            {"l2_aggregate_bytes_per_cycle", &TimingParams::l2_aggregate_bytes_per_cycle},
            {"hbm_aggregate_bytes_per_cycle", &TimingParams::hbm_aggregate_bytes_per_cycle},
            {"launch_overhead_cycles", &TimingParams::launch_overhead_cycles},
        };
        auto it = fields.find(name);
        if (it == fields.end()) return false;
        this->*(it->second) = value;
        return true;
    }
    static std::size_t Count() { return 24; }
};

// ------------------------------------------------------------------ published vector rates
// Cycles one repeat (256 bytes of the wider operand) occupies the vector unit, from the Atlas
// A2 table "Vector指令理论性能汇总" of the asc-devkit documentation (elements per cycle):
// arithmetic, compare, select, duplicate, casts: one repeat per cycle; Exp, Ln, Div: 32
// elements per cycle for half and float; ReduceRepeat (whole-repeat reduction): 7 cycles per
// repeat; ReduceDataBlock: 7 cycles per half repeat, 1 per float repeat; Brcb: 8 inputs per cycle.
enum class VecKind { Simple, Transcendental, ReduceRepeat, ReduceDataBlock, Brcb };

inline double VecCyclesPerRepeat(VecKind kind, std::size_t elemBytes)
{
    switch (kind) {
        case VecKind::Transcendental: return elemBytes == 2 ? 4.0 : 2.0;  // 128 or 64 elements at 32 per cycle
        case VecKind::ReduceRepeat: return 7.0;
        case VecKind::ReduceDataBlock: return elemBytes == 2 ? 7.0 : 1.0;
        default: return 1.0;
    }
}

// ------------------------------------------------------------------ one core's timelines
struct PipeTimeline {
    double free = 0;   // the pipe may start its next instruction
    double done = 0;   // everything issued to the pipe has completed (latency included)
    double busy = 0;   // cycles the pipe was occupied
    uint64_t count = 0;
    std::deque<double> queued;  // start times of the last queue_depth instructions
};

struct CoreTiming {
    double scalar = 0;       // the scalar unit's time (it dispatches every instruction)
    double scalarBusy = 0;
    std::array<PipeTimeline, 7> pipe;
    double event[64][8] = {};  // SetFlag time per (HardEvent, id)

    double End() const
    {
        double t = scalar;
        for (const auto& p : pipe) t = std::max(t, p.done);
        return t;
    }
};

}  // namespace emu
}  // namespace AscendC
