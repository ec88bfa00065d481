// The per-instruction record: every simulated instruction states its pipe, the byte ranges it
// reads and writes in each local memory (UB, L1, L0A, L0B, L0C) and in GM, and the quantities
// its cost depends on. The instruction headers fill one record per instruction and Issue() it;
// the hazard checker (sim_hazards.h) and the timing model (sim_timing.h) both read it.
//
// Contract.
// * Begin(name, pipe) starts the record of one instruction on `pipe` (a pipe_t value: PIPE_S,
//   PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3 or PIPE_FIX); Read/Write(p, bytes) add a
//   byte range (its memory found from the address: inside the CPU-debug build's UB, L1, L0A,
//   L0B or L0C buffers, else GM); VecOperand adds the 32-byte blocks of a vector operand that
//   hold an active lane; Cost(...) sets what the instruction's cycles depend on. Issue() checks
//   and times the record, before the instruction's data operation runs.
// * Synchronisation goes to the checker and the timing model through sim_issue.h's
//   PipesSetFlag / PipesWaitFlag / PipesBarrier / PipesCrossSet / PipesCrossWait (called by
//   sim_sync.h and sim_launch.h).
// * Scalar register instructions (masks, CTRL, CMPMASK from a register) are ScalarOp(name):
//   PIPE_S, no memory. The scalar unit's own loads and stores (LocalTensor::GetValue/SetValue
//   read memory directly in the CPU-debug build) are not seen by the simulator.
#ifndef PASA_SIM_PIPES_H
#define PASA_SIM_PIPES_H

#include <cstdint>
#include <cstring>
#include <vector>

#include "../emu/emu_timing.h"
#include "sim_core.h"

namespace pasa_sim {

// The pipes the simulator tracks, as slots 0..6.
enum Slot : int { kS = 0, kV, kM, kMte1, kMte2, kMte3, kFix, kSlots };

inline const char* SlotName(int s)
{
    static const char* names[] = {"S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX"};
    return s >= 0 && s < kSlots ? names[s] : "?";
}

// A pipe_t value as a slot; -1 for PIPE_ALL. Any other pipe fails.
inline int SlotOf(int pipe)
{
    switch (pipe) {
    case 0: return kS;     // PIPE_S
    case 1: return kV;     // PIPE_V
    case 2: return kM;     // PIPE_M
    case 3: return kMte1;  // PIPE_MTE1
    case 4: return kMte2;  // PIPE_MTE2
    case 5: return kMte3;  // PIPE_MTE3
    case 6: return -1;     // PIPE_ALL
    case 10: return kFix;  // PIPE_FIX
    default: Fail("pipe %d is not simulated", pipe);
    }
}

enum Mem : int { kGM = 0, kUB, kL1, kL0A, kL0B, kL0C, kMems };

inline const char* MemName(int m)
{
    static const char* names[] = {"GM", "UB", "L1", "L0A", "L0B", "L0C"};
    return m >= 0 && m < kMems ? names[m] : "?";
}

// Bases and sizes of the local memories of this process (from the CPU-debug build's buffers;
// defined in sim_globals.h, where the asc-devkit's declarations are visible).
void LocalMemories(uint8_t* base[kMems], uint64_t size[kMems]);

struct MemMap {
    uint8_t* base[kMems] = {};
    uint64_t size[kMems] = {};
    bool ready = false;
};

inline MemMap& Memories()
{
    static MemMap m;
    if (!m.ready) {
        LocalMemories(m.base, m.size);
        m.ready = true;
    }
    return m;
}

// What fresh device memory and a launch's local memories hold, never zeros (fp16 and fp32 NaN),
// so that a kernel which uses what it did not write shows it.
constexpr uint8_t kUnwrittenByte = 0xFF;

// A launch finds in its local memories what the last one left: each core starts with every byte
// kUnwrittenByte.
inline void StaleLocalMemories()
{
    const MemMap& m = Memories();
    for (int k = kUB; k < kMems; ++k) {
        if (m.base[k] != nullptr) std::memset(m.base[k], kUnwrittenByte, m.size[k]);
    }
}

// The memory holding p and p's offset in it (GM: the address itself).
inline int Locate(const void* p, uint64_t* offset)
{
    const MemMap& m = Memories();
    const uint8_t* b = static_cast<const uint8_t*>(p);
    for (int k = kUB; k < kMems; ++k) {
        if (m.base[k] != nullptr && b >= m.base[k] && b < m.base[k] + m.size[k]) {
            *offset = static_cast<uint64_t>(b - m.base[k]);
            return k;
        }
    }
    *offset = reinterpret_cast<uint64_t>(p);
    return kGM;
}

struct Access {
    int mem;
    uint64_t lo, hi;  // [lo, hi) bytes
    bool write;
};

// What an instruction's cycles depend on (sim_timing.h turns it into cycles).
enum class Work : uint8_t {
    kNone,      // a scalar register instruction: one issue
    kGmRead,    // MTE2 GM -> UB / L1: `units` bytes
    kGmWrite,   // MTE3 UB -> GM: `units` bytes
    kFillL1,    // create_cbuf_matrix on MTE2: `units` bytes
    kToL0A,     // MTE1 L1 -> L0A (and fills of L0A): `units` bytes
    kToL0B,     // MTE1 L1 -> L0B (and fills of L0B): `units` bytes
    kMad,       // M: `units` fractal steps ceil(m/16) ceil(k/16) ceil(n/16)
    kFix,       // FIX L0C -> GM / L1: `units` output bytes
    kVec,       // V: `units` repeats at `perRepeat` cycles each
};

struct Instr {
    const char* name = "";
    int slot = kS;
    Work work = Work::kNone;
    double units = 0;
    double perRepeat = 1;
    uint8_t unitFlag = 0;  // mad and fixpipe: their L0C unit flag mode (sim_unit_flag.h)
    uint64_t gmRead = 0, gmWrite = 0;
    std::vector<Access> acc;
};

inline Instr& Current()
{
    static Instr in;
    return in;
}

inline Instr& Begin(const char* name, int pipe)
{
    Instr& in = Current();
    in.name = name;
    in.slot = SlotOf(pipe);
    in.work = Work::kNone;
    in.units = 0;
    in.perRepeat = 1;
    in.unitFlag = 0;
    in.gmRead = in.gmWrite = 0;
    in.acc.clear();
    return in;
}

inline void AddRange(int mem, uint64_t lo, uint64_t hi, bool write)
{
    if (hi <= lo) return;
    Instr& in = Current();
    if (!in.acc.empty()) {
        Access& last = in.acc.back();
        if (last.mem == mem && last.write == write && lo <= last.hi && hi >= last.lo) {
            const uint64_t before = last.hi - last.lo;
            if (lo < last.lo) last.lo = lo;
            if (hi > last.hi) last.hi = hi;
            if (mem == kGM) (write ? in.gmWrite : in.gmRead) += last.hi - last.lo - before;
            return;
        }
    }
    in.acc.push_back(Access{mem, lo, hi, write});
    if (mem == kGM) (write ? in.gmWrite : in.gmRead) += hi - lo;
}

inline void Touch(const void* p, uint64_t bytes, bool write)
{
    uint64_t at = 0;
    const int mem = Locate(p, &at);
    AddRange(mem, at, at + bytes, write);
}

inline void Read(const void* p, uint64_t bytes) { Touch(p, bytes, false); }
inline void Write(const void* p, uint64_t bytes) { Touch(p, bytes, true); }

// Bursts of `len` bytes, burst k at p + k * pitch.
inline void TouchBursts(const void* p, uint64_t n, uint64_t len, uint64_t pitch, bool write)
{
    for (uint64_t k = 0; k < n; ++k) Touch(static_cast<const uint8_t*>(p) + k * pitch, len, write);
}

// The blocks of one operand of a vector instruction (sim_core.h's iteration): `lanes` lanes a
// repeat, `elemBytes` this operand's element size; a block counts when one of its lanes is
// active.
inline void VecOperand(const void* base, uint32_t elemBytes, uint32_t lanes, uint64_t repeatArg, uint64_t blkStride,
                       uint64_t repStride, bool write)
{
    const uint32_t perBlock = 32 / elemBytes;
    const uint32_t blocks = (lanes + perBlock - 1) / perBlock;
    const VecIter it(256 / lanes, repeatArg);
    const uint64_t repeats = it.Repeats();
    uint64_t offset = 0;
    const int mem = Locate(base, &offset);
    for (uint64_t r = 0; r < repeats; ++r) {
        for (uint32_t b = 0; b < blocks; ++b) {
            bool active = false;
            for (uint32_t i = b * perBlock; i < (b + 1) * perBlock && i < lanes && !active; ++i) active = it.Active(r, i);
            if (!active) continue;
            const uint64_t at = offset + (r * repStride + b * blkStride) * 32;
            AddRange(mem, at, at + 32, write);
        }
    }
}

inline void Cost(Work work, double units, double perRepeat = 1)
{
    Instr& in = Current();
    in.work = work;
    in.units = units;
    in.perRepeat = perRepeat;
}

// A vector instruction's cost: its repeats (counter mode: from the count) at the published
// rate of its kind (emu_timing.h's table, shared with the emulation's model).
inline void VecCost(AscendC::emu::VecKind kind, uint32_t widestBytes, uint64_t repeatArg)
{
    const VecIter it(widestBytes, repeatArg);
    Cost(Work::kVec, static_cast<double>(it.Repeats()), AscendC::emu::VecCyclesPerRepeat(kind, widestBytes));
}

inline void Issue();  // sim_issue.h: the hazard check and the timing of Current()

inline void ScalarOp(const char* name)
{
    Begin(name, 0);
    Issue();
}

}  // namespace pasa_sim

#endif
