// The vector instructions and the flag instructions of the AscendC CPU emulation
// (emu_ops_move.h states the conventions and the numerics modelled).
#pragma once

#include "emu_ops_move.h"

namespace AscendC {

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
template <bool isAIVOnly = true>
void SyncAll()
{
    emu::SyncAllCores(isAIVOnly);
}

}  // namespace AscendC
