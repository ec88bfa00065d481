// Data movement, cube, vector and synchronisation instructions of the AscendC CPU
// emulation. Each function has the signature of its asc-devkit declaration
// (kernel_operator_data_copy_intf.h, kernel_operator_mm_intf.h, kernel_operator_fixpipe_intf.h,
// kernel_operator_vec_*_intf.h, kernel_operator_block_sync_intf.h) restricted to the
// overloads the PASA kernels call, and checks the operands as the documentation states.
//
// Numerics modelled (not measured on hardware; see ascend_kernels/README.md, "The emulation"):
// * Mmad: products of fp16/bf16 operands are exact in fp32; they are accumulated into
//   the fp32 L0C value one k at a time, in increasing k, with one rounding per step.
// * Vector arithmetic on half: computed in fp32 and rounded once to fp16 (RNE). Exp/Ln: the
//   exact function of the fp32 value rounded to fp32 (then to fp16 for half), as the
//   simulator chooses; the hardware's results to the bit are not documented.
// * ReduceSum (count mode, Atlas A2): a binary tree of adjacent pairs inside each
//   256-byte repeat, repeats added in order (documented "方式一").
// * Casts and Fixpipe F322F16/F322BF16: round to nearest even, overflow to inf
//   (non-saturating mode).
#pragma once

#include <cmath>
#include <type_traits>

#include "emu_tensor.h"

namespace AscendC {
namespace emu {

template <typename T>
void CheckAligned(const LocalTensor<T>& t, uint32_t alignment, const char* op, const char* name)
{
    if (t.ByteOffset() % alignment != 0) {
        Fail("%s: %s starts at %s byte %u, not %u-byte aligned", op, name, HardwareName(t.HardwareKind()),
             t.ByteOffset(), alignment);
    }
}

template <typename T>
void CheckPosition(const LocalTensor<T>& t, std::initializer_list<TPosition> allowed, const char* op, const char* name)
{
    for (TPosition p : allowed) {
        if (t.GetPosition() == p) return;
    }
    std::string list;
    for (TPosition p : allowed) list += std::string(list.empty() ? "" : "/") + PositionName(p);
    Fail("%s: %s is in TPosition %s, expected %s", op, name, PositionName(t.GetPosition()), list.c_str());
}

template <typename T>
void CheckExtent(const LocalTensor<T>& t, uint64_t bytes, const char* op, const char* name)
{
    const uint64_t avail = static_cast<uint64_t>(t.capacity_) * sizeof(T);
    if (bytes > avail) {
        Fail("%s: %s needs %llu bytes but its buffer has %llu from this offset", op, name,
             static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(avail));
    }
}

inline void CheckGmAligned(const void* p, size_t alignment, const char* op)
{
    if (reinterpret_cast<uintptr_t>(p) % alignment != 0) Fail("%s: GM address %p is not %zu-byte aligned", op, p, alignment);
}

template <typename T>
constexpr bool IsB16()
{
    return sizeof(T) == 2;
}

inline bool UbPosition(TPosition p) { return p == TPosition::VECIN || p == TPosition::VECOUT || p == TPosition::VECCALC; }
}  // namespace emu

// ================================================================== GM <-> UB
template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyParams& p)
{
    const char* op = "DataCopy(GM->UB)";
    emu::CheckPosition(dst, {TPosition::VECIN, TPosition::VECOUT, TPosition::VECCALC}, op, "dst");
    emu::CheckAligned(dst, 32, op, "dst");
    emu::CheckGmAligned(src.address_, sizeof(T), op);
    if (p.blockCount == 0 || p.blockLen == 0) return;
    const uint64_t blk = p.blockLen * 32ull;
    emu::CheckExtent(dst, (p.blockCount - 1ull) * (p.blockLen + p.dstStride) * 32 + blk, op, "dst");
    const uint32_t seq = emu::Issue(emu::P_MTE2);
    emu::Dispatch(emu::P_MTE2, emu::GmReadCycles(static_cast<double>(p.blockCount) * blk), emu::Timing().gm_read_latency_cycles);
    for (uint32_t i = 0; i < p.blockCount; ++i) {
        const uint8_t* s = reinterpret_cast<const uint8_t*>(src.address_) + i * (p.blockLen + p.srcStride) * 32ull;
        const uint64_t d = i * (p.blockLen + p.dstStride) * 32ull;
        emu::TouchGm(emu::P_MTE2, seq, s, blk, false, op);
        emu::TouchLocal(emu::P_MTE2, seq, Hardware::UB, dst.ByteOffset() + d, blk, true, op);
        std::memcpy(dst.Raw() + d, s, blk);
    }
    emu::Core().stats.gm_to_ub += p.blockCount * blk;
}

template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p)
{
    const char* op = "DataCopy(UB->GM)";
    emu::CheckPosition(src, {TPosition::VECIN, TPosition::VECOUT, TPosition::VECCALC}, op, "src");
    emu::CheckAligned(src, 32, op, "src");
    emu::CheckGmAligned(dst.address_, sizeof(T), op);
    if (p.blockCount == 0 || p.blockLen == 0) return;
    const uint64_t blk = p.blockLen * 32ull;
    emu::CheckExtent(src, (p.blockCount - 1ull) * (p.blockLen + p.srcStride) * 32 + blk, op, "src");
    const uint32_t seq = emu::Issue(emu::P_MTE3);
    emu::Dispatch(emu::P_MTE3, emu::GmWriteCycles(static_cast<double>(p.blockCount) * blk), emu::Timing().gm_write_latency_cycles);
    for (uint32_t i = 0; i < p.blockCount; ++i) {
        uint8_t* d = reinterpret_cast<uint8_t*>(dst.address_) + i * (p.blockLen + p.dstStride) * 32ull;
        const uint64_t s = i * (p.blockLen + p.srcStride) * 32ull;
        emu::TouchLocal(emu::P_MTE3, seq, Hardware::UB, src.ByteOffset() + s, blk, false, op);
        emu::TouchGm(emu::P_MTE3, seq, d, blk, true, op);
        std::memcpy(d, src.Raw() + s, blk);
    }
    emu::Core().stats.ub_to_gm += p.blockCount * blk;
}

template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const uint32_t count)
{
    if ((count * sizeof(T)) % 32 != 0) {
        emu::Fail("DataCopy(GM->UB, count=%u): count * sizeof(T) = %zu bytes is not a multiple of 32; the hardware "
                  "silently truncates it (use DataCopyPad)", count, count * sizeof(T));
    }
    DataCopy(dst, src, DataCopyParams(1, static_cast<uint16_t>(count * sizeof(T) / 32), 0, 0));
}

template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count)
{
    if ((count * sizeof(T)) % 32 != 0) {
        emu::Fail("DataCopy(UB->GM, count=%u): count * sizeof(T) = %zu bytes is not a multiple of 32; the hardware "
                  "silently truncates it (use DataCopyPad)", count, count * sizeof(T));
    }
    DataCopy(dst, src, DataCopyParams(1, static_cast<uint16_t>(count * sizeof(T) / 32), 0, 0));
}

template <typename T>
void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                 const DataCopyPadExtParams<T>& pad)
{
    const char* op = "DataCopyPad(GM->UB)";
    emu::CheckPosition(dst, {TPosition::VECIN, TPosition::VECOUT, TPosition::VECCALC}, op, "dst");
    emu::CheckAligned(dst, 32, op, "dst");
    emu::CheckGmAligned(src.address_, sizeof(T), op);
    if (p.blockLen % sizeof(T) != 0) emu::Fail("%s: blockLen %u is not a multiple of sizeof(T)", op, p.blockLen);
    if ((pad.leftPadding + pad.rightPadding) * sizeof(T) > 32 || pad.leftPadding * sizeof(T) > 32) {
        emu::Fail("%s: leftPadding/rightPadding may not exceed 32 bytes", op);
    }
    if (p.blockCount == 0 || p.blockLen == 0) return;
    const uint64_t row = (p.blockLen + (pad.leftPadding + pad.rightPadding) * sizeof(T) + 31) / 32 * 32;
    emu::CheckExtent(dst, (p.blockCount - 1ull) * (row + p.dstStride * 32ull) + row, op, "dst");
    const uint32_t seq = emu::Issue(emu::P_MTE2);
    emu::Dispatch(emu::P_MTE2, emu::GmReadCycles(static_cast<double>(p.blockCount) * row), emu::Timing().gm_read_latency_cycles);
    for (uint32_t i = 0; i < p.blockCount; ++i) {
        const uint8_t* s = reinterpret_cast<const uint8_t*>(src.address_) + i * static_cast<uint64_t>(p.blockLen + p.srcStride);
        const uint64_t d = i * (row + p.dstStride * 32ull);
        emu::TouchGm(emu::P_MTE2, seq, s, p.blockLen, false, op);
        emu::TouchLocal(emu::P_MTE2, seq, Hardware::UB, dst.ByteOffset() + d, row, true, op);
        // padding to 32 bytes: paddingValue, or (documented) the block's first element
        T* out = reinterpret_cast<T*>(dst.Raw() + d);
        const uint32_t total = static_cast<uint32_t>(row / sizeof(T));
        T first;
        std::memcpy(&first, s, sizeof(T));
        for (uint32_t k = 0; k < total; ++k) out[k] = pad.isPad ? pad.paddingValue : first;
        std::memcpy(out + pad.leftPadding, s, p.blockLen);
    }
    emu::Core().stats.gm_to_ub += static_cast<uint64_t>(p.blockCount) * p.blockLen;
}

template <typename T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p)
{
    const char* op = "DataCopyPad(UB->GM)";
    emu::CheckPosition(src, {TPosition::VECIN, TPosition::VECOUT, TPosition::VECCALC}, op, "src");
    emu::CheckAligned(src, 32, op, "src");
    emu::CheckGmAligned(dst.address_, sizeof(T), op);
    if (p.blockLen % sizeof(T) != 0) emu::Fail("%s: blockLen %u is not a multiple of sizeof(T)", op, p.blockLen);
    if (p.blockCount == 0 || p.blockLen == 0) return;
    const uint64_t row = (p.blockLen + 31) / 32 * 32;
    emu::CheckExtent(src, (p.blockCount - 1ull) * (row + p.srcStride * 32ull) + p.blockLen, op, "src");
    const uint32_t seq = emu::Issue(emu::P_MTE3);
    emu::Dispatch(emu::P_MTE3, emu::GmWriteCycles(static_cast<double>(p.blockCount) * row), emu::Timing().gm_write_latency_cycles);
    for (uint32_t i = 0; i < p.blockCount; ++i) {
        uint8_t* d = reinterpret_cast<uint8_t*>(dst.address_) + i * static_cast<uint64_t>(p.blockLen + p.dstStride);
        const uint64_t s = i * (row + p.srcStride * 32ull);
        emu::TouchLocal(emu::P_MTE3, seq, Hardware::UB, src.ByteOffset() + s, p.blockLen, false, op);
        emu::TouchGm(emu::P_MTE3, seq, d, p.blockLen, true, op);
        std::memcpy(d, src.Raw() + s, p.blockLen);
    }
    emu::Core().stats.ub_to_gm += static_cast<uint64_t>(p.blockCount) * p.blockLen;
}

// ================================================================== GM -> L1 (ND -> NZ)
template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const Nd2NzParams& p)
{
    const char* op = "DataCopy(GM->L1, Nd2Nz)";
    emu::CheckPosition(dst, {TPosition::A1, TPosition::B1}, op, "dst");
    emu::CheckAligned(dst, 32, op, "dst");
    if (p.ndNum == 0 || p.nValue == 0 || p.dValue == 0) return;
    if (p.srcDValue == 0 || p.dstNzC0Stride == 0 || p.dstNzNStride == 0) {
        emu::Fail("%s: srcDValue, dstNzC0Stride and dstNzNStride must be >= 1", op);
    }
    if (p.nValue > 16384 || p.ndNum > 4095 || p.dstNzC0Stride > 16384 || p.dstNzNStride > 16384) {
        emu::Fail("%s: parameter outside its documented range", op);
    }
    constexpr uint32_t c0 = 32 / sizeof(T);
    const uint32_t dPad = (p.dValue + c0 - 1) / c0 * c0;
    uint64_t maxElem = 0;
    for (uint32_t n = 0; n < p.ndNum; ++n) {
        const uint64_t last = n * static_cast<uint64_t>(p.dstNzMatrixStride) +
                              (dPad / c0 - 1) * static_cast<uint64_t>(p.dstNzC0Stride) * c0 +
                              (p.nValue - 1ull) * p.dstNzNStride * c0 + c0;
        maxElem = std::max(maxElem, last);
    }
    emu::CheckExtent(dst, maxElem * sizeof(T), op, "dst");
    const uint32_t seq = emu::Issue(emu::P_MTE2);
    emu::Dispatch(emu::P_MTE2, emu::GmReadCycles(static_cast<double>(p.ndNum) * p.nValue * dPad * sizeof(T)),
                  emu::Timing().gm_read_latency_cycles);
    T* out = dst.Data();
    for (uint32_t n = 0; n < p.ndNum; ++n) {
        for (uint32_t r = 0; r < p.nValue; ++r) {
            const T* s = src.address_ + n * static_cast<uint64_t>(p.srcNdMatrixStride) + r * static_cast<uint64_t>(p.srcDValue);
            emu::TouchGm(emu::P_MTE2, seq, s, p.dValue * sizeof(T), false, op);
            for (uint32_t cb = 0; cb < dPad / c0; ++cb) {
                const uint64_t d = n * static_cast<uint64_t>(p.dstNzMatrixStride) + cb * static_cast<uint64_t>(p.dstNzC0Stride) * c0 +
                                   r * static_cast<uint64_t>(p.dstNzNStride) * c0;
                emu::TouchLocal(emu::P_MTE2, seq, Hardware::L1, dst.ByteOffset() + d * sizeof(T), 32, true, op);
                for (uint32_t k = 0; k < c0; ++k) {
                    const uint32_t col = cb * c0 + k;
                    out[d + k] = col < p.dValue ? s[col] : T(0);  // columns padded to 32 bytes with zeros
                }
            }
        }
    }
    emu::Core().stats.gm_to_l1 += static_cast<uint64_t>(p.ndNum) * p.nValue * p.dValue * sizeof(T);
}

// Fill: initialise L1 (32-byte blocks, PIPE_MTE2) or L0A/L0B (512-byte blocks, PIPE_MTE1).
template <typename T, typename U = T>
void Fill(const LocalTensor<T>& dst, const InitConstValueParams<U>& p)
{
    const char* op = "Fill";
    emu::CheckPosition(dst, {TPosition::A1, TPosition::B1, TPosition::A2, TPosition::B2}, op, "dst");
    const bool l1 = dst.HardwareKind() == Hardware::L1;
    const uint32_t unit = l1 ? 32 : 512;
    emu::CheckAligned(dst, unit, op, "dst");
    if (p.repeatTimes == 0 || p.blockNum == 0) return;
    if (p.repeatTimes > 32767 || p.blockNum > 32767 || p.dstGap > 32767) emu::Fail("%s: parameter outside [0, 32767]", op);
    const uint64_t span = ((p.repeatTimes - 1ull) * (p.blockNum + p.dstGap) + p.blockNum) * unit;
    emu::CheckExtent(dst, span, op, "dst");
    const int pipe = l1 ? emu::P_MTE2 : emu::P_MTE1;
    const uint32_t seq = emu::Issue(pipe);
    emu::Dispatch(pipe, emu::Timing().mte1_head_cycles +
                            static_cast<double>(p.repeatTimes) * p.blockNum * unit / emu::Timing().mte1_l0a_bytes_per_cycle);
    for (uint32_t r = 0; r < p.repeatTimes; ++r) {
        const uint64_t start = r * static_cast<uint64_t>(p.blockNum + p.dstGap) * unit;
        emu::TouchLocal(pipe, seq, dst.HardwareKind(), dst.ByteOffset() + start, p.blockNum * unit, true, op);
        T* out = reinterpret_cast<T*>(dst.Raw() + start);
        for (uint64_t k = 0; k < p.blockNum * unit / sizeof(T); ++k) out[k] = static_cast<T>(p.initValue);
    }
    emu::Core().stats.l1_fill += static_cast<uint64_t>(p.repeatTimes) * p.blockNum * unit;
}

// ================================================================== L1 -> L0A/L0B
template <typename T>
void LoadData(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LoadData2DParams& p)
{
    const char* op = "LoadData(L1->L0, 2D)";
    emu::CheckPosition(dst, {TPosition::A2, TPosition::B2}, op, "dst");
    emu::CheckPosition(src, {TPosition::A1, TPosition::B1}, op, "src");
    emu::CheckAligned(dst, 512, op, "dst");
    emu::CheckAligned(src, 32, op, "src");
    if (p.ifTranspose && !emu::IsB16<T>()) emu::Fail("%s: ifTranspose needs a 16-bit data type", op);
    if (p.addrMode != 0) emu::Fail("%s: addrMode must be 0 for the L1->L0 path", op);
    if (p.repeatTimes == 0) return;
    constexpr uint32_t frac = emu::kFractalBytes;
    const uint64_t srcSpan = (p.startIndex + (p.repeatTimes - 1ull) * p.srcStride + 1) * frac;
    const uint64_t dstSpan = ((p.repeatTimes - 1ull) * (p.dstGap + 1) + 1) * frac;
    emu::CheckExtent(src, srcSpan, op, "src");
    emu::CheckExtent(dst, dstSpan, op, "dst");
    const uint32_t seq = emu::Issue(emu::P_MTE1);
    {
        const emu::TimingParams& tp = emu::Timing();
        const double rate = dst.HardwareKind() == Hardware::L0A ? tp.mte1_l0a_bytes_per_cycle : tp.mte1_l0b_bytes_per_cycle;
        emu::Dispatch(emu::P_MTE1, tp.mte1_head_cycles + static_cast<double>(p.repeatTimes) * frac / rate);
    }
    for (uint32_t i = 0; i < p.repeatTimes; ++i) {
        const uint64_t s = (p.startIndex + static_cast<uint64_t>(i) * p.srcStride) * frac;
        const uint64_t d = static_cast<uint64_t>(i) * (p.dstGap + 1) * frac;
        emu::TouchLocal(emu::P_MTE1, seq, Hardware::L1, src.ByteOffset() + s, frac, false, op);
        emu::TouchLocal(emu::P_MTE1, seq, dst.HardwareKind(), dst.ByteOffset() + d, frac, true, op);
        if (!p.ifTranspose) {
            std::memcpy(dst.Raw() + d, src.Raw() + s, frac);
        } else {  // 16x16 b16 fractal transposed
            const uint16_t* in = reinterpret_cast<const uint16_t*>(src.Raw() + s);
            uint16_t* out = reinterpret_cast<uint16_t*>(dst.Raw() + d);
            for (int r = 0; r < 16; ++r) {
                for (int c = 0; c < 16; ++c) out[r * 16 + c] = in[c * 16 + r];
            }
        }
    }
    auto& st = emu::Core().stats;
    (dst.HardwareKind() == Hardware::L0A ? st.l1_to_l0a : st.l1_to_l0b) += static_cast<uint64_t>(p.repeatTimes) * frac;
}

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
    if (p.unitFlag != 0) emu::Fail("%s: unitFlag is not emulated", op);
    if (p.m == 0 || p.n == 0 || p.k == 0) return;
    const uint32_t m16 = (p.m + 15) / 16, n16 = (p.n + 15) / 16, k16 = (p.k + 15) / 16;
    emu::CheckExtent(fm, static_cast<uint64_t>(m16) * k16 * 256 * sizeof(U), op, "fm");
    emu::CheckExtent(filter, static_cast<uint64_t>(k16) * n16 * 256 * sizeof(U), op, "filter");
    emu::CheckExtent(dst, static_cast<uint64_t>(m16) * n16 * 256 * sizeof(float), op, "dst");
    const uint32_t seq = emu::Issue(emu::P_M);
    emu::Dispatch(emu::P_M, emu::Timing().mmad_head_cycles +
                                static_cast<double>(m16) * n16 * k16 * 4096.0 / emu::Timing().cube_macs_per_cycle);
    emu::TouchLocal(emu::P_M, seq, Hardware::L0A, fm.ByteOffset(), static_cast<uint64_t>(m16) * k16 * 256 * sizeof(U), false, op);
    emu::TouchLocal(emu::P_M, seq, Hardware::L0B, filter.ByteOffset(), static_cast<uint64_t>(k16) * n16 * 256 * sizeof(U), false, op);
    emu::TouchLocal(emu::P_M, seq, Hardware::L0C, dst.ByteOffset(), static_cast<uint64_t>(m16) * n16 * 256 * sizeof(float), true, op);
    // Operands converted once: A row-major (m x k), B column-major (n x k). Every product of two
    // fp16/bf16 values is exact in fp32, so acc + a * b rounds once, like the documented
    // accumulation one k at a time.
    const U* a = fm.Data();
    const U* b = filter.Data();
    float* c = dst.Data();
    std::vector<float> am(static_cast<size_t>(p.m) * p.k), bn(static_cast<size_t>(p.n) * p.k);
    for (uint32_t i = 0; i < p.m; ++i) {
        for (uint32_t kk = 0; kk < p.k; ++kk) am[i * p.k + kk] = static_cast<float>(a[((i / 16) * k16 + kk / 16) * 256 + (i % 16) * 16 + kk % 16]);
    }
    for (uint32_t j = 0; j < p.n; ++j) {
        for (uint32_t kk = 0; kk < p.k; ++kk) bn[j * p.k + kk] = static_cast<float>(b[((kk / 16) * n16 + j / 16) * 256 + (j % 16) * 16 + kk % 16]);
    }
    for (uint32_t i = 0; i < p.m; ++i) {
        const float* arow = &am[i * p.k];
        for (uint32_t j = 0; j < p.n; ++j) {
            const float* bcol = &bn[j * p.k];
            float& acc = c[((j / 16) * m16 + i / 16) * 256 + (i % 16) * 16 + j % 16];
            float sum = p.cmatrixInitVal ? 0.0f : acc;
            for (uint32_t kk = 0; kk < p.k; ++kk) sum += arow[kk] * bcol[kk];
            acc = sum;
        }
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
    if (p.reluEn || p.isChannelSplit || p.unitFlag) emu::Fail("%s: relu / channel split / unitFlag are not emulated", op);
    constexpr bool toF32 = std::is_same<T, float>::value;
    constexpr bool toF16 = std::is_same<T, half>::value;
    constexpr bool toBf16 = std::is_same<T, bfloat16_t>::value;
    if (toF32 && p.quantPre != QuantMode_t::NoQuant) emu::Fail("%s: float output needs quantPre NoQuant", op);
    if (toF16 && p.quantPre != QuantMode_t::F322F16) emu::Fail("%s: half output needs quantPre F322F16 (it is not inferred)", op);
    if (toBf16 && p.quantPre != QuantMode_t::F322BF16) emu::Fail("%s: bfloat16_t output needs quantPre F322BF16", op);
    static_assert(toF32 || toF16 || toBf16, "Fixpipe: output type must be float, half or bfloat16_t");
    const uint64_t srcSpan = ((p.nSize / 16 - 1ull) * p.srcStride * 16 + p.mSize * 16ull) * sizeof(float);
    emu::CheckExtent(src, srcSpan, op, "src");
    const uint32_t seq = emu::Issue(emu::P_FIX);
    emu::Dispatch(emu::P_FIX, emu::Timing().fix_head_cycles +
                                  static_cast<double>(p.mSize) * p.nSize * sizeof(T) / emu::Timing().fix_bytes_per_cycle,
                  emu::Timing().gm_write_latency_cycles);
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
    if (p.reluEn || p.isChannelSplit || p.unitFlag) emu::Fail("%s: relu / channel split / unitFlag are not emulated", op);
    constexpr bool toF16 = std::is_same<T, half>::value;
    if (toF16 && p.quantPre != QuantMode_t::F322F16) emu::Fail("%s: half output needs quantPre F322F16 (it is not inferred)", op);
    if (!toF16 && p.quantPre != QuantMode_t::F322BF16) emu::Fail("%s: bfloat16_t output needs quantPre F322BF16", op);
    const uint32_t blocks = p.nSize / 16;
    const uint64_t srcSpan = ((blocks - 1ull) * p.srcStride * 16 + p.mSize * 16ull) * sizeof(float);
    const uint64_t dstSpan = ((blocks - 1ull) * p.dstStride + p.mSize) * 32ull;
    emu::CheckExtent(src, srcSpan, op, "src");
    emu::CheckExtent(dst, dstSpan, op, "dst");
    const uint32_t seq = emu::Issue(emu::P_FIX);
    emu::Dispatch(emu::P_FIX, emu::Timing().fix_head_cycles +
                                  static_cast<double>(p.mSize) * p.nSize * sizeof(T) / emu::Timing().fix_bytes_per_cycle);
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

// ================================================================== vector instructions
namespace emu {
template <typename T>
void CheckVector(const LocalTensor<T>& t, int32_t count, const char* op, const char* name)
{
    if (!UbPosition(t.GetPosition())) Fail("%s: %s must be in UB (VECIN/VECOUT/VECCALC), got %s", op, name, PositionName(t.GetPosition()));
    CheckAligned(t, 32, op, name);
    if (count < 0) Fail("%s: count %d is negative", op, count);
    if (static_cast<uint32_t>(count) > t.GetSize()) Fail("%s: count %d exceeds the %u elements of %s", op, count, t.GetSize(), name);
}

// Operands may coincide exactly or be disjoint; a partial overlap is undefined on hardware.
template <typename A, typename B>
void CheckOverlap(const LocalTensor<A>& dst, const LocalTensor<B>& src, uint64_t dstBytes, uint64_t srcBytes, const char* op,
                  bool allowExact = true)
{
    const uint64_t d0 = dst.ByteOffset(), d1 = d0 + dstBytes, s0 = src.ByteOffset(), s1 = s0 + srcBytes;
    if (d1 <= s0 || s1 <= d0) return;
    if (allowExact && d0 == s0 && dstBytes == srcBytes) return;
    Fail("%s: dst UB[%llu, %llu) partially overlaps a source UB[%llu, %llu); operands must coincide exactly or be disjoint",
         op, (unsigned long long)d0, (unsigned long long)d1, (unsigned long long)s0, (unsigned long long)s1);
}

template <typename T>
constexpr void CheckVecType()
{
    static_assert(std::is_same<T, half>::value || std::is_same<T, float>::value,
                  "the emulated vector arithmetic takes half or float");
}

template <typename T>
inline T RoundTo(float v) { return static_cast<T>(v); }

inline void CountVector(uint64_t elems)
{
    auto& st = Core().stats;
    st.vector_instructions++;
    st.vector_elements += elems;
}

template <typename T, typename F>
void Binary(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, int32_t count, const char* op, F f,
            VecKind kind = VecKind::Simple)
{
    CheckVecType<T>();
    CheckVector(dst, count, op, "dst");
    CheckVector(a, count, op, "src0");
    CheckVector(b, count, op, "src1");
    if (count == 0) return;
    const uint64_t bytes = count * sizeof(T);
    CheckOverlap(dst, a, bytes, bytes, op);
    CheckOverlap(dst, b, bytes, bytes, op);
    const uint32_t seq = Issue(P_V);
    Dispatch(P_V, VecCycles(kind, sizeof(T), Repeats(bytes)));
    TouchLocal(P_V, seq, Hardware::UB, a.ByteOffset(), bytes, false, op);
    TouchLocal(P_V, seq, Hardware::UB, b.ByteOffset(), bytes, false, op);
    TouchLocal(P_V, seq, Hardware::UB, dst.ByteOffset(), bytes, true, op);
    const T* x = a.Data();
    const T* y = b.Data();
    T* z = dst.Data();
    for (int32_t i = 0; i < count; ++i) z[i] = RoundTo<T>(f(static_cast<float>(x[i]), static_cast<float>(y[i])));
    CountVector(count);
}

template <typename T, typename F>
void Unary(const LocalTensor<T>& dst, const LocalTensor<T>& a, int32_t count, const char* op, F f,
           VecKind kind = VecKind::Simple)
{
    CheckVecType<T>();
    CheckVector(dst, count, op, "dst");
    CheckVector(a, count, op, "src");
    if (count == 0) return;
    const uint64_t bytes = count * sizeof(T);
    CheckOverlap(dst, a, bytes, bytes, op);
    const uint32_t seq = Issue(P_V);
    Dispatch(P_V, VecCycles(kind, sizeof(T), Repeats(bytes)));
    TouchLocal(P_V, seq, Hardware::UB, a.ByteOffset(), bytes, false, op);
    TouchLocal(P_V, seq, Hardware::UB, dst.ByteOffset(), bytes, true, op);
    const T* x = a.Data();
    T* z = dst.Data();
    for (int32_t i = 0; i < count; ++i) z[i] = RoundTo<T>(f(static_cast<float>(x[i])));
    CountVector(count);
}

inline float MaxProp(float x, float y) { return (std::isnan(x) || std::isnan(y)) ? NAN : (x > y ? x : y); }

// ReduceMax/ReduceSum over `count` elements (count mode) on Atlas A2: whole-repeat reductions
// over the data and then over their results, and the total read back through the scalar unit
// (a vector -> scalar synchronisation) and stored to dst (impl/basic_api/dav_c220, ReduceSumImpl).
inline void CountModeReduceTiming(std::size_t elemBytes, int32_t count)
{
    const double repeats = Repeats(static_cast<uint64_t>(count) * elemBytes);
    Dispatch(P_V, VecCycles(VecKind::ReduceRepeat, elemBytes, repeats));
    if (repeats > 1) Dispatch(P_V, VecCycles(VecKind::ReduceRepeat, elemBytes, 1));
    ScalarUbAccess(1u << P_V);
    Core().stats.scalar_ub_accesses++;
}
}  // namespace emu

template <typename T>
void Add(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    emu::Binary(dst, src0, src1, count, "Add", [](float x, float y) { return x + y; });
}
template <typename T>
void Sub(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    emu::Binary(dst, src0, src1, count, "Sub", [](float x, float y) { return x - y; });
}
template <typename T>
void Mul(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    emu::Binary(dst, src0, src1, count, "Mul", [](float x, float y) { return x * y; });
}
template <typename T>
void Div(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    emu::Binary(dst, src0, src1, count, "Div", [](float x, float y) { return x / y; }, emu::VecKind::Transcendental);
}
template <typename T>
void Max(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    emu::Binary(dst, src0, src1, count, "Max", emu::MaxProp);
}

template <typename T, bool isSetMask = true>
void Adds(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count)
{
    const float s = static_cast<float>(scalarValue);
    emu::Unary(dst, src, count, "Adds", [s](float x) { return x + s; });
}
template <typename T, bool isSetMask = true>
void Muls(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count)
{
    const float s = static_cast<float>(scalarValue);
    emu::Unary(dst, src, count, "Muls", [s](float x) { return x * s; });
}
template <typename T>
void Exp(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count)
{
    emu::Unary(dst, src, count, "Exp", [](float x) { return static_cast<float>(std::exp(static_cast<long double>(x))); },
               emu::VecKind::Transcendental);
}
template <typename T>
void Ln(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count)
{
    emu::Unary(dst, src, count, "Ln", [](float x) { return static_cast<float>(std::log(static_cast<long double>(x))); },
               emu::VecKind::Transcendental);
}
// Abs (vabs, impl/basic_api/dav_c220/kernel_operator_vec_unary_impl.h: half / float): clears the
// sign, exact in either type (NaN stays NaN); costed as the simple arithmetic.
template <typename T>
void Abs(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count)
{
    emu::Unary(dst, src, count, "Abs", [](float x) { return std::fabs(x); });
}

template <typename T>
void Duplicate(const LocalTensor<T>& dst, const T& scalarValue, const int32_t& count)
{
    const char* op = "Duplicate";
    emu::CheckVecType<T>();
    emu::CheckVector(dst, count, op, "dst");
    if (count == 0) return;
    const uint32_t seq = emu::Issue(emu::P_V);
    emu::Dispatch(emu::P_V, emu::VecCycles(emu::VecKind::Simple, sizeof(T), emu::Repeats(count * sizeof(T))));
    emu::TouchLocal(emu::P_V, seq, Hardware::UB, dst.ByteOffset(), count * sizeof(T), true, op);
    T* z = dst.Data();
    for (int32_t i = 0; i < count; ++i) z[i] = scalarValue;
    emu::CountVector(count);
}

// Cast between half/bfloat16_t and float, uint8_t -> half and half -> uint8_t. float -> 16-bit
// accepts CAST_RINT or CAST_NONE (= CAST_RINT when precision is lost); widening casts take CAST_NONE
// (uint8_t -> half: the only mode of vconv_u82f16 on Atlas A2, exact); half -> uint8_t takes
// CAST_NONE and is emulated for integer values in [0, 255] only (the kernels' flag bytes).
template <typename T, typename U>
void Cast(const LocalTensor<T>& dst, const LocalTensor<U>& src, const RoundMode& roundMode, const uint32_t count)
{
    const char* op = "Cast";
    constexpr bool bytes = std::is_same<T, half>::value && std::is_same<U, uint8_t>::value;
    constexpr bool toBytes = std::is_same<T, uint8_t>::value && std::is_same<U, half>::value;
    constexpr bool widen = bytes || (std::is_same<T, float>::value && (std::is_same<U, half>::value || std::is_same<U, bfloat16_t>::value));
    constexpr bool narrow = toBytes || (std::is_same<U, float>::value && (std::is_same<T, half>::value || std::is_same<T, bfloat16_t>::value));
    static_assert(widen || narrow, "the emulated Cast converts between float and half/bfloat16_t, and between uint8_t and half");
    emu::CheckVector(dst, static_cast<int32_t>(count), op, "dst");
    emu::CheckVector(src, static_cast<int32_t>(count), op, "src");
    if (widen && roundMode != RoundMode::CAST_NONE) emu::Fail("%s: a widening cast takes RoundMode::CAST_NONE", op);
    if (toBytes && roundMode != RoundMode::CAST_NONE) emu::Fail("%s: half -> uint8_t is emulated with CAST_NONE only", op);
    if (narrow && roundMode != RoundMode::CAST_RINT && roundMode != RoundMode::CAST_NONE) {
        emu::Fail("%s: only CAST_RINT / CAST_NONE (round to nearest even) are emulated for float -> 16 bit", op);
    }
    if (count == 0) return;
    emu::CheckOverlap(dst, src, count * sizeof(T), count * sizeof(U), op, false);
    const uint32_t seq = emu::Issue(emu::P_V);
    constexpr uint64_t wide = sizeof(T) > sizeof(U) ? sizeof(T) : sizeof(U);
    emu::Dispatch(emu::P_V, emu::VecCycles(emu::VecKind::Simple, 4, emu::Repeats(count * wide)));
    emu::TouchLocal(emu::P_V, seq, Hardware::UB, src.ByteOffset(), count * sizeof(U), false, op);
    emu::TouchLocal(emu::P_V, seq, Hardware::UB, dst.ByteOffset(), count * sizeof(T), true, op);
    const U* x = src.Data();
    T* z = dst.Data();
    for (uint32_t i = 0; i < count; ++i) {
        const float v = static_cast<float>(x[i]);
        if (toBytes && !(v >= 0.0f && v <= 255.0f && v == static_cast<float>(static_cast<int>(v)))) {
            emu::Fail("%s: half -> uint8_t of %g: only integers in [0, 255] are emulated", op, v);
        }
        z[i] = static_cast<T>(v);
    }
    emu::CountVector(count);
}

// ReduceMax (count mode): dst[0] = max of the first `count` elements (NaN propagates).
template <typename T>
void ReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& sharedTmpBuffer,
               const int32_t count, bool calIndex = 0)
{
    const char* op = "ReduceMax";
    emu::CheckVecType<T>();
    if (calIndex) emu::Fail("%s: calIndex is not emulated", op);
    emu::CheckVector(src, count, op, "src");
    emu::CheckVector(sharedTmpBuffer, 0, op, "sharedTmpBuffer");
    if (!emu::UbPosition(dst.GetPosition())) emu::Fail("%s: dst must be in UB", op);
    if (dst.ByteOffset() % (2 * sizeof(T)) != 0) emu::Fail("%s: dst must be %zu-byte aligned", op, 2 * sizeof(T));
    if (count == 0) return;
    constexpr int32_t perRepeat = 256 / sizeof(T), perBlock = 32 / sizeof(T);
    const int32_t firstRepeat = std::max(1, count / perRepeat);
    const int32_t need = (firstRepeat * 2 + perBlock - 1) / perBlock * perBlock;
    if (static_cast<int32_t>(sharedTmpBuffer.GetSize()) < need) {
        emu::Fail("%s: sharedTmpBuffer holds %u elements, %d needed for count %d", op, sharedTmpBuffer.GetSize(), need, count);
    }
    if (dst.GetSize() < 1) emu::Fail("%s: dst is empty", op);
    const uint32_t seq = emu::Issue(emu::P_V);
    emu::CountModeReduceTiming(sizeof(T), count);
    emu::TouchLocal(emu::P_V, seq, Hardware::UB, src.ByteOffset(), count * sizeof(T), false, op);
    emu::TouchLocal(emu::P_V, seq, Hardware::UB, sharedTmpBuffer.ByteOffset(), need * sizeof(T), true, op);
    emu::TouchLocal(emu::P_V, seq, Hardware::UB, dst.ByteOffset(), sizeof(T), true, op);
    const T* x = src.Data();
    float m = static_cast<float>(x[0]);
    for (int32_t i = 1; i < count; ++i) m = emu::MaxProp(m, static_cast<float>(x[i]));
    dst.Data()[0] = static_cast<T>(m);
    emu::CountVector(count);
}

// ReduceSum (count mode, Atlas A2 "方式一"): adjacent-pair binary tree inside each 256-byte
// repeat, the repeat results added in order. For half every addition rounds to half.
template <typename T, bool isSetMask = true>
void ReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& sharedTmpBuffer,
               const int32_t count)
{
    const char* op = "ReduceSum";
    emu::CheckVecType<T>();
    emu::CheckVector(src, count, op, "src");
    emu::CheckVector(sharedTmpBuffer, 0, op, "sharedTmpBuffer");
    if (!emu::UbPosition(dst.GetPosition())) emu::Fail("%s: dst must be in UB", op);
    if (dst.ByteOffset() % sizeof(T) != 0) emu::Fail("%s: dst must be %zu-byte aligned", op, sizeof(T));
    if (count == 0) return;
    if (dst.GetSize() < 1) emu::Fail("%s: dst is empty", op);
    const uint32_t seq = emu::Issue(emu::P_V);
    emu::CountModeReduceTiming(sizeof(T), count);
    emu::TouchLocal(emu::P_V, seq, Hardware::UB, src.ByteOffset(), count * sizeof(T), false, op);
    emu::TouchLocal(emu::P_V, seq, Hardware::UB, dst.ByteOffset(), sizeof(T), true, op);
    constexpr int32_t perRepeat = 256 / sizeof(T);
    const T* x = src.Data();
    float total = 0.0f;
    float lanes[perRepeat];
    for (int32_t r0 = 0; r0 < count; r0 += perRepeat) {
        for (int32_t i = 0; i < perRepeat; ++i) lanes[i] = r0 + i < count ? static_cast<float>(x[r0 + i]) : 0.0f;
        for (int32_t width = perRepeat / 2; width >= 1; width /= 2) {
            for (int32_t i = 0; i < width; ++i) lanes[i] = emu::RoundTo<T>(lanes[2 * i] + lanes[2 * i + 1]);
        }
        total = r0 == 0 ? lanes[0] : static_cast<float>(emu::RoundTo<T>(total + lanes[0]));
    }
    dst.Data()[0] = static_cast<T>(total);
    emu::CountVector(count);
}

// ================================================================== synchronisation
template <HardEvent event>
void SetFlag(int32_t eventID)
{
    emu::SetFlagImpl(event, eventID);
}
template <HardEvent event>
void WaitFlag(int32_t eventID)
{
    emu::WaitFlagImpl(event, eventID);
}
template <pipe_t pipe>
void PipeBarrier()
{
    static_assert(pipe != PIPE_S, "PipeBarrier does not support PIPE_S");
    if (pipe == PIPE_ALL) {
        emu::BarrierAll();
    } else {
        emu::BarrierPipe(emu::PipeIndex(pipe));
    }
    // A barrier on one pipe orders that pipe with itself, which the emulation already assumes.
}
template <uint8_t modeId, pipe_t pipe>
void CrossCoreSetFlag(uint16_t flagId)
{
    static_assert(pipe != PIPE_S && pipe != PIPE_ALL, "CrossCoreSetFlag: PIPE_S and PIPE_ALL are not allowed (modes 0-2)");
    emu::CrossSet(modeId, emu::PipeIndex(pipe), flagId);
}
template <uint8_t modeId = 0, pipe_t pipe = PIPE_S>
void CrossCoreWaitFlag(uint16_t flagId)
{
    emu::CrossWait(flagId);
}

}  // namespace AscendC
