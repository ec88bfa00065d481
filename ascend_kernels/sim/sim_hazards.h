// The happens-before checker on the per-instruction record (sim_pipes.h), for one core.
//
// Contract.
// * Each pipe P keeps a vector clock: clock[P][Q] is the number of Q's instructions known to
//   have completed before P's next instruction starts. Instructions of one pipe are ordered
//   (the toolchain's automatic PIPE_V synchronisation, which Huawei's headers also insert by
//   hand where they need it, is assumed). Every instruction is issued by the scalar unit in
//   program order, so it inherits the scalar pipe's clock (a wait_flag to PIPE_S orders
//   everything issued after it).
// * set_flag(src, dst, e) snapshots src's clock, all of src's issued instructions included;
//   wait_flag(src, dst, e) merges the oldest snapshot of (src, dst, e) into dst.
//   pipe_barrier(PIPE_ALL) merges every pipe's clock into the scalar pipe's (so into all that
//   is issued later); pipe_barrier(P) orders P after itself, which it already is.
// * Per 32-byte block of UB, L1, L0A, L0B and L0C: the last writing instruction and the last
//   reading instruction of each pipe. An access by pipe P to a block last written by another
//   pipe Q (a write: also last read by Q) whose access does not happen before P's is a hazard:
//   Fail names both instructions (pipe, name, number, the memory and range each touched) and
//   the block. Accesses are taken at 32-byte granularity: two pipes touching different bytes of
//   one block count as touching the same.
// * Out of scope: GM (within a core and across cores; the cross-core flags order GM only),
//   the scalar unit's own loads and stores (not seen), and ordering inside a pipe.
// * PASA_SIM_HAZARDS=0 turns the checker off; PASA_SIM_HAZARDS=report reports each hazard (one
//   per instruction) on stderr and in the core's count (Hazards().found, the first one's message
//   in Hazards().first) and goes on.
#ifndef PASA_SIM_HAZARDS_H
#define PASA_SIM_HAZARDS_H

#include <array>
#include <deque>
#include <vector>

#include "sim_pipes.h"

namespace pasa_sim {

using VClock = std::array<uint32_t, kSlots>;

inline void Join(VClock& into, const VClock& c)
{
    for (int i = 0; i < kSlots; ++i) into[i] = into[i] > c[i] ? into[i] : c[i];
}

struct Extent {
    int mem = -1;
    uint64_t lo = 0, hi = 0;
};

struct Logged {
    const char* name;
    int slot;
    uint32_t seq;
    Extent read, write;  // the first local memory each touched, over all its ranges there
};

struct Cell {
    uint32_t write = 0;           // log id of the last writer, 0 none
    uint32_t read[kSlots] = {};   // log id of each pipe's last reader since that write
};

struct HazardState {
    bool on = true;
    bool report = false;  // report and go on, rather than fail
    uint64_t found = 0;
    std::string first;
    bool reported = false;  // the current instruction already reported one
    VClock clock[kSlots] = {};
    uint32_t issued[kSlots] = {};
    std::vector<Logged> log{Logged{"", 0, 0, {}, {}}};
    std::vector<Cell> shadow[kMems];
    std::deque<VClock> flags[kSlots][kSlots][8];
};

inline HazardState& Hazards()
{
    static HazardState h = [] {
        HazardState s;
        const char* env = std::getenv("PASA_SIM_HAZARDS");
        s.on = env == nullptr || std::string(env) != "0";
        s.report = env != nullptr && std::string(env) == "report";
        return s;
    }();
    return h;
}

inline void ResetHazards()
{
    const bool on = Hazards().on, report = Hazards().report;
    Hazards() = HazardState();
    Hazards().on = on;
    Hazards().report = report;
}

inline std::string Describe(const Logged& l)
{
    char buf[256];
    auto ext = [](const Extent& e, const char* what) -> std::string {
        if (e.mem < 0) return "";
        char b[96];
        std::snprintf(b, sizeof b, " %s %s [0x%llx, 0x%llx)", what, MemName(e.mem), (unsigned long long)e.lo,
                      (unsigned long long)e.hi);
        return b;
    };
    std::snprintf(buf, sizeof buf, "%s on %s (its instruction %u)", l.name, SlotName(l.slot), l.seq);
    return buf + ext(l.read, "reading") + ext(l.write, "writing");
}

// The clock of pipe `slot` as an instruction is issued to it: the scalar unit's knowledge
// joined in.
inline void IssueTo(HazardState& h, int slot)
{
    if (slot != kS) Join(h.clock[slot], h.clock[kS]);
}

inline void Hazard(HazardState& h, uint32_t earlier, uint32_t later, int mem, uint64_t block, const char* kind)
{
    if (h.reported) return;
    char msg[1024];
    std::snprintf(msg, sizeof msg,
                  "pipe hazard (%s) on %s bytes [0x%llx, 0x%llx): %s, then %s, with no set_flag/wait_flag or barrier "
                  "ordering them (on hardware the two may overlap)",
                  kind, MemName(mem), (unsigned long long)(block * 32), (unsigned long long)(block * 32 + 32),
                  Describe(h.log[earlier]).c_str(), Describe(h.log[later]).c_str());
    if (!h.report) Fail("%s", msg);
    if (h.found++ == 0) h.first = msg;
    h.reported = true;
    std::fprintf(stderr, "pasa-sim: %s\n", msg);
}

inline void CheckInstr(const Instr& in)
{
    HazardState& h = Hazards();
    if (!h.on) return;
    IssueTo(h, in.slot);
    const int p = in.slot;
    const uint32_t seq = ++h.issued[p];
    h.clock[p][p] = seq;
    h.reported = false;
    Logged entry{in.name, p, seq, {}, {}};
    for (const Access& a : in.acc) {
        if (a.mem == kGM) continue;
        Extent& e = a.write ? entry.write : entry.read;
        if (e.mem < 0) e = Extent{a.mem, a.lo, a.hi};
        else if (e.mem == a.mem) {
            e.lo = a.lo < e.lo ? a.lo : e.lo;
            e.hi = a.hi > e.hi ? a.hi : e.hi;
        }
    }
    const uint32_t id = static_cast<uint32_t>(h.log.size());
    h.log.push_back(entry);
    const VClock& seen = h.clock[p];
    for (const Access& a : in.acc) {
        if (a.mem == kGM) continue;
        std::vector<Cell>& sh = h.shadow[a.mem];
        const uint64_t last = (a.hi - 1) / 32;
        if (sh.size() <= last) sh.resize(last + 1);
        for (uint64_t b = a.lo / 32; b <= last; ++b) {
            Cell& c = sh[b];
            if (c.write != 0) {
                const Logged& w = h.log[c.write];
                if (w.slot != p && seen[w.slot] < w.seq) Hazard(h, c.write, id, a.mem, b, a.write ? "write after write" : "read after write");
            }
            if (!a.write) {
                c.read[p] = id;
                continue;
            }
            for (int q = 0; q < kSlots; ++q) {
                if (q == p || c.read[q] == 0) continue;
                if (seen[q] < h.log[c.read[q]].seq) Hazard(h, c.read[q], id, a.mem, b, "write after read");
            }
            c.write = id;
            for (uint32_t& r : c.read) r = 0;
        }
    }
}

inline void HazardSetFlag(int src, int dst, int event)
{
    HazardState& h = Hazards();
    if (!h.on) return;
    IssueTo(h, src);
    VClock snap = h.clock[src];
    snap[src] = h.issued[src];
    h.flags[src][dst][event].push_back(snap);
}

inline void HazardWaitFlag(int src, int dst, int event)
{
    HazardState& h = Hazards();
    if (!h.on) return;
    IssueTo(h, dst);
    auto& q = h.flags[src][dst][event];
    if (q.empty()) return;  // sim_sync.h fails such a wait
    Join(h.clock[dst], q.front());
    q.pop_front();
}

inline void HazardBarrier(int slot)
{
    HazardState& h = Hazards();
    if (!h.on || slot >= 0) return;
    for (int p = 0; p < kSlots; ++p) {
        VClock c = h.clock[p];
        c[p] = h.issued[p];
        Join(h.clock[kS], c);
    }
}

}  // namespace pasa_sim

#endif
