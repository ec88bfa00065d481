// The emulation's timing model: when an instruction dispatched to a pipe starts and
// completes (emu_timing.h holds the parameters).
#pragma once

#include "emu_cores.h"

namespace AscendC {
namespace emu {

// ------------------------------------------------------------------ timing model
inline const TimingParams& Timing() { return *Core().group->timing; }

// Dispatch one instruction to `pipe`: it starts when the scalar unit has issued it and the pipe
// is free, occupies the pipe `occupancy` cycles and completes `latency` cycles after that.
// The scalar unit stalls while the pipe's queue holds queue_depth instructions not yet started.
inline double Dispatch(int pipe, double occupancy, double latency = 0.0)
{
    CoreCtx& c = Core();
    const TimingParams& p = Timing();
    CoreTiming& t = c.tm;
    PipeTimeline& q = t.pipe[pipe];
    q.count++;
    if (pipe == P_S) {
        const double start = t.scalar;
        t.scalar += occupancy;
        t.scalarBusy += occupancy;
        q.busy += occupancy;
        q.free = q.done = t.scalar;
        return start;
    }
    const std::size_t depth = static_cast<std::size_t>(std::max(1.0, p.queue_depth));
    if (q.queued.size() >= depth) {
        t.scalar = std::max(t.scalar, q.queued.front());
        q.queued.pop_front();
    }
    const double start = std::max(t.scalar, q.free);
    q.free = start + occupancy;
    q.done = std::max(q.done, q.free + latency);
    q.busy += occupancy;
    q.queued.push_back(start);
    t.scalar += p.scalar_issue_cycles;
    t.scalarBusy += p.scalar_issue_cycles;
    return start;
}

// A flag raised on `pipe` (SetFlag, EnQue, FreeTensor, a cross-core set): it fires once every
// earlier instruction of the pipe has completed, and the pipe waits for it in order.
inline double FlagRaise(int pipe)
{
    CoreTiming& t = Core().tm;
    if (pipe == P_S) return t.scalar;
    PipeTimeline& q = t.pipe[pipe];
    const double at = std::max(t.scalar, q.done);
    q.free = std::max(q.free, at);
    t.scalar += Timing().scalar_issue_cycles;
    t.scalarBusy += Timing().scalar_issue_cycles;
    return at;
}

// The matching wait on `pipe`: nothing later on that pipe starts before `at`. A wait on the
// scalar pipe blocks the scalar unit (a vector <-> scalar synchronisation when the flag came
// from a vector-side pipe).
inline void FlagWait(int pipe, double at, bool fromVectorSide = false)
{
    CoreTiming& t = Core().tm;
    const TimingParams& p = Timing();
    if (pipe == P_S) {
        t.scalar = std::max(t.scalar, at) + (fromVectorSide ? p.vs_sync_cycles : 0.0);
        return;
    }
    PipeTimeline& q = t.pipe[pipe];
    q.free = std::max(q.free, std::max(at, t.scalar));
    q.done = std::max(q.done, q.free);
    t.scalar += p.scalar_issue_cycles;
    t.scalarBusy += p.scalar_issue_cycles;
}

// The scalar unit reads or writes UB: the toolchain's automatic synchronisation makes it wait
// for the pipes that last touched those bytes (`pipes`: a bit per pipe) to complete.
inline void ScalarUbAccess(unsigned pipes)
{
    CoreTiming& t = Core().tm;
    const TimingParams& p = Timing();
    for (int q = 0; q < kPipes; ++q) {
        if (q != P_S && (pipes & (1u << q))) t.scalar = std::max(t.scalar, t.pipe[q].done + p.vs_sync_cycles);
    }
    Dispatch(P_S, p.scalar_ub_access_cycles);
}

// The scalar unit reads or writes `bytes` of GM at `p` through its data cache: a hit costs
// scalar_gm_access_cycles, once the line's fill has landed where a preload is still bringing it;
// a miss waits gm_read_latency_cycles for the line (a write too: the line is filled before it is
// written).
inline void ScalarGmAccess(const void* p, size_t bytes)
{
    CoreCtx& c = Core();
    const TimingParams& tp = Timing();
    c.stats.scalar_gm_accesses++;
    double ready = 0;
    if (c.dcache.Access(p, bytes, ready)) {
        c.tm.scalar = std::max(c.tm.scalar, ready);
        Dispatch(P_S, tp.scalar_gm_access_cycles);
    } else {
        c.stats.scalar_gm_misses++;
        Dispatch(P_S, tp.gm_read_latency_cycles);
    }
}

// A preload of `bytes` of GM at `p` into the data cache: the scalar unit issues it and goes on;
// the lines not held land gm_read_latency_cycles later.
inline void ScalarGmPreload(const void* p, size_t bytes)
{
    CoreCtx& c = Core();
    const TimingParams& tp = Timing();
    c.stats.scalar_gm_preloads++;
    Dispatch(P_S, tp.scalar_issue_cycles);
    c.dcache.Preload(p, bytes, c.tm.scalar + tp.gm_read_latency_cycles);
}

// Pipes of this core that last wrote (and, for a write, read) the 32-byte blocks of
// [offset, offset + bytes) of local memory `h`, as a bit per pipe.
inline unsigned PipesTouching(Hardware h, uint64_t offset, uint64_t bytes, bool write)
{
    CoreCtx& c = Core();
    const auto& sh = c.shadow[static_cast<int>(h)];
    unsigned bits = 0;
    if (bytes == 0) return bits;
    for (uint64_t b = offset / kBlockBytes; b <= (offset + bytes - 1) / kBlockBytes && b < sh.size(); ++b) {
        const AccessRecord& r = sh[b];
        if (r.writeSlot >= 0 && r.writeSlot / kPipes == c.slot) bits |= 1u << (r.writeSlot % kPipes);
        if (!write) continue;
        for (int q = 0; q < kPipes; ++q) {
            if (r.readSeq[c.SlotOf(q)] != 0) bits |= 1u << q;
        }
    }
    return bits;
}

// Cost helpers: cycles a transfer of `bytes` occupies its pipe.
inline double GmReadCycles(double bytes) { return Timing().mte2_head_cycles + bytes / Timing().mte2_bytes_per_cycle; }
inline double GmWriteCycles(double bytes) { return Timing().mte3_head_cycles + bytes / Timing().mte3_bytes_per_cycle; }
inline double VecCycles(VecKind kind, std::size_t elemBytes, double repeats)
{
    return Timing().vec_head_cycles + repeats * VecCyclesPerRepeat(kind, elemBytes);
}
inline double Repeats(uint64_t bytes) { return static_cast<double>((bytes + 255) / 256); }

// Synchronisation the Atlas A2 toolchain inserts itself (cce-auto-sync, AIV only).
inline bool AutoSynced(const CoreCtx& c, int earlier, int later)
{
    if (earlier == later) return true;
    if (c.type != AIV) return false;
    auto isS = [](int p) { return p == P_S; };
    auto isVecSide = [](int p) { return p == P_V || p == P_MTE2 || p == P_MTE3; };
    return (isS(earlier) && isVecSide(later)) || (isS(later) && isVecSide(earlier));
}

inline std::string SlotName(int slot)
{
    static const char* cores[] = {"AIC", "AIV0", "AIV1"};
    return std::string(cores[slot / kPipes]) + " " + PipeName(slot % kPipes);
}

inline void CheckRecord(AccessRecord& r, int pipe, uint32_t seq, bool write, const char* op, const char* where,
                        uint64_t offset)
{
    CoreCtx& c = Core();
    const int mySlot = c.SlotOf(pipe);
    const Clock& seen = c.seen[pipe];
    if (r.writeSlot >= 0 && r.writeSlot != mySlot) {
        const int wp = r.writeSlot % kPipes;
        const bool sameCore = r.writeSlot / kPipes == c.slot;
        if (!(sameCore && AutoSynced(c, wp, pipe)) && seen[r.writeSlot] < r.writeSeq) {
            Fail("pipe hazard: %s on %s (%s) %s %s byte %llu last written by %s on %s without a synchronisation "
                 "ordering them (on hardware the two may overlap)",
                 op, PipeName(pipe), write ? "write" : "read", write ? "overwrites" : "reads", where,
                 static_cast<unsigned long long>(offset), r.writeOp ? r.writeOp : "?",
                 SlotName(r.writeSlot).c_str());
        }
    }
    if (write) {
        for (int s = 0; s < kSlots; ++s) {
            if (s == mySlot || r.readSeq[s] == 0) continue;
            const bool sameCore = s / kPipes == c.slot;
            if (!(sameCore && AutoSynced(c, s % kPipes, pipe)) && seen[s] < r.readSeq[s]) {
                Fail("pipe hazard: %s on %s overwrites %s byte %llu still being read by %s on %s without a "
                     "synchronisation ordering them (write-after-read)",
                     op, PipeName(pipe), where, static_cast<unsigned long long>(offset),
                     r.readOp ? r.readOp : "?", SlotName(s).c_str());
            }
        }
        r.writeSeq = seq;
        r.writeSlot = static_cast<int8_t>(mySlot);
        r.writeOp = op;
        r.readSeq.fill(0);
    } else {
        r.readSeq[mySlot] = std::max(r.readSeq[mySlot], seq);
        r.readOp = op;
    }
}

// Record an access of `bytes` bytes at `offset` of local memory `h` by `pipe`.
inline void TouchLocal(int pipe, uint32_t seq, Hardware h, uint64_t offset, uint64_t bytes, bool write, const char* op)
{
    if (bytes == 0) return;
    CoreCtx& c = Core();
    auto& sh = c.shadow[static_cast<int>(h)];
    const uint64_t first = offset / kBlockBytes, last = (offset + bytes - 1) / kBlockBytes;
    for (uint64_t b = first; b <= last && b < sh.size(); ++b) CheckRecord(sh[b], pipe, seq, write, op, HardwareName(h), b * kBlockBytes);
}

inline void TouchGm(int pipe, uint32_t seq, const void* addr, uint64_t bytes, bool write, const char* op)
{
    if (bytes == 0) return;
    CoreCtx& c = Core();
    GmRegistry* reg = c.gm;
    std::lock_guard<std::mutex> lock(reg->mu);
    GmBuffer* buf = reg->Find(addr, bytes);
    if (buf == nullptr) {
        Fail("%s: GM access of %llu bytes at %p is outside every buffer passed to the kernel", op,
             static_cast<unsigned long long>(bytes), addr);
    }
    if (write && !buf->writable) Fail("%s: writes the read-only GM input '%s'", op, buf->name.c_str());
    const uint64_t off = static_cast<const uint8_t*>(addr) - buf->base;
    for (uint64_t g = off / kGranuleBytes; g <= (off + bytes - 1) / kGranuleBytes; ++g) buf->touched[g] = 1;
    if (!buf->tracked) return;
    const uint64_t first = off / kBlockBytes, last = (off + bytes - 1) / kBlockBytes;
    const std::string where = "GM '" + buf->name + "'";
    for (uint64_t b = first; b <= last; ++b) {
        // Different AI Cores of one launch are never ordered: a block one of them writes may not
        // be touched by another.
        int32_t& writer = buf->writerBlock[b];
        int32_t& reader = buf->readerBlock[b];  // -1 none, >= 0 one block, -2 several
        const bool otherWrote = writer >= 0 && writer != c.blockIdx;
        const bool otherRead = reader == -2 || (reader >= 0 && reader != c.blockIdx);
        if (otherWrote || (write && otherRead)) {
            Fail("%s: GM '%s' byte %llu is %s by AI Core %d and AI Core %d in the same launch; AI Cores are never "
                 "ordered against each other", op, buf->name.c_str(), static_cast<unsigned long long>(b * kBlockBytes),
                 otherWrote ? "written" : "read", otherWrote ? writer : reader, c.blockIdx);
        }
        if (write) writer = c.blockIdx;
        else reader = (reader == -1 || reader == c.blockIdx) ? c.blockIdx : -2;
        CheckRecord(buf->shadow[b], pipe, seq, write, op, where.c_str(), b * kBlockBytes);
    }
}

}  // namespace emu
}  // namespace AscendC
