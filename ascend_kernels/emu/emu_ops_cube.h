// Mmad and Fixpipe of the AscendC CPU emulation (emu_ops_move.h states the conventions and
// the numerics modelled).
#pragma once

#include "emu_ops_move.h"

namespace AscendC {
namespace emu {

// unitFlag (Mmad 2 or 3, Fixpipe 3): the cube hands each L0C fractal from the Mmads that fill it
// to the Fixpipe that drains it and back by a flag per fractal, with no SetFlag/WaitFlag. An Mmad
// waits until the fractals it writes are clear (a Fixpipe has read them); one with 3 sets them as
// it completes (2: the chain goes on). A Fixpipe with 3 waits until the fractals it reads are set
// and clears them once it has read them, before its GM write lands ("Mmad" and "Fixpipe",
// asc-devkit's mmad_unitflag example). The model starts an instruction when its last fractal is
// ready: the overlap of one Mmad with its Fixpipe fractal by fractal is not credited.
template <typename F>
inline void ForFractals(uint64_t lo, uint64_t bytes, F f)
{
    if (bytes == 0) return;
    for (uint64_t i = lo / kL0cFractalBytes; i <= (lo + bytes - 1) / kL0cFractalBytes; ++i) f(static_cast<uint32_t>(i));
}

// Before an Mmad writes [lo, lo + bytes) of L0C: its wait (unitFlag) or the check that no
// fractal is still handed to a Fixpipe (no unitFlag).
inline void UnitFlagBeforeMmad(uint8_t unitFlag, uint64_t lo, uint64_t bytes, const char* op)
{
    CoreCtx& c = Core();
    double ready = 0;
    ForFractals(lo, bytes, [&](uint32_t i) {
        const UnitFlagCell& u = c.unitFlags[i];
        if (u.set) {
            Fail("%s: L0C fractal at byte %llu holds a result an Mmad with unitFlag 3 completed and no Fixpipe with "
                 "unitFlag 3 has read yet; %s", op, static_cast<unsigned long long>(i) * kL0cFractalBytes,
                 unitFlag ? "the Mmad would wait for a Fixpipe issued after it" : "an Mmad without unitFlag overwrites it");
        }
        if (!unitFlag) return;
        ready = std::max(ready, u.clearedAt);
        Join(c.seen[P_M], u.clearedBy);
    });
    PipeTimeline& q = c.tm.pipe[P_M];
    q.free = std::max(q.free, ready);
}

inline void UnitFlagAfterMmad(uint8_t unitFlag, uint64_t lo, uint64_t bytes, double end)
{
    if (unitFlag != 3) return;
    CoreCtx& c = Core();
    const Clock by = PipeSnapshot(P_M);
    ForFractals(lo, bytes, [&](uint32_t i) {
        UnitFlagCell& u = c.unitFlags[i];
        u.set = true;
        u.setBy = by;
        u.setAt = end;
    });
}

// The L0C column blocks a Fixpipe reads: block j (16 columns) of mSize rows at j * srcStride * 16 floats.
template <typename F>
inline void ForFixpipeFractals(uint64_t src, uint32_t nSize, uint32_t mSize, uint32_t srcStride, F f)
{
    for (uint32_t j = 0; j < nSize / 16; ++j) ForFractals(src + j * srcStride * 64ull, mSize * 64ull, f);
}

inline void UnitFlagBeforeFixpipe(uint8_t unitFlag, uint64_t src, uint32_t nSize, uint32_t mSize, uint32_t srcStride,
                                  const char* op)
{
    CoreCtx& c = Core();
    if (unitFlag != 0 && unitFlag != 3) Fail("%s: unitFlag %u: a Fixpipe takes 3 (read, then clear each fractal's flag)", op, unitFlag);
    double ready = 0;
    ForFixpipeFractals(src, nSize, mSize, srcStride, [&](uint32_t i) {
        const UnitFlagCell& u = c.unitFlags[i];
        if (unitFlag && !u.set) {
            Fail("%s: unitFlag 3 reads L0C fractal at byte %llu that no Mmad with unitFlag 3 has completed: the Fixpipe "
                 "would wait forever", op, static_cast<unsigned long long>(i) * kL0cFractalBytes);
        }
        if (!unitFlag && u.set) {
            Fail("%s: reads L0C fractal at byte %llu without unitFlag while an Mmad with unitFlag 3 left its flag set: "
                 "the next Mmad with unitFlag would wait forever", op, static_cast<unsigned long long>(i) * kL0cFractalBytes);
        }
        if (!unitFlag) return;
        ready = std::max(ready, u.setAt);
        Join(c.seen[P_FIX], u.setBy);
    });
    PipeTimeline& q = c.tm.pipe[P_FIX];
    q.free = std::max(q.free, ready);
}

inline void UnitFlagAfterFixpipe(uint8_t unitFlag, uint64_t src, uint32_t nSize, uint32_t mSize, uint32_t srcStride,
                                 double readEnd)
{
    if (unitFlag != 3) return;
    CoreCtx& c = Core();
    const Clock by = PipeSnapshot(P_FIX);
    ForFixpipeFractals(src, nSize, mSize, srcStride, [&](uint32_t i) {
        UnitFlagCell& u = c.unitFlags[i];
        u.set = false;
        u.clearedBy = by;
        u.clearedAt = readEnd;
    });
}

// Issue and time a Fixpipe reading `src` (a byte offset in L0C) under `p`, unit flags included, that
// writes `outBytes` and completes `latency` cycles after its occupancy: its sequence number.
inline uint32_t IssueFixpipe(uint64_t src, const FixpipeParamsV220& p, double outBytes, double latency, const char* op)
{
    UnitFlagBeforeFixpipe(p.unitFlag, src, p.nSize, p.mSize, p.srcStride, op);
    const uint32_t seq = Issue(P_FIX);
    const double occupancy = Timing().fix_head_cycles + outBytes / Timing().fix_bytes_per_cycle;
    UnitFlagAfterFixpipe(p.unitFlag, src, p.nSize, p.mSize, p.srcStride, Dispatch(P_FIX, occupancy, latency) + occupancy);
    return seq;
}

}  // namespace emu

// ================================================================== Mmad
// A (m x k) in L0A as Zz fractals, B (k x n) in L0B as Zn fractals, C (m x n) in L0C as Nz.
template <typename T, typename U, typename S>
void Mmad(const LocalTensor<T>& dst, const LocalTensor<U>& fm, const LocalTensor<S>& filter, const MmadParams& p)
{
    const char* op = "Mmad";
    static_assert(std::is_same<T, float>::value, "the emulated Mmad accumulates into float (L0C)");
    static_assert(std::is_same<U, S>::value, "Mmad: fm and filter must have the same type");
    static_assert(std::is_same<U, half>::value || std::is_same<U, bfloat16_t>::value,
                  "the emulated Mmad takes half or bfloat16_t operands");
    emu::CheckPosition(dst, {TPosition::CO1}, op, "dst");
    emu::CheckPosition(fm, {TPosition::A2}, op, "fm");
    emu::CheckPosition(filter, {TPosition::B2}, op, "filter");
    emu::CheckAligned(dst, 1024, op, "dst");
    emu::CheckAligned(fm, 512, op, "fm");
    emu::CheckAligned(filter, 512, op, "filter");
    if (p.m > 4095 || p.n > 4095 || p.k > 4095) emu::Fail("%s: m, n, k must lie in [0, 4095]", op);
    if (p.isBias || p.cmatrixSource) emu::Fail("%s: bias / C from BT buffer is not emulated", op);
    if (p.unitFlag == 1 || p.unitFlag > 3) emu::Fail("%s: unitFlag %u: 0 (off), 2 or 3 (the chain's last Mmad)", op, p.unitFlag);
    if (p.m == 0 || p.n == 0 || p.k == 0) return;
    const uint32_t m16 = (p.m + 15) / 16, n16 = (p.n + 15) / 16, k16 = (p.k + 15) / 16;
    emu::CheckExtent(fm, static_cast<uint64_t>(m16) * k16 * 256 * sizeof(U), op, "fm");
    emu::CheckExtent(filter, static_cast<uint64_t>(k16) * n16 * 256 * sizeof(U), op, "filter");
    const uint64_t dstBytes = static_cast<uint64_t>(m16) * n16 * 256 * sizeof(float);
    emu::CheckExtent(dst, dstBytes, op, "dst");
    emu::UnitFlagBeforeMmad(p.unitFlag, dst.ByteOffset(), dstBytes, op);
    const uint32_t seq = emu::Issue(emu::P_M);
    const double occupancy = emu::Timing().mmad_head_cycles +
                             static_cast<double>(m16) * n16 * k16 * 4096.0 / emu::Timing().cube_macs_per_cycle;
    emu::UnitFlagAfterMmad(p.unitFlag, dst.ByteOffset(), dstBytes, emu::Dispatch(emu::P_M, occupancy) + occupancy);
    emu::TouchLocal(emu::P_M, seq, Hardware::L0A, fm.ByteOffset(), static_cast<uint64_t>(m16) * k16 * 256 * sizeof(U), false, op);
    emu::TouchLocal(emu::P_M, seq, Hardware::L0B, filter.ByteOffset(), static_cast<uint64_t>(k16) * n16 * 256 * sizeof(U), false, op);
    emu::TouchLocal(emu::P_M, seq, Hardware::L0C, dst.ByteOffset(), dstBytes, true, op);
    // Operands converted once: A row-major (m x k), B row-major (k x n). Every product of two
    // fp16/bf16 values is exact in fp32, so acc + a * b rounds once, like the documented
    // accumulation one k at a time. Each output sums its k in order; the loop over a row's
    // outputs, independent of each other, is the one the compiler vectorises.
    const U* a = fm.Data();
    const U* b = filter.Data();
    float* c = dst.Data();
    std::vector<float> am(static_cast<size_t>(p.m) * p.k), bk(static_cast<size_t>(p.k) * p.n), row(p.n);
    for (uint32_t i = 0; i < p.m; ++i) {
        for (uint32_t kk = 0; kk < p.k; ++kk) am[i * p.k + kk] = static_cast<float>(a[((i / 16) * k16 + kk / 16) * 256 + (i % 16) * 16 + kk % 16]);
    }
    for (uint32_t kk = 0; kk < p.k; ++kk) {
        for (uint32_t j = 0; j < p.n; ++j) bk[kk * p.n + j] = static_cast<float>(b[((kk / 16) * n16 + j / 16) * 256 + (j % 16) * 16 + kk % 16]);
    }
    for (uint32_t i = 0; i < p.m; ++i) {
        float* sums = row.data();
        for (uint32_t j = 0; j < p.n; ++j) sums[j] = p.cmatrixInitVal ? 0.0f : c[((j / 16) * m16 + i / 16) * 256 + (i % 16) * 16 + j % 16];
        for (uint32_t kk = 0; kk < p.k; ++kk) {
            const float x = am[i * p.k + kk];
            const float* brow = &bk[static_cast<size_t>(kk) * p.n];
            for (uint32_t j = 0; j < p.n; ++j) sums[j] += x * brow[j];
        }
        for (uint32_t j = 0; j < p.n; ++j) c[((j / 16) * m16 + i / 16) * 256 + (i % 16) * 16 + j % 16] = sums[j];
    }
    auto& st = emu::Core().stats;
    st.mmad_calls++;
    st.cube_macs += static_cast<uint64_t>(p.m) * p.n * p.k;
}

// ================================================================== Fixpipe (L0C -> GM, NZ -> ND)
template <typename T, typename U, const FixpipeConfig& config = CFG_ROW_MAJOR>
void Fixpipe(const GlobalTensor<T>& dst, const LocalTensor<U>& src, const FixpipeParamsV220& p)
{
    const char* op = "Fixpipe(L0C->GM)";
    static_assert(std::is_same<U, float>::value, "the emulated Fixpipe reads float from L0C");
    static_assert(config.format == CO2Layout::ROW_MAJOR, "the emulated Fixpipe writes ND (CFG_ROW_MAJOR)");
    emu::CheckPosition(src, {TPosition::CO1}, op, "src");
    emu::CheckAligned(src, 64, op, "src");
    if (p.nSize == 0 || p.mSize == 0 || p.ndNum == 0) return;
    if (p.nSize % 16 != 0) emu::Fail("%s: nSize %u must be a multiple of 16", op, p.nSize);
    if (p.nSize > 4095 || p.mSize > 8192) emu::Fail("%s: nSize <= 4095 and mSize <= 8192 (NZ2ND)", op);
    if (p.ndNum != 1) emu::Fail("%s: ndNum > 1 is not emulated", op);
    if (p.srcStride < (p.mSize + 15) / 16 * 16) {
        emu::Fail("%s: srcStride %u must be mSize rounded up to 16 (%u) or more", op, p.srcStride, (p.mSize + 15) / 16 * 16);
    }
    if (p.dstStride < p.nSize) emu::Fail("%s: dstStride %u (ND row length) is smaller than nSize %u", op, p.dstStride, p.nSize);
    if (p.reluEn || p.isChannelSplit) emu::Fail("%s: relu / channel split are not emulated", op);
    constexpr bool toF32 = std::is_same<T, float>::value;
    constexpr bool toF16 = std::is_same<T, half>::value;
    constexpr bool toBf16 = std::is_same<T, bfloat16_t>::value;
    if (toF32 && p.quantPre != QuantMode_t::NoQuant) emu::Fail("%s: float output needs quantPre NoQuant", op);
    if (toF16 && p.quantPre != QuantMode_t::F322F16) emu::Fail("%s: half output needs quantPre F322F16 (it is not inferred)", op);
    if (toBf16 && p.quantPre != QuantMode_t::F322BF16) emu::Fail("%s: bfloat16_t output needs quantPre F322BF16", op);
    static_assert(toF32 || toF16 || toBf16, "Fixpipe: output type must be float, half or bfloat16_t");
    const uint64_t srcSpan = ((p.nSize / 16 - 1ull) * p.srcStride * 16 + p.mSize * 16ull) * sizeof(float);
    emu::CheckExtent(src, srcSpan, op, "src");
    const uint32_t seq = emu::IssueFixpipe(src.ByteOffset(), p, static_cast<double>(p.mSize) * p.nSize * sizeof(T),
                                           emu::Timing().gm_write_latency_cycles, op);
    emu::TouchLocal(emu::P_FIX, seq, Hardware::L0C, src.ByteOffset(), srcSpan, false, op);
    const float* c = src.Data();
    for (uint32_t i = 0; i < p.mSize; ++i) {
        T* row = dst.address_ + static_cast<uint64_t>(i) * p.dstStride;
        emu::TouchGm(emu::P_FIX, seq, row, p.nSize * sizeof(T), true, op);
        for (uint32_t j = 0; j < p.nSize; ++j) row[j] = static_cast<T>(c[(j / 16) * static_cast<uint64_t>(p.srcStride) * 16 + i * 16 + j % 16]);
    }
    emu::Core().stats.l0c_to_gm += static_cast<uint64_t>(p.mSize) * p.nSize * sizeof(T);
}

// ================================================================== Fixpipe (L0C -> L1, NZ)
// The NZ tile stays NZ: column block cb (16 columns) of the mSize rows goes to dst + cb * dstStride
// 32-byte blocks, row i of it at 32 bytes a row ("Fixpipe", L0C Buffer(CO1) to L1 Buffer(A1/B1):
// CFG_NZ only, float to half / bfloat16_t / int8 only on Atlas A2, dstStride in 32-byte units).
template <typename T, typename U, const FixpipeConfig& config = CFG_ROW_MAJOR>
void Fixpipe(const LocalTensor<T>& dst, const LocalTensor<U>& src, const FixpipeParamsV220& p)
{
    const char* op = "Fixpipe(L0C->L1)";
    static_assert(std::is_same<U, float>::value, "the emulated Fixpipe reads float from L0C");
    static_assert(std::is_same<T, half>::value || std::is_same<T, bfloat16_t>::value,
                  "Fixpipe to L1: the emulation writes half or bfloat16_t (float -> float is not supported on Atlas A2)");
    if (config.format != CO2Layout::NZ) emu::Fail("%s: the format must be NZ (CFG_NZ) when the destination is L1", op);
    emu::CheckPosition(src, {TPosition::CO1}, op, "src");
    emu::CheckPosition(dst, {TPosition::A1, TPosition::B1}, op, "dst");
    emu::CheckAligned(src, 64, op, "src");
    emu::CheckAligned(dst, 32, op, "dst");
    if (p.nSize == 0 || p.mSize == 0) return;
    if (p.nSize % 16 != 0) emu::Fail("%s: nSize %u must be a multiple of 16", op, p.nSize);
    if (p.srcStride < (p.mSize + 15) / 16 * 16) {
        emu::Fail("%s: srcStride %u must be mSize rounded up to 16 (%u) or more", op, p.srcStride, (p.mSize + 15) / 16 * 16);
    }
    if (p.dstStride < p.mSize) emu::Fail("%s: dstStride %u (32-byte rows between column blocks) is below mSize %u", op, p.dstStride, p.mSize);
    if (p.reluEn || p.isChannelSplit) emu::Fail("%s: relu / channel split are not emulated", op);
    constexpr bool toF16 = std::is_same<T, half>::value;
    if (toF16 && p.quantPre != QuantMode_t::F322F16) emu::Fail("%s: half output needs quantPre F322F16 (it is not inferred)", op);
    if (!toF16 && p.quantPre != QuantMode_t::F322BF16) emu::Fail("%s: bfloat16_t output needs quantPre F322BF16", op);
    const uint32_t blocks = p.nSize / 16;
    const uint64_t srcSpan = ((blocks - 1ull) * p.srcStride * 16 + p.mSize * 16ull) * sizeof(float);
    const uint64_t dstSpan = ((blocks - 1ull) * p.dstStride + p.mSize) * 32ull;
    emu::CheckExtent(src, srcSpan, op, "src");
    emu::CheckExtent(dst, dstSpan, op, "dst");
    const uint32_t seq = emu::IssueFixpipe(src.ByteOffset(), p, static_cast<double>(p.mSize) * p.nSize * sizeof(T), 0.0, op);
    emu::TouchLocal(emu::P_FIX, seq, Hardware::L0C, src.ByteOffset(), srcSpan, false, op);
    const float* c = src.Data();
    T* out = dst.Data();
    for (uint32_t cb = 0; cb < blocks; ++cb) {
        const uint64_t at = cb * static_cast<uint64_t>(p.dstStride) * 32 / sizeof(T);
        emu::TouchLocal(emu::P_FIX, seq, Hardware::L1, dst.ByteOffset() + at * sizeof(T), p.mSize * 32ull, true, op);
        for (uint32_t i = 0; i < p.mSize; ++i) {
            for (uint32_t k = 0; k < 16; ++k) out[at + i * 16 + k] = static_cast<T>(c[cb * static_cast<uint64_t>(p.srcStride) * 16 + i * 16 + k]);
        }
    }
}

}  // namespace AscendC
