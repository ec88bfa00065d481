// The instructions of the AscendC CPU emulation (this header: the operand checks and data
// movement; emu_ops_cube.h: Mmad and Fixpipe; emu_ops_vector.h: the vector instructions and
// the flags). Each function has the signature of its asc-devkit declaration
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

#include "emu_tpipe.h"

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
    const double rate = dst.HardwareKind() == Hardware::L0B ? emu::Timing().mte1_l0b_bytes_per_cycle
                                                            : emu::Timing().mte1_l0a_bytes_per_cycle;
    emu::Dispatch(pipe, emu::Timing().mte1_head_cycles + static_cast<double>(p.repeatTimes) * p.blockNum * unit / rate);
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

// The scalar unit's data cache (impl/basic_api/kernel_reg.h): the emulation's scalar GM
// accesses read and write memory directly, so cleaning and invalidating it only drops the
// lines from the timing model's cache (the line of the tensor's address, or all of them).
enum class CacheLine : uint64_t { SINGLE_CACHE_LINE = 0, ENTIRE_DATA_CACHE };
enum class DcciDst : uint64_t { CACHELINE_ALL = 0, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };

template <typename T, CacheLine entireType, DcciDst dcciDst>
void DataCacheCleanAndInvalid(const GlobalTensor<T>& gm)
{
    if constexpr (entireType == CacheLine::ENTIRE_DATA_CACHE) {
        emu::Core().dcache.Clear();
    } else {
        emu::Core().dcache.Drop(gm.GetPhyAddr());
    }
}

// A hint that brings kDataCachePreloadBytes of GM from `cacheOffset` bytes past the tensor's
// start into the data cache (dav_c220: dc_preload, which Huawei's ListTensorDesc issues to
// "Preload 256Bytes from the cache miss offset"); the scalar unit does not wait for it.
template <typename T>
void DataCachePreload(const GlobalTensor<uint64_t>& src, const T cacheOffset)
{
    static_assert(std::is_same<T, int16_t>::value || std::is_same<T, int64_t>::value,
                  "DataCachePreload: the offset is int16_t or int64_t");
    emu::ScalarGmPreload(reinterpret_cast<const uint8_t*>(src.GetPhyAddr()) + cacheOffset, emu::kDataCachePreloadBytes);
}

}  // namespace AscendC
