// The Atlas A2 hardware as the AscendC CPU emulation models it: the pipes, the memories
// with their capacities and alignments, the events between pipes, and the error that a
// check the hardware imposes raises.
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
#include <unordered_map>
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
// L1 TPipe may hand out: asc-devkit keeps 128 bytes for itself on Atlas A2 (TOTAL_L1_SIZE)
constexpr uint32_t kL1TpipeBytes = kL1Bytes - 128;
constexpr uint32_t kL0ABytes = 64 * 1024;
constexpr uint32_t kL0BBytes = 64 * 1024;
constexpr uint32_t kL0CBytes = 128 * 1024;
constexpr uint32_t kBlockBytes = 32;      // DataBlock
constexpr uint32_t kFractalBytes = 512;   // one 16x16 b16 fractal
constexpr uint32_t kGranuleBytes = 512;   // GM granule of the HBM traffic bound
constexpr uint32_t kDataCacheLineBytes = 64;         // the scalar unit's data cache (HWC)
constexpr uint32_t kDataCacheBytes = 32 * 1024;
constexpr uint32_t kDataCachePreloadBytes = 256;  // one DataCachePreload (asc-devkit dav_c220 ListTensorDesc)
constexpr uint8_t kUnwrittenByte = 0xFF;  // fresh GM and a launch's UB, L1, L0: fp16/fp32 NaN
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
// What TPipe's buffers of `h` may take: the whole memory but for L1's reserve.
inline uint32_t TpipeCapacity(Hardware h) { return h == Hardware::L1 ? kL1TpipeBytes : HardwareCapacity(h); }
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

}  // namespace emu
}  // namespace AscendC
