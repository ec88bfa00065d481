// Where the per-instruction record (sim_pipes.h) goes: each instruction and each
// synchronisation is handed to the hazard checker (sim_hazards.h) and to the timing model
// (sim_timing.h), in that order, between the unit flags' waits and updates (sim_unit_flag.h); Report() sums up one core for its launch.
#ifndef PASA_SIM_ISSUE_H
#define PASA_SIM_ISSUE_H

#include "sim_hazards.h"
#include "sim_timing.h"
#include "sim_unit_flag.h"

namespace pasa_sim {

inline void Issue()
{
    const Instr& in = Current();
    Trace("issue %s on %s", in.name, SlotName(in.slot));
    UnitFlagBefore(in);
    CheckInstr(in);
    TimeInstr(in);
    UnitFlagAfter(in);
}

inline void PipesSetFlag(int srcPipe, int dstPipe, int event)
{
    const int src = SlotOf(srcPipe), dst = SlotOf(dstPipe);
    if (src < 0 || dst < 0) Fail("set_flag(pipe %d -> pipe %d): PIPE_ALL is not a flag's pipe", srcPipe, dstPipe);
    Trace("set_flag %s -> %s event %d", SlotName(src), SlotName(dst), event);
    HazardSetFlag(src, dst, event);
    TimeSetFlag(src, dst, event);
}

inline void PipesWaitFlag(int srcPipe, int dstPipe, int event)
{
    const int src = SlotOf(srcPipe), dst = SlotOf(dstPipe);
    if (src < 0 || dst < 0) Fail("wait_flag(pipe %d -> pipe %d): PIPE_ALL is not a flag's pipe", srcPipe, dstPipe);
    Trace("wait_flag %s -> %s event %d", SlotName(src), SlotName(dst), event);
    HazardWaitFlag(src, dst, event);
    TimeWaitFlag(src, dst, event);
}

inline void PipesBarrier(int pipe)
{
    const int slot = SlotOf(pipe);
    Trace("pipe_barrier %s", slot < 0 ? "ALL" : SlotName(slot));
    HazardBarrier(slot);
    TimeBarrier(slot);
}

// A cross-core set issued on `pipe`: the time it fires.
inline double PipesCrossSet(int pipe)
{
    const int slot = SlotOf(pipe);
    return TimeRaise(slot < 0 ? kS : slot);
}

inline void PipesCrossWait(double at) { TimeCrossWait(at); }

inline void ResetPipes()
{
    ResetHazards();
    ResetClock();
    ResetUnitFlags();
}

struct CoreReport {
    int ran = 0;
    double cycles = 0;
    double busy[kSlots] = {};
    uint64_t count[kSlots] = {};
    uint64_t gmRead[kSlots] = {};
    uint64_t gmWrite[kSlots] = {};
    uint64_t hazards = 0;    // reported under PASA_SIM_HAZARDS=report
    char firstHazard[1024] = {};
};

inline CoreReport Report()
{
    const CoreClock& c = Clock();
    CoreReport r;
    r.ran = 1;
    r.cycles = c.End();
    for (int s = 0; s < kSlots; ++s) {
        r.busy[s] = c.pipe[s].busy;
        r.count[s] = c.pipe[s].count;
        r.gmRead[s] = c.pipe[s].gmRead;
        r.gmWrite[s] = c.pipe[s].gmWrite;
    }
    r.hazards = Hazards().found;
    std::snprintf(r.firstHazard, sizeof r.firstHazard, "%s", Hazards().first.c_str());
    return r;
}

}  // namespace pasa_sim

#endif
