// The unit flags of L0C (Mmad / Fixpipe unitFlag): a flag per 1 KiB fractal (16 x 16 fp32) through
// which the cube hands L0C from the mads that fill it to the fixpipe that drains it and back,
// without set_flag/wait_flag.
//
// Contract (the emulation's, emu_ops_cube.h; "Mmad", "Fixpipe" and asc-devkit's mmad_unitflag
// example).
// * mad with unitFlag 2 or 3 waits until every fractal it writes is clear; with 3 it sets them as it
//   completes. copy_matrix_cc_to_gm / _cbuf with unitFlag 3 waits until every fractal it reads is
//   set and clears them once it has read L0C (before its GM write lands).
// * Each wait orders the waiting instruction after the one that set or cleared the flag, for the
//   hazard checker (its clock joins that instruction's) and for the timing (it starts no earlier
//   than that instruction's end, latency excluded). The overlap of one mad with its fixpipe,
//   fractal by fractal, is not credited.
// * Fail: unitFlag 1 or above 3 on a mad, other than 0 or 3 on a fixpipe; a fixpipe with 3 reading
//   a clear fractal (it would wait forever); a mad writing a set fractal (with unitFlag it would
//   wait for a fixpipe issued after it, without it overwrites the result); a fixpipe without
//   unitFlag reading a set fractal (the next mad with unitFlag would wait forever).
#ifndef PASA_SIM_UNIT_FLAG_H
#define PASA_SIM_UNIT_FLAG_H

#include <vector>

#include "sim_hazards.h"
#include "sim_timing.h"

namespace pasa_sim {

struct UnitFlagCell {
    bool set = false;
    VClock setBy{}, clearedBy{};  // the clocks of the mad that set it and the fixpipe that cleared it
    double setAt = 0, clearedAt = 0;
};

constexpr uint64_t kL0cFractalBytes = 1024;

inline std::vector<UnitFlagCell>& UnitFlags()
{
    static std::vector<UnitFlagCell> cells;
    return cells;
}

inline void ResetUnitFlags() { UnitFlags().clear(); }

template <typename F>
inline void ForL0cFractals(const Instr& in, bool write, F f)
{
    std::vector<UnitFlagCell>& cells = UnitFlags();
    for (const Access& a : in.acc) {
        if (a.mem != kL0C || a.write != write) continue;
        const uint64_t last = (a.hi - 1) / kL0cFractalBytes;
        if (cells.size() <= last) cells.resize(last + 1);
        for (uint64_t i = a.lo / kL0cFractalBytes; i <= last; ++i) f(i, cells[i]);
    }
}

// Before `in` is checked and timed: the protocol's checks and waits.
inline void UnitFlagBefore(const Instr& in)
{
    const bool mad = in.work == Work::kMad, fix = in.work == Work::kFix;
    if (!mad && !fix) return;
    const uint8_t flag = in.unitFlag;
    if (mad && (flag == 1 || flag > 3)) Fail("%s: unitFlag %u: 0 (off), 2 or 3 (the chain's last mad)", in.name, flag);
    if (fix && flag != 0 && flag != 3) Fail("%s: unitFlag %u: a fixpipe takes 3 (read, then clear)", in.name, flag);
    HazardState& h = Hazards();
    double ready = 0;
    ForL0cFractals(in, mad, [&](uint64_t i, UnitFlagCell& u) {
        const unsigned long long at = i * kL0cFractalBytes;
        if (mad && u.set) {
            Fail("%s: L0C fractal at byte %llu holds a result a mad with unitFlag 3 completed and no fixpipe with "
                 "unitFlag 3 has read; %s", in.name, at,
                 flag ? "the mad would wait for a fixpipe issued after it" : "a mad without unitFlag overwrites it");
        }
        if (fix && flag && !u.set) {
            Fail("%s: unitFlag 3 reads L0C fractal at byte %llu that no mad with unitFlag 3 has completed: it would "
                 "wait forever", in.name, at);
        }
        if (fix && !flag && u.set) {
            Fail("%s: reads L0C fractal at byte %llu without unitFlag while a mad with unitFlag 3 left its flag set: "
                 "the next mad with unitFlag would wait forever", in.name, at);
        }
        if (!flag) return;
        ready = Max(ready, mad ? u.clearedAt : u.setAt);
        if (h.on) Join(h.clock[in.slot], mad ? u.clearedBy : u.setBy);
    });
    PipeLine& q = Clock().pipe[in.slot];
    q.free = Max(q.free, ready);
}

// After `in` is checked and timed: the flags it sets (mad, 3) or clears (fixpipe, 3).
inline void UnitFlagAfter(const Instr& in)
{
    if (in.unitFlag != 3 || (in.work != Work::kMad && in.work != Work::kFix)) return;
    const bool mad = in.work == Work::kMad;
    HazardState& h = Hazards();
    VClock by = h.clock[in.slot];
    by[in.slot] = h.issued[in.slot];
    const double end = Clock().pipe[in.slot].free;  // the end of its occupancy: L0C read or written
    ForL0cFractals(in, mad, [&](uint64_t, UnitFlagCell& u) {
        u.set = mad;
        (mad ? u.setBy : u.clearedBy) = by;
        (mad ? u.setAt : u.clearedAt) = end;
    });
}

}  // namespace pasa_sim

#endif
