// Synchronisation instructions. The simulator executes each instruction when it is issued, in
// program order, so no pipe runs ahead of another; the flags are counted and checked here, and
// their ordering and timing are handed to the hazard checker and the timing model (sim_issue.h).
//
// Contract: set_flag(src, dst, event) records one signal from pipe src to pipe dst;
// wait_flag(src, dst, event) consumes one and fails (the hardware would hang) when none was
// recorded; an event outside EVENT_ID0..7 fails. pipe_barrier(pipe) orders (PIPE_ALL: every
// pipe before everything issued later) and times; dsb and dcci have no effect. The cross-core
// flags are in sim_launch.h.
#ifndef PASA_SIM_SYNC_H
#define PASA_SIM_SYNC_H

#include "sim_core.h"
#include "sim_issue.h"
#include "sim_launch.h"

namespace pasa_sim {
inline uint32_t& Flag(int src, int dst, int event)
{
    if (src < 0 || src > 15 || dst < 0 || dst > 15 || event < 0 || event > 7) {
        Fail("flag (pipe %d -> pipe %d, event %d) outside the pipes or EVENT_ID0..7", src, dst, event);
    }
    return State().flags[src][dst][event];
}
}  // namespace pasa_sim

template <typename P, typename Q, typename E>
inline void set_flag(P src, Q dst, E event)
{
    pasa_sim::Flag(static_cast<int>(src), static_cast<int>(dst), static_cast<int>(event))++;
    pasa_sim::PipesSetFlag(static_cast<int>(src), static_cast<int>(dst), static_cast<int>(event));
}

template <typename P, typename Q, typename E>
inline void wait_flag(P src, Q dst, E event)
{
    uint32_t& n = pasa_sim::Flag(static_cast<int>(src), static_cast<int>(dst), static_cast<int>(event));
    if (n == 0) {
        pasa_sim::Fail("wait_flag(pipe %d -> pipe %d, event %d) without a set_flag: the core would hang",
                       static_cast<int>(src), static_cast<int>(dst), static_cast<int>(event));
    }
    --n;
    pasa_sim::PipesWaitFlag(static_cast<int>(src), static_cast<int>(dst), static_cast<int>(event));
}

template <typename... A> inline void hset_flag(A...) {}
template <typename... A> inline void hwait_flag(A...) {}
template <typename P> inline void pipe_barrier(P pipe) { pasa_sim::PipesBarrier(static_cast<int>(pipe)); }
template <typename... A> inline void set_ffts_base_addr(A...) {}
template <typename... A> inline void dsb(A...) {}
template <typename... A> inline void dcci(A...) {}
template <typename... A> inline void dc_preload(A...) {}
template <typename... A> inline void preload(A...) {}

#endif
