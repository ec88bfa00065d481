// Runtime of the AscendC CPU emulation: cores as threads, their local memories, the
// checks the hardware imposes (capacity, alignment, pipe hazards, flags, deadlock) and the
// traffic counters. Everything here is emulation machinery, not AscendC API.
//
// Execution model. A launch runs its blocks one after another. A block of a MIX 1:2
// kernel is one AI Core: one cube thread (AIC) and two vector threads (AIV0, AIV1) that
// really run concurrently and meet only through GM and the cross-core flags. Each core
// executes its instructions synchronously, in program order.
//
// Hazard model. On hardware every core has independent pipes (S, V, M, MTE1, MTE2, MTE3,
// FIX); an instruction on one pipe may overtake an earlier instruction on another. The
// emulation keeps a vector clock per pipe: pipe P "has seen" instruction #n of pipe Q once
// a SetFlag<Q_P>/WaitFlag<Q_P> pair (or a queue EnQue/DeQue, FreeTensor/AllocTensor,
// PipeBarrier<PIPE_ALL>, or a cross-core flag) orders them. Every access to local memory
// (per 32-byte block) and to the GM workspace checks that the last conflicting access on
// another pipe has been seen; if not, it is a race on hardware and the emulation raises.
// Pairs the Atlas A2 toolchain synchronises by itself (cce-auto-sync on AIV: V with S,
// MTE2 with S, MTE3 with S) and accesses on the same pipe are not checked.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "emu_timing.h"
#include "emu_types.h"

namespace AscendC {
namespace emu {

struct EmuError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

inline std::string Format(const char* fmt, va_list ap)
{
    char buf[2048];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    return buf;
}

// ------------------------------------------------------------------ hardware constants
constexpr uint32_t kUbBytes = 192 * 1024;
constexpr uint32_t kL1Bytes = 512 * 1024;
constexpr uint32_t kL0ABytes = 64 * 1024;
constexpr uint32_t kL0BBytes = 64 * 1024;
constexpr uint32_t kL0CBytes = 128 * 1024;
constexpr uint32_t kBlockBytes = 32;      // DataBlock
constexpr uint32_t kFractalBytes = 512;   // one 16x16 b16 fractal
constexpr uint32_t kGranuleBytes = 512;   // GM granule of the HBM traffic bound
constexpr int kPipes = 7;                 // S V M MTE1 MTE2 MTE3 FIX
constexpr int kCoresPerGroup = 3;         // AIC, AIV0, AIV1
constexpr int kSlots = kPipes * kCoresPerGroup;
constexpr int kCrossFlags = 16;
constexpr int kCrossFlagMax = 15;
constexpr int kEventIds = 8;

inline const char* PipeShort(int p)
{
    static const char* names[] = {"S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX"};
    return (p >= 0 && p < 7) ? names[p] : "?";
}
inline const char* PipeName(int p)
{
    static const char* names[] = {"PIPE_S", "PIPE_V", "PIPE_M", "PIPE_MTE1", "PIPE_MTE2", "PIPE_MTE3", "PIPE_FIX"};
    return (p >= 0 && p < kPipes) ? names[p] : "PIPE_?";
}
inline int PipeIndex(pipe_t p)
{
    switch (p) {
        case PIPE_S: return 0;
        case PIPE_V: return 1;
        case PIPE_M: return 2;
        case PIPE_MTE1: return 3;
        case PIPE_MTE2: return 4;
        case PIPE_MTE3: return 5;
        case PIPE_FIX: return 6;
        default: return -1;
    }
}
constexpr int P_S = 0, P_V = 1, P_M = 2, P_MTE1 = 3, P_MTE2 = 4, P_MTE3 = 5, P_FIX = 6;

inline const char* HardwareName(Hardware h)
{
    switch (h) {
        case Hardware::UB: return "UB";
        case Hardware::L1: return "L1";
        case Hardware::L0A: return "L0A";
        case Hardware::L0B: return "L0B";
        case Hardware::L0C: return "L0C";
        case Hardware::GM: return "GM";
        default: return "?";
    }
}
inline uint32_t HardwareCapacity(Hardware h)
{
    switch (h) {
        case Hardware::UB: return kUbBytes;
        case Hardware::L1: return kL1Bytes;
        case Hardware::L0A: return kL0ABytes;
        case Hardware::L0B: return kL0BBytes;
        case Hardware::L0C: return kL0CBytes;
        default: return 0;
    }
}
// Start-address alignment of each memory (asc-devkit docs, "通用地址对齐约束").
inline uint32_t HardwareAlignment(Hardware h)
{
    switch (h) {
        case Hardware::UB: return 32;
        case Hardware::L1: return 32;
        case Hardware::L0A: return 512;
        case Hardware::L0B: return 512;
        case Hardware::L0C: return 64;
        default: return 1;
    }
}
inline Hardware PositionHardware(TPosition p)
{
    switch (p) {
        case TPosition::VECIN: case TPosition::VECOUT: case TPosition::VECCALC: return Hardware::UB;
        case TPosition::A1: case TPosition::B1: case TPosition::C1: return Hardware::L1;
        case TPosition::A2: return Hardware::L0A;
        case TPosition::B2: return Hardware::L0B;
        case TPosition::CO1: return Hardware::L0C;
        default: return Hardware::MAX;
    }
}
inline const char* PositionName(TPosition p)
{
    switch (p) {
        case TPosition::VECIN: return "VECIN";
        case TPosition::VECOUT: return "VECOUT";
        case TPosition::VECCALC: return "VECCALC";
        case TPosition::A1: return "A1";
        case TPosition::B1: return "B1";
        case TPosition::C1: return "C1";
        case TPosition::A2: return "A2";
        case TPosition::B2: return "B2";
        case TPosition::CO1: return "CO1";
        default: return "?";
    }
}

// HardEvent -> (source pipe, destination pipe).
inline void EventPipes(HardEvent e, int& src, int& dst)
{
    static const int table[][2] = {
        {P_MTE2, P_MTE1}, {P_MTE1, P_MTE2}, {P_MTE1, P_M}, {P_M, P_MTE1}, {P_MTE2, P_V}, {P_V, P_MTE2},
        {P_MTE3, P_V}, {P_V, P_MTE3}, {P_M, P_V}, {P_V, P_M}, {P_V, P_V}, {P_MTE3, P_MTE1},
        {P_MTE1, P_MTE3}, {P_MTE1, P_V}, {P_MTE2, P_M}, {P_M, P_MTE2}, {P_V, P_MTE1}, {P_M, P_FIX},
        {P_FIX, P_M}, {P_MTE3, P_MTE2}, {P_MTE2, P_MTE3}, {P_S, P_V}, {P_V, P_S}, {P_S, P_MTE2},
        {P_MTE2, P_S}, {P_S, P_MTE3}, {P_MTE3, P_S}, {P_MTE2, P_FIX}, {P_FIX, P_MTE2}, {P_FIX, P_S},
        {P_M, P_S}, {P_FIX, P_MTE3}, {P_MTE1, P_FIX}, {P_FIX, P_MTE1}, {P_FIX, P_FIX},
    };
    const int i = static_cast<int>(e);
    if (i < 0 || i >= static_cast<int>(HardEvent::MAX)) {
        src = dst = -1;
        return;
    }
    src = table[i][0];
    dst = table[i][1];
}

// ------------------------------------------------------------------ statistics
// Bytes moved per path and work per unit, summed over all cores of a launch.
struct Stats {
    uint64_t gm_to_l1 = 0, l1_fill = 0, l1_to_l0a = 0, l1_to_l0b = 0, l0c_to_gm = 0;
    uint64_t gm_to_ub = 0, ub_to_gm = 0;
    uint64_t mmad_calls = 0, cube_macs = 0;
    uint64_t vector_instructions = 0, vector_elements = 0, scalar_ub_accesses = 0;
    uint64_t cross_core_sets = 0, cross_core_waits = 0;
    uint64_t blocks = 0, cores = 0;
    // timing model (per launch; not summed by Add)
    double cycles = 0;             // modelled cycles of the launch
    double core_cycles = 0;        // the slowest AI Core: its latest completion, or its port bounds if later
    double timeline_cycles = 0;          // the latest completion on any core's timelines
    double core_read_bound_cycles = 0;   // the largest AI Core's GM read bytes over mte2_bytes_per_cycle
    double core_write_bound_cycles = 0;  // the largest AI Core's GM write bytes over core_write_bytes_per_cycle
    double l2_bound_cycles = 0;    // all GM bytes over the aggregate L2 bandwidth
    double hbm_bound_cycles = 0;   // bytes first touched in GM over the aggregate HBM bandwidth
    uint64_t hbm_bytes = 0;
    std::array<double, 7> pipe_busy{};        // busiest instance of each pipe, cycles
    std::array<double, 7> pipe_busy_total{};  // summed over all cores
    std::array<uint64_t, 7> pipe_instructions{};
    void Add(const Stats& o)
    {
        gm_to_l1 += o.gm_to_l1; l1_fill += o.l1_fill; l1_to_l0a += o.l1_to_l0a; l1_to_l0b += o.l1_to_l0b;
        l0c_to_gm += o.l0c_to_gm; gm_to_ub += o.gm_to_ub; ub_to_gm += o.ub_to_gm;
        mmad_calls += o.mmad_calls; cube_macs += o.cube_macs;
        vector_instructions += o.vector_instructions; vector_elements += o.vector_elements;
        scalar_ub_accesses += o.scalar_ub_accesses; cross_core_sets += o.cross_core_sets;
        cross_core_waits += o.cross_core_waits; blocks += o.blocks; cores += o.cores;
    }
};

using Clock = std::array<uint32_t, kSlots>;
inline void Join(Clock& into, const Clock& c)
{
    for (int i = 0; i < kSlots; ++i) into[i] = std::max(into[i], c[i]);
}

// Last accesses of one 32-byte block, for the hazard check.
struct AccessRecord {
    uint32_t writeSeq = 0;
    int8_t writeSlot = -1;
    const char* writeOp = nullptr;
    std::array<uint32_t, kSlots> readSeq{};
    const char* readOp = nullptr;
};

// ------------------------------------------------------------------ GM registry
struct GmBuffer {
    std::string name;
    uint8_t* base = nullptr;
    size_t bytes = 0;
    bool writable = false;
    bool tracked = false;  // hazard-checked (cube <-> vector exchange areas)
    std::vector<AccessRecord> shadow;
    std::vector<int32_t> writerBlock;  // AI Core that wrote each 32-byte block in this launch
    std::vector<int32_t> readerBlock;  // AI Core(s) that read it
    std::vector<uint8_t> touched;      // 512-byte granules accessed in this launch (the HBM bound)
};

class GmRegistry {
public:
    void Add(const std::string& name, void* base, size_t bytes, bool writable, bool tracked)
    {
        GmBuffer b;
        b.name = name;
        b.base = static_cast<uint8_t*>(base);
        b.bytes = bytes;
        b.writable = writable;
        b.tracked = tracked;
        b.touched.assign((bytes + kGranuleBytes - 1) / kGranuleBytes, 0);
        if (tracked) {
            b.shadow.resize((bytes + kBlockBytes - 1) / kBlockBytes);
            b.writerBlock.assign(b.shadow.size(), -1);
            b.readerBlock.assign(b.shadow.size(), -1);
        }
        buffers_.push_back(std::move(b));
    }
    GmBuffer* Find(const void* p, size_t bytes)
    {
        const uint8_t* a = static_cast<const uint8_t*>(p);
        for (auto& b : buffers_) {
            if (a >= b.base && a + bytes <= b.base + b.bytes) return &b;
        }
        return nullptr;
    }
    void ResetShadows()
    {
        for (auto& b : buffers_) {
            std::fill(b.touched.begin(), b.touched.end(), 0);
            if (b.tracked) {
                std::fill(b.shadow.begin(), b.shadow.end(), AccessRecord{});
                std::fill(b.writerBlock.begin(), b.writerBlock.end(), -1);
                std::fill(b.readerBlock.begin(), b.readerBlock.end(), -1);
            }
        }
    }
    // Bytes of the kernel's inputs and outputs (not the workspace) touched in this launch.
    uint64_t TouchedIoBytes() const
    {
        uint64_t n = 0;
        for (const auto& b : buffers_) {
            if (b.tracked) continue;
            for (uint8_t t : b.touched) n += t;
        }
        return n * kGranuleBytes;
    }
    std::mutex mu;

private:
    std::vector<GmBuffer> buffers_;
};

struct Group;

// ------------------------------------------------------------------ one core
struct CoreCtx {
    int type = AIV;        // AIC or AIV
    int blockIdx = 0;      // AI Core index within the launch
    int subIdx = 0;        // 0 for AIC, 0/1 for AIV
    int slot = 0;          // 0 AIC, 1 AIV0, 2 AIV1 within the group
    int blockDim = 1;
    Group* group = nullptr;
    GmRegistry* gm = nullptr;
    std::string name;

    std::vector<uint8_t> mem[static_cast<int>(Hardware::MAX)];
    std::vector<AccessRecord> shadow[static_cast<int>(Hardware::MAX)];

    std::array<uint32_t, kPipes> issued{};  // instructions issued per pipe
    std::array<Clock, kPipes> seen{};        // vector clock of each pipe

    // intra-core flags: armed snapshot per (event, id)
    bool flagSet[static_cast<int>(HardEvent::MAX)][kEventIds] = {};
    Clock flagClock[static_cast<int>(HardEvent::MAX)][kEventIds];
    bool eventIdUsed[static_cast<int>(HardEvent::MAX)][kEventIds] = {};
    bool queueFlag[static_cast<int>(HardEvent::MAX)][kEventIds] = {};  // held by a queue, its flag set

    bool pipeAlive = false;  // a TPipe exists
    // lanes a level-0 call left enabled in the vector mask register (0: the full mask, as
    // ResetMask sets it); instructions that read the register instead of setting it see them
    uint64_t partialMask = 0;
    Stats stats;
    CoreTiming tm;           // the timing model's timelines of this core

    bool Has(Hardware h) const
    {
        if (type == AIC) return h == Hardware::L1 || h == Hardware::L0A || h == Hardware::L0B || h == Hardware::L0C;
        return h == Hardware::UB;
    }
    int SlotOf(int pipe) const { return slot * kPipes + pipe; }
};

inline thread_local CoreCtx* tls_core = nullptr;

inline CoreCtx& Core()
{
    if (tls_core == nullptr) throw EmuError("AscendC API called outside an emulated kernel launch");
    return *tls_core;
}

// Raise an error naming the core that hit it.
[[noreturn]] inline void Fail(const char* fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    std::string msg = Format(fmt, ap);
    va_end(ap);
    if (tls_core != nullptr) msg = tls_core->name + ": " + msg;
    throw EmuError(msg);
}

// ------------------------------------------------------------------ one AI Core (group)
struct CrossFlag {
    int count[kCoresPerGroup] = {};                 // counter per waiting core
    std::deque<Clock> clocks[kCoresPerGroup];       // ordering carried by each increment
    std::deque<double> times[kCoresPerGroup];       // modelled time each increment becomes visible
    std::deque<Clock> aivSets[2];                   // mode 2, AIV -> AIC: sets not yet paired
    std::deque<double> aivTimes[2];
};

struct Group {
    std::mutex mu;
    std::condition_variable cv;
    int alive = 0;
    int blocked = 0;
    bool aborted = false;
    std::string abortMessage;
    std::string waitingOn[kCoresPerGroup];
    int waitingFlag[kCoresPerGroup] = {-1, -1, -1};
    CrossFlag flags[kCrossFlags];

    // Every live core is blocked on a flag whose counter is zero: nobody can ever set it.
    bool Deadlocked() const
    {
        if (blocked != alive) return false;
        for (int s = 0; s < kCoresPerGroup; ++s) {
            if (waitingFlag[s] >= 0 && flags[waitingFlag[s]].count[s] > 0) return false;  // about to wake
        }
        return true;
    }
    double timeoutSeconds = 20.0;
    bool mix = false;
    const TimingParams* timing = nullptr;
};

// ------------------------------------------------------------------ instruction issue and hazards
inline uint32_t Issue(int pipe)
{
    CoreCtx& c = Core();
    const uint32_t seq = ++c.issued[pipe];
    c.seen[pipe][c.SlotOf(pipe)] = seq;
    return seq;
}

inline Clock PipeSnapshot(int pipe)
{
    CoreCtx& c = Core();
    Clock s = c.seen[pipe];
    s[c.SlotOf(pipe)] = c.issued[pipe];
    return s;
}

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
        const std::string where = "GM '" + buf->name + "'";
        CheckRecord(buf->shadow[b], pipe, seq, write, op, where.c_str(), b * kBlockBytes);
    }
}

// ------------------------------------------------------------------ intra-core flags
inline bool EventValidOn(const CoreCtx& c, int src, int dst)
{
    auto cubePipe = [](int p) { return p == P_S || p == P_M || p == P_MTE1 || p == P_MTE2 || p == P_MTE3 || p == P_FIX; };
    auto vecPipe = [](int p) { return p == P_S || p == P_V || p == P_MTE2 || p == P_MTE3; };
    return c.type == AIC ? (cubePipe(src) && cubePipe(dst)) : (vecPipe(src) && vecPipe(dst));
}

inline void SetFlagImpl(HardEvent evt, int32_t id)
{
    CoreCtx& c = Core();
    int src, dst;
    EventPipes(evt, src, dst);
    if (src < 0) Fail("SetFlag: invalid HardEvent %d", static_cast<int>(evt));
    if (!EventValidOn(c, src, dst)) Fail("SetFlag<%s_%s>: this event does not exist on an %s core", PipeShort(src), PipeShort(dst), c.type == AIC ? "AIC" : "AIV");
    if (id < 0 || id >= kEventIds) Fail("SetFlag: eventID %d outside [0, 7]", id);
    const int e = static_cast<int>(evt);
    if (c.queueFlag[e][id]) {
        Fail("SetFlag<%s_%s>(%d): a queue holds this event ID with its own flag set (FreeTensor until the next "
             "AllocTensor, EnQue until DeQue); a fixed ID collides with the queues', take one from TPipe::AllocEventID",
             PipeShort(src), PipeShort(dst), id);
    }
    if (c.flagSet[e][id]) {
        Fail("SetFlag<%s_%s>(%d) twice without a WaitFlag in between: undefined behaviour on hardware "
             "(a later PipeBarrier<PIPE_ALL> hangs)", PipeShort(src), PipeShort(dst), id);
    }
    Issue(src);
    c.flagSet[e][id] = true;
    c.flagClock[e][id] = PipeSnapshot(src);
    c.tm.event[e][id] = FlagRaise(src);
}

inline void WaitFlagImpl(HardEvent evt, int32_t id)
{
    CoreCtx& c = Core();
    int src, dst;
    EventPipes(evt, src, dst);
    if (src < 0) Fail("WaitFlag: invalid HardEvent %d", static_cast<int>(evt));
    if (!EventValidOn(c, src, dst)) Fail("WaitFlag<%s_%s>: this event does not exist on an %s core", PipeShort(src), PipeShort(dst), c.type == AIC ? "AIC" : "AIV");
    if (id < 0 || id >= kEventIds) Fail("WaitFlag: eventID %d outside [0, 7]", id);
    const int e = static_cast<int>(evt);
    if (c.queueFlag[e][id]) {
        Fail("WaitFlag<%s_%s>(%d): a queue holds this event ID with its own flag set, and the wait would take it; "
             "take an ID from TPipe::AllocEventID", PipeShort(src), PipeShort(dst), id);
    }
    if (!c.flagSet[e][id]) {
        Fail("WaitFlag<%s_%s>(%d) with no matching SetFlag before it: pipe %s would block forever (timeout on "
             "hardware)", PipeShort(src), PipeShort(dst), id, PipeName(dst));
    }
    c.flagSet[e][id] = false;
    Join(c.seen[dst], c.flagClock[e][id]);
    Issue(dst);
    FlagWait(dst, c.tm.event[e][id], src == P_V || src == P_MTE2 || src == P_MTE3);
}

inline void BarrierAll()
{
    CoreCtx& c = Core();
    Clock all{};
    for (int p = 0; p < kPipes; ++p) Join(all, PipeSnapshot(p));
    for (int p = 0; p < kPipes; ++p) Join(c.seen[p], all);
    const double at = c.tm.End();
    c.tm.scalar = at;
    for (auto& q : c.tm.pipe) q.free = q.done = std::max(q.done, at);
}

// PipeBarrier on one pipe: its next instruction waits until everything before has completed.
inline void BarrierPipe(int pipe)
{
    PipeTimeline& q = Core().tm.pipe[pipe];
    q.free = std::max(q.free, q.done);
}

// ------------------------------------------------------------------ cross-core flags (mode 2)
inline void CrossSet(int mode, int pipe, int flagId)
{
    CoreCtx& c = Core();
    Group& g = *c.group;
    if (mode != 2) Fail("CrossCoreSetFlag<%d>: only mode 2 (AIC <-> both AIVs of one AI Core) is emulated", mode);
    if (!g.mix) Fail("CrossCoreSetFlag<2>: mode 2 needs a MIX kernel with one AIC and two AIVs (KERNEL_TYPE_MIX_AIC_1_2)");
    if (flagId < 0 || flagId >= kCrossFlags) Fail("CrossCoreSetFlag: flagId %d outside [0, 15]", flagId);
    if (pipe == P_S || pipe < 0) Fail("CrossCoreSetFlag: pipe must be one of PIPE_V/M/MTE1/MTE2/MTE3/FIX, got %s", PipeName(pipe));
    Issue(pipe);
    const Clock snap = PipeSnapshot(pipe);
    const double visible = FlagRaise(pipe) + Timing().cross_core_latency_cycles;
    c.stats.cross_core_sets++;
    std::lock_guard<std::mutex> lock(g.mu);
    CrossFlag& f = g.flags[flagId];
    auto bump = [&](int target, const Clock& clk, double at) {
        if (f.count[target] >= kCrossFlagMax) {
            Fail("CrossCoreSetFlag(%d): the counter of %s would exceed 15 (it was set 16 times without a wait); "
                 "the hardware raises an exception", flagId, target == 0 ? "AIC" : (target == 1 ? "AIV0" : "AIV1"));
        }
        f.count[target]++;
        f.clocks[target].push_back(clk);
        f.times[target].push_back(at);
    };
    if (c.type == AIC) {
        bump(1, snap, visible);
        bump(2, snap, visible);
    } else {
        f.aivSets[c.subIdx].push_back(snap);
        f.aivTimes[c.subIdx].push_back(visible);
        if (f.aivSets[c.subIdx].size() > static_cast<size_t>(kCrossFlagMax)) {
            Fail("CrossCoreSetFlag(%d): AIV%d set it 16 times while AIV%d did not; the counter overflows", flagId, c.subIdx, 1 - c.subIdx);
        }
        while (!f.aivSets[0].empty() && !f.aivSets[1].empty()) {
            Clock both = f.aivSets[0].front();
            Join(both, f.aivSets[1].front());
            const double at = std::max(f.aivTimes[0].front(), f.aivTimes[1].front());
            f.aivSets[0].pop_front();
            f.aivSets[1].pop_front();
            f.aivTimes[0].pop_front();
            f.aivTimes[1].pop_front();
            bump(0, both, at);
        }
    }
    g.cv.notify_all();
}

inline void CrossWait(int flagId)
{
    CoreCtx& c = Core();
    Group& g = *c.group;
    if (!g.mix) Fail("CrossCoreWaitFlag: needs a MIX kernel with one AIC and two AIVs (KERNEL_TYPE_MIX_AIC_1_2)");
    if (flagId < 0 || flagId >= kCrossFlags) Fail("CrossCoreWaitFlag: flagId %d outside [0, 15]", flagId);
    c.stats.cross_core_waits++;
    std::unique_lock<std::mutex> lock(g.mu);
    CrossFlag& f = g.flags[flagId];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(g.timeoutSeconds);
    if (f.count[c.slot] == 0) {
        g.blocked++;
        g.waitingOn[c.slot] = "CrossCoreWaitFlag(" + std::to_string(flagId) + ")";
        g.waitingFlag[c.slot] = flagId;
        g.cv.notify_all();
        while (f.count[c.slot] == 0 && !g.aborted) {
            if (g.Deadlocked()) {
                std::string who;
                for (int s = 0; s < kCoresPerGroup; ++s) {
                    if (!g.waitingOn[s].empty()) who += (s == 0 ? " AIC waits " : (s == 1 ? " AIV0 waits " : " AIV1 waits ")) + g.waitingOn[s] + ";";
                }
                g.aborted = true;
                g.abortMessage = "deadlock in AI Core " + std::to_string(c.blockIdx) +
                                 ": every live core waits for a cross-core flag nobody will set:" + who +
                                 " (on hardware this hangs until the task timeout)";
                g.cv.notify_all();
                break;
            }
            if (g.cv.wait_until(lock, deadline) == std::cv_status::timeout && f.count[c.slot] == 0 && !g.aborted) {
                g.aborted = true;
                g.abortMessage = c.name + ": CrossCoreWaitFlag(" + std::to_string(flagId) + ") timed out after " +
                                 std::to_string(g.timeoutSeconds) + " s";
                g.cv.notify_all();
            }
        }
        g.blocked--;
        g.waitingOn[c.slot].clear();
        g.waitingFlag[c.slot] = -1;
        if (g.aborted) throw EmuError(g.abortMessage);
    }
    f.count[c.slot]--;
    const Clock clk = f.clocks[c.slot].front();
    f.clocks[c.slot].pop_front();
    const double at = f.times[c.slot].front();
    f.times[c.slot].pop_front();
    lock.unlock();
    // Atlas A2: the wait blocks every pipe of the waiting core.
    for (int p = 0; p < kPipes; ++p) Join(c.seen[p], clk);
    FlagWait(P_S, at);
}

// ------------------------------------------------------------------ launch
struct LaunchOptions {
    int blockDim = 1;
    KernelMetaType type = KERNEL_TYPE_MIX_AIC_1_2;
    double timeoutSeconds = 20.0;
    TimingParams timing;  // the timing model's parameters (all of them must be set)
};

inline thread_local KernelMetaType tls_launch_type = KERNEL_TYPE_MAX;

inline void CheckDeclaredKernelType(KernelMetaType declared)
{
    if (declared != tls_launch_type) {
        Fail("KERNEL_TASK_TYPE_DEFAULT declares kernel type %d but the kernel was launched as type %d",
             static_cast<int>(declared), static_cast<int>(tls_launch_type));
    }
}

inline void CheckCoreClean(CoreCtx& c)
{
    for (int e = 0; e < static_cast<int>(HardEvent::MAX); ++e) {
        for (int id = 0; id < kEventIds; ++id) {
            if (c.flagSet[e][id]) {
                int s, d;
                EventPipes(static_cast<HardEvent>(e), s, d);
                Fail("kernel ended with SetFlag<%s_%s>(%d) never waited for", PipeShort(s), PipeShort(d), id);
            }
        }
    }
}

// The first error of an AI Core's cores (one that is not "aborted because another core failed").
inline std::string FirstError(const std::vector<std::string>& errors)
{
    for (auto& e : errors) {
        if (!e.empty() && e.rfind("aborted because", 0) != 0) return e;
    }
    for (auto& e : errors) {
        if (!e.empty()) return e;
    }
    return std::string();
}

// Every cross-core flag of an AI Core must end with its counters at zero.
inline void CheckFlagsDrained(const Group& group, int block)
{
    for (int f = 0; f < kCrossFlags; ++f) {
        const CrossFlag& fl = group.flags[f];
        for (int s = 0; s < kCoresPerGroup; ++s) {
            if (fl.count[s] != 0) {
                throw EmuError("AI Core " + std::to_string(block) + ": CrossCoreSetFlag(" + std::to_string(f) +
                               ") was set " + std::to_string(fl.count[s]) + " more time(s) than " +
                               (s == 0 ? "AIC" : (s == 1 ? "AIV0" : "AIV1")) + " waited for it");
            }
        }
        if (!fl.aivSets[0].empty() || !fl.aivSets[1].empty()) {
            throw EmuError("AI Core " + std::to_string(block) + ": CrossCoreSetFlag(" + std::to_string(f) +
                           ") was set by only one of the two AIVs (mode 2 needs both)");
        }
    }
}

// The cores of AI Core `block`: the AIC and/or the AIVs the kernel type has.
inline std::vector<std::unique_ptr<CoreCtx>> MakeCores(const LaunchOptions& opt, GmRegistry& gm, Group& group, int block)
{
    std::vector<std::unique_ptr<CoreCtx>> cores;
    const bool mix = opt.type == KERNEL_TYPE_MIX_AIC_1_2;
    auto addCore = [&](int type, int sub, int slot, const char* name) {
        auto c = std::make_unique<CoreCtx>();
        c->type = type;
        c->blockIdx = block;
        c->subIdx = sub;
        c->slot = slot;
        c->blockDim = opt.blockDim;
        c->group = &group;
        c->gm = &gm;
        c->name = std::string(name) + " of AI Core " + std::to_string(block);
        for (Hardware h : {Hardware::UB, Hardware::L1, Hardware::L0A, Hardware::L0B, Hardware::L0C}) {
            if (c->Has(h)) {
                c->mem[static_cast<int>(h)].assign(HardwareCapacity(h), 0);
                c->shadow[static_cast<int>(h)].resize(HardwareCapacity(h) / kBlockBytes);
            }
        }
        cores.push_back(std::move(c));
    };
    if (mix || opt.type == KERNEL_TYPE_AIC_ONLY) addCore(AIC, 0, 0, "AIC");
    if (mix) {
        addCore(AIV, 0, 1, "AIV0");
        addCore(AIV, 1, 2, "AIV1");
    } else if (opt.type == KERNEL_TYPE_AIV_ONLY) {
        addCore(AIV, 0, 1, "AIV");
    }
    return cores;
}

// Runs the kernel on the cores of one AI Core as threads; throws the first failure.
inline void RunAiCore(const LaunchOptions& opt, Group& group, std::vector<std::unique_ptr<CoreCtx>>& cores,
                      const std::function<void()>& kernel, int block)
{
    group.alive = static_cast<int>(cores.size());
    std::vector<std::string> errors(cores.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < cores.size(); ++i) {
        threads.emplace_back([&, i]() {
            tls_core = cores[i].get();
            tls_launch_type = opt.type;
            try {
                kernel();
                CheckCoreClean(*cores[i]);
            } catch (const std::exception& e) {
                errors[i] = e.what();
                std::lock_guard<std::mutex> lock(group.mu);
                if (!group.aborted) {
                    group.aborted = true;
                    group.abortMessage = std::string("aborted because another core failed: ") + e.what();
                }
            }
            {
                std::lock_guard<std::mutex> lock(group.mu);
                group.alive--;
                group.cv.notify_all();
            }
            tls_core = nullptr;
        });
    }
    for (auto& t : threads) t.join();
    const std::string first = FirstError(errors);
    if (!first.empty()) throw EmuError(first);
    CheckFlagsDrained(group, block);
}

// A core's counters and timelines into the launch's totals (core_cycles: see AddAiCore).
inline void AddCore(Stats& total, const CoreCtx& c)
{
    total.Add(c.stats);
    for (int p = 0; p < kPipes; ++p) {
        const double busy = p == P_S ? c.tm.scalarBusy : c.tm.pipe[p].busy;
        total.pipe_busy[p] = std::max(total.pipe_busy[p], busy);
        total.pipe_busy_total[p] += busy;
        total.pipe_instructions[p] += c.tm.pipe[p].count;
    }
}

// One AI Core's time into the launch's: the latest completion on its cores, but no earlier than
// its GM reads (the AIC's and both AIVs' MTE2) at the AI Core's read rate, nor its GM writes
// (both AIVs' MTE3 and the AIC's Fixpipe) at its write rate: the engines share the AI Core's
// ports, a bound rather than a timeline (who waits for whom is not modelled).
inline void AddAiCore(Stats& total, const std::vector<std::unique_ptr<CoreCtx>>& cores, const TimingParams& tp)
{
    double end = 0, reads = 0, writes = 0;
    for (const auto& c : cores) {
        end = std::max(end, c->tm.End());
        reads += static_cast<double>(c->stats.gm_to_l1 + c->stats.gm_to_ub);
        writes += static_cast<double>(c->stats.ub_to_gm + c->stats.l0c_to_gm);
    }
    const double readBound = reads / tp.mte2_bytes_per_cycle;
    const double writeBound = writes / tp.core_write_bytes_per_cycle;
    total.timeline_cycles = std::max(total.timeline_cycles, end);
    total.core_read_bound_cycles = std::max(total.core_read_bound_cycles, readBound);
    total.core_write_bound_cycles = std::max(total.core_write_bound_cycles, writeBound);
    total.core_cycles = std::max(total.core_cycles, std::max(end, std::max(readBound, writeBound)));
}

// Run `kernel` (called with no arguments on every core) over options.blockDim AI Cores.
// Returns the summed statistics and the launch's modelled time; throws EmuError with the
// first failure.
inline Stats Launch(const LaunchOptions& opt, GmRegistry& gm, const std::function<void()>& kernel)
{
    if (opt.blockDim < 1) throw EmuError("launch: blockDim must be >= 1");
    const bool mix = opt.type == KERNEL_TYPE_MIX_AIC_1_2;
    if (!mix && opt.type != KERNEL_TYPE_AIC_ONLY && opt.type != KERNEL_TYPE_AIV_ONLY) {
        throw EmuError("launch: the emulation runs KERNEL_TYPE_AIC_ONLY, KERNEL_TYPE_AIV_ONLY and KERNEL_TYPE_MIX_AIC_1_2");
    }
    if (!(opt.timing.cube_macs_per_cycle > 0 && opt.timing.mte2_bytes_per_cycle > 0 &&
          opt.timing.core_write_bytes_per_cycle > 0 &&
          opt.timing.l2_aggregate_bytes_per_cycle > 0 && opt.timing.hbm_aggregate_bytes_per_cycle > 0)) {
        throw EmuError("launch: the timing model's parameters are not set (pasa_npu.npu_params supplies them)");
    }
    gm.ResetShadows();
    Stats total;
    for (int block = 0; block < opt.blockDim; ++block) {
        Group group;
        group.mix = mix;
        group.timeoutSeconds = opt.timeoutSeconds;
        group.timing = &opt.timing;
        std::vector<std::unique_ptr<CoreCtx>> cores = MakeCores(opt, gm, group, block);
        RunAiCore(opt, group, cores, kernel, block);
        for (auto& c : cores) AddCore(total, *c);
        AddAiCore(total, cores, opt.timing);
        total.blocks += 1;
        total.cores += cores.size();
    }
    const TimingParams& tp = opt.timing;
    const double gmBytes = static_cast<double>(total.gm_to_l1 + total.gm_to_ub + total.ub_to_gm + total.l0c_to_gm);
    total.hbm_bytes = gm.TouchedIoBytes();
    total.l2_bound_cycles = gmBytes / tp.l2_aggregate_bytes_per_cycle;
    total.hbm_bound_cycles = static_cast<double>(total.hbm_bytes) / tp.hbm_aggregate_bytes_per_cycle;
    total.cycles = tp.launch_overhead_cycles +
                   std::max(total.core_cycles, std::max(total.l2_bound_cycles, total.hbm_bound_cycles));
    return total;
}

}  // namespace emu
}  // namespace AscendC
