// What both pybind11 modules of the emulation (pasa_emu_module.cpp, the shipped extension, and
// pasa_emu_selftest_module.cpp, the development self-tests) take from and give to Python: the
// timing model's parameters in, a launch's counters and timing out.
#pragma once

#include <pybind11/pybind11.h>

#include <set>
#include <string>

#include "kernel_operator.h"

namespace pasa_emu {

namespace py = pybind11;

inline py::dict StatsDict(const AscendC::emu::Stats& s)
{
    py::dict d;
    d["gm_to_l1_bytes"] = s.gm_to_l1;
    d["l1_fill_bytes"] = s.l1_fill;
    d["l1_to_l0a_bytes"] = s.l1_to_l0a;
    d["l1_to_l0b_bytes"] = s.l1_to_l0b;
    d["l0c_to_gm_bytes"] = s.l0c_to_gm;
    d["gm_to_ub_bytes"] = s.gm_to_ub;
    d["ub_to_gm_bytes"] = s.ub_to_gm;
    d["mmad_calls"] = s.mmad_calls;
    d["cube_macs"] = s.cube_macs;
    d["vector_instructions"] = s.vector_instructions;
    d["vector_elements"] = s.vector_elements;
    d["scalar_ub_accesses"] = s.scalar_ub_accesses;
    d["scalar_gm_accesses"] = s.scalar_gm_accesses;
    d["scalar_gm_misses"] = s.scalar_gm_misses;
    d["scalar_gm_preloads"] = s.scalar_gm_preloads;
    d["cross_core_sets"] = s.cross_core_sets;
    d["cross_core_waits"] = s.cross_core_waits;
    d["ai_cores"] = s.blocks;
    d["cores"] = s.cores;
    d["cycles"] = s.cycles;
    d["core_cycles"] = s.core_cycles;
    d["timeline_cycles"] = s.timeline_cycles;
    d["core_read_bound_cycles"] = s.core_read_bound_cycles;
    d["core_write_bound_cycles"] = s.core_write_bound_cycles;
    d["l2_bound_cycles"] = s.l2_bound_cycles;
    d["hbm_bound_cycles"] = s.hbm_bound_cycles;
    d["hbm_bytes"] = s.hbm_bytes;
    py::dict busy, busyTotal, count;
    for (int p = 0; p < AscendC::emu::kPipes; ++p) {
        busy[AscendC::emu::PipeShort(p)] = s.pipe_busy[p];
        busyTotal[AscendC::emu::PipeShort(p)] = s.pipe_busy_total[p];
        count[AscendC::emu::PipeShort(p)] = s.pipe_instructions[p];
    }
    d["pipe_busy_cycles"] = busy;
    d["pipe_busy_total_cycles"] = busyTotal;
    d["pipe_instructions"] = count;
    return d;
}

// The timing model's parameters from pasa_npu.npu_params (every one of them, nothing else).
inline AscendC::emu::TimingParams TimingFrom(const py::dict& d)
{
    AscendC::emu::TimingParams t;
    std::set<std::string> seen;
    for (auto item : d) {
        const std::string name = item.first.cast<std::string>();
        if (!t.Set(name, item.second.cast<double>())) throw py::value_error("unknown timing parameter '" + name + "'");
        seen.insert(name);
    }
    if (seen.size() != AscendC::emu::TimingParams::Count()) {
        throw py::value_error("timing parameters: " + std::to_string(seen.size()) + " given, " +
                              std::to_string(AscendC::emu::TimingParams::Count()) + " needed");
    }
    return t;
}

}  // namespace pasa_emu
