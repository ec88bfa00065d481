// Vector instructions with repeats and strides ("tensor high-dimension split" calls) and the
// whole-tile helpers of the AscendC CPU emulation: level-0 Add/Sub/Mul/Max/Div/And, Brcb,
// ReduceDataBlock, Compares and Select (count mode). Signatures follow the asc-devkit
// declarations (kernel_operator_vec_binary_intf.h, kernel_operator_vec_brcb_intf.h,
// kernel_operator_vec_reduce_intf.h, kernel_operator_vec_cmpsel_intf.h); semantics follow the
// Atlas A2 documentation pages named at each function.
//
// A repeat reads 8 DataBlocks (32 bytes each) per operand: block k of repeat r sits at
// base + (r * repStride + k * blkStride) * 32 bytes; the continuous mask enables lanes
// [0, mask) of the 256 / sizeof(T) lanes. Within one repeat a destination block must coincide
// with the source block of the same lane or not overlap any source block; no repeat may read
// a block an earlier repeat of the same instruction wrote (the documented overlap rules).
#pragma once

#include <set>

#include "emu_ops_vector.h"

namespace AscendC {

struct BinaryRepeatParams {
    BinaryRepeatParams() {}
    BinaryRepeatParams(const uint8_t dstBlkStrideIn, const uint8_t src0BlkStrideIn, const uint8_t src1BlkStrideIn,
                       const uint8_t dstRepStrideIn, const uint8_t src0RepStrideIn, const uint8_t src1RepStrideIn)
        : dstBlkStride(dstBlkStrideIn), src0BlkStride(src0BlkStrideIn), src1BlkStride(src1BlkStrideIn),
          dstRepStride(dstRepStrideIn), src0RepStride(src0RepStrideIn), src1RepStride(src1RepStrideIn) {}
    uint32_t blockNumber = 8;
    uint8_t dstBlkStride = 1;
    uint8_t src0BlkStride = 1;
    uint8_t src1BlkStride = 1;
    uint8_t dstRepStride = 8;
    uint8_t src0RepStride = 8;
    uint8_t src1RepStride = 8;
    bool repeatStrideMode = false;
    bool strideSizeMode = false;
};

struct BrcbRepeatParams {
    BrcbRepeatParams() {}
    BrcbRepeatParams(const uint16_t dstBlkStrideIn, const uint16_t dstRepStrideIn)
        : dstRepStride(dstRepStrideIn), dstBlkStride(dstBlkStrideIn) {}
    uint32_t blockNumber = 8;
    uint16_t dstRepStride = 8;
    uint16_t dstBlkStride = 1;
    uint8_t src0BlkStride = 1;
    uint8_t src1BlkStride = 1;
    uint8_t src0RepStride = 8;
    uint8_t src1RepStride = 8;
    bool repeatStrideMode = false;
    bool strideSizeMode = false;
};

enum class CMPMODE : uint8_t { LT = 0, GT, EQ, LE, GE, NE };
enum class SELMODE : uint8_t { VSEL_CMPMASK_SPR = 0, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };
enum class ReduceType { NONE = -1, SUM = 0, MAX, MIN };

namespace emu {

// Byte offset (from the tensor's start) of block k of repeat r.
inline uint64_t BlockAt(uint32_t r, uint32_t k, uint32_t blkStride, uint32_t repStride)
{
    return (static_cast<uint64_t>(r) * repStride + static_cast<uint64_t>(k) * blkStride) * kBlockBytes;
}

// The overlap rules of one strided instruction, on absolute UB block indices.
class OverlapCheck {
public:
    explicit OverlapCheck(const char* op) : op_(op) {}
    // Blocks of one repeat: dst[k] and src[i][k]; returns after recording dst.
    void Repeat(const std::vector<uint64_t>& dst, const std::vector<std::vector<uint64_t>>& srcs)
    {
        for (const auto& src : srcs) {
            for (uint64_t s : src) {
                if (written_.count(s)) {
                    Fail("%s: a repeat reads UB byte %llu that an earlier repeat of the same instruction wrote "
                         "(not supported between iterations)", op_, static_cast<unsigned long long>(s * kBlockBytes));
                }
            }
            for (std::size_t k = 0; k < dst.size(); ++k) {
                for (std::size_t i = 0; i < src.size(); ++i) {
                    if (dst[k] == src[i] && i != k) {
                        Fail("%s: within a repeat, a destination block overlaps a source block of another lane "
                             "(operands must coincide exactly or be disjoint)", op_);
                    }
                }
            }
        }
        for (uint64_t d : dst) written_.insert(d);
    }

private:
    const char* op_;
    std::set<uint64_t> written_;
};

template <typename T>
void CheckStridedOperand(const LocalTensor<T>& t, uint32_t repeat, uint32_t blocks, uint32_t blkStride,
                         uint32_t repStride, const char* op, const char* name)
{
    if (!UbPosition(t.GetPosition())) Fail("%s: %s must be in UB, got %s", op, name, PositionName(t.GetPosition()));
    CheckAligned(t, 32, op, name);
    const uint64_t last = BlockAt(repeat - 1, blocks - 1, blkStride, repStride) + kBlockBytes;
    uint64_t span = 0;
    for (uint32_t r = 0; r < repeat; ++r) {
        for (uint32_t k = 0; k < blocks; ++k) span = std::max(span, BlockAt(r, k, blkStride, repStride) + kBlockBytes);
    }
    (void)last;
    CheckExtent(t, span, op, name);
}

// dst = f(src0, src1) lane by lane over `repeat` strided repeats (level-0 binary instructions).
template <typename T, typename F>
void BinaryStrided(const LocalTensor<T>& dst, const LocalTensor<T>& s0, const LocalTensor<T>& s1, uint64_t mask,
                   uint8_t repeat, const BinaryRepeatParams& p, const char* op, F f, VecKind kind = VecKind::Simple)
{
    constexpr uint32_t lanes = 256 / sizeof(T), perBlock = 32 / sizeof(T);
    if (mask == 0 || mask > lanes) Fail("%s: mask %llu outside [1, %u] (continuous mode)", op, (unsigned long long)mask, lanes);
    if (p.dstBlkStride == 0) Fail("%s: dstBlkStride 0 is undefined on hardware", op);
    Core().partialMask = mask < lanes ? mask : 0;  // the API sets the register and leaves it set
    if (repeat == 0) return;
    const uint32_t blocks = static_cast<uint32_t>((mask + perBlock - 1) / perBlock);
    CheckStridedOperand(dst, repeat, blocks, p.dstBlkStride, p.dstRepStride, op, "dst");
    CheckStridedOperand(s0, repeat, blocks, p.src0BlkStride, p.src0RepStride, op, "src0");
    CheckStridedOperand(s1, repeat, blocks, p.src1BlkStride, p.src1RepStride, op, "src1");
    const uint32_t seq = Issue(P_V);
    Dispatch(P_V, VecCycles(kind, sizeof(T), repeat));
    OverlapCheck overlap(op);
    std::vector<T> tmp(lanes);
    for (uint32_t r = 0; r < repeat; ++r) {
        std::vector<uint64_t> dBlocks, aBlocks, bBlocks;
        for (uint32_t k = 0; k < blocks; ++k) {
            const uint64_t da = BlockAt(r, k, p.dstBlkStride, p.dstRepStride);
            const uint64_t aa = BlockAt(r, k, p.src0BlkStride, p.src0RepStride);
            const uint64_t ba = BlockAt(r, k, p.src1BlkStride, p.src1RepStride);
            dBlocks.push_back((dst.ByteOffset() + da) / kBlockBytes);
            aBlocks.push_back((s0.ByteOffset() + aa) / kBlockBytes);
            bBlocks.push_back((s1.ByteOffset() + ba) / kBlockBytes);
            TouchLocal(P_V, seq, Hardware::UB, s0.ByteOffset() + aa, kBlockBytes, false, op);
            TouchLocal(P_V, seq, Hardware::UB, s1.ByteOffset() + ba, kBlockBytes, false, op);
        }
        overlap.Repeat(dBlocks, {aBlocks, bBlocks});
        for (uint32_t l = 0; l < mask; ++l) {
            const uint32_t k = l / perBlock, e = l % perBlock;
            const T x = reinterpret_cast<const T*>(s0.Raw() + BlockAt(r, k, p.src0BlkStride, p.src0RepStride))[e];
            const T y = reinterpret_cast<const T*>(s1.Raw() + BlockAt(r, k, p.src1BlkStride, p.src1RepStride))[e];
            tmp[l] = f(x, y);
        }
        for (uint32_t k = 0; k < blocks; ++k) {
            TouchLocal(P_V, seq, Hardware::UB, dst.ByteOffset() + BlockAt(r, k, p.dstBlkStride, p.dstRepStride),
                       kBlockBytes, true, op);
        }
        for (uint32_t l = 0; l < mask; ++l) {
            const uint32_t k = l / perBlock, e = l % perBlock;
            reinterpret_cast<T*>(dst.Raw() + BlockAt(r, k, p.dstBlkStride, p.dstRepStride))[e] = tmp[l];
        }
    }
    CountVector(static_cast<uint64_t>(repeat) * mask);
}

template <typename T>
struct FloatOp {
    template <typename G>
    static auto Wrap(G g)
    {
        return [g](T x, T y) { return RoundTo<T>(g(static_cast<float>(x), static_cast<float>(y))); };
    }
};
}  // namespace emu

// ------------------------------------------------------------------ level-0 binary (kernel_operator_vec_binary_intf.h)
#define PASA_EMU_LEVEL0_BINARY(NAME, EXPR, KIND)                                                                      \
    template <typename T, bool isSetMask = true>                                                                      \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, uint64_t mask,       \
              const uint8_t repeatTime, const BinaryRepeatParams& repeatParams)                                       \
    {                                                                                                                 \
        emu::CheckVecType<T>();                                                                                       \
        emu::BinaryStrided(dst, src0, src1, mask, repeatTime, repeatParams, #NAME,                                    \
                           emu::FloatOp<T>::Wrap([](float x, float y) { return EXPR; }), KIND);                       \
    }
PASA_EMU_LEVEL0_BINARY(Add, x + y, emu::VecKind::Simple)
PASA_EMU_LEVEL0_BINARY(Sub, x - y, emu::VecKind::Simple)
PASA_EMU_LEVEL0_BINARY(Mul, x * y, emu::VecKind::Simple)
PASA_EMU_LEVEL0_BINARY(Div, x / y, emu::VecKind::Transcendental)
PASA_EMU_LEVEL0_BINARY(Max, emu::MaxProp(x, y), emu::VecKind::Simple)
#undef PASA_EMU_LEVEL0_BINARY

// And on 16-bit lanes (count mode): combines selection masks.
template <typename T>
void And(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    static_assert(std::is_same<T, uint16_t>::value || std::is_same<T, int16_t>::value, "And takes 16-bit integers");
    const char* op = "And";
    emu::CheckVector(dst, count, op, "dst");
    emu::CheckVector(src0, count, op, "src0");
    emu::CheckVector(src1, count, op, "src1");
    if (count == 0) return;
    const uint64_t bytes = count * sizeof(T);
    emu::CheckOverlap(dst, src0, bytes, bytes, op);
    emu::CheckOverlap(dst, src1, bytes, bytes, op);
    const uint32_t seq = emu::Issue(emu::P_V);
    emu::Dispatch(emu::P_V, emu::VecCycles(emu::VecKind::Simple, sizeof(T), emu::Repeats(bytes)));
    emu::TouchLocal(emu::P_V, seq, Hardware::UB, src0.ByteOffset(), bytes, false, op);
    emu::TouchLocal(emu::P_V, seq, Hardware::UB, src1.ByteOffset(), bytes, false, op);
    emu::TouchLocal(emu::P_V, seq, Hardware::UB, dst.ByteOffset(), bytes, true, op);
    for (int32_t i = 0; i < count; ++i) dst.Data()[i] = static_cast<T>(src0.Data()[i] & src1.Data()[i]);
    emu::CountVector(count);
}

// ------------------------------------------------------------------ Brcb (kernel_operator_vec_brcb_intf.h)
// Each repeat takes the next 8 elements of src and fills one 32-byte block of dst with each:
// block j of repeat r at dst + (r * dstRepStride + j * dstBlkStride) * 32 bytes ("Brcb" page).
template <typename T>
void Brcb(const LocalTensor<T>& dst, const LocalTensor<T>& src, const uint8_t repeatTime, const BrcbRepeatParams& repeatParams)
{
    const char* op = "Brcb";
    static_assert(sizeof(T) == 2 || sizeof(T) == 4, "Brcb takes 16- or 32-bit elements");
    if (repeatParams.dstBlkStride == 0) emu::Fail("%s: dstBlkStride 0 is undefined on hardware", op);
    emu::CheckVector(src, 8 * repeatTime, op, "src");
    if (repeatTime == 0) return;
    emu::CheckStridedOperand(dst, repeatTime, 8, repeatParams.dstBlkStride, repeatParams.dstRepStride, op, "dst");
    const uint64_t srcBytes = 8ull * repeatTime * sizeof(T);
    const uint64_t d0 = dst.ByteOffset(), d1 = d0 + emu::BlockAt(repeatTime - 1, 7, repeatParams.dstBlkStride, repeatParams.dstRepStride) + 32;
    if (!(d1 <= src.ByteOffset() || src.ByteOffset() + srcBytes <= d0)) emu::Fail("%s: dst overlaps src", op);
    const uint32_t seq = emu::Issue(emu::P_V);
    emu::Dispatch(emu::P_V, emu::VecCycles(emu::VecKind::Brcb, sizeof(T), repeatTime));
    emu::TouchLocal(emu::P_V, seq, Hardware::UB, src.ByteOffset(), srcBytes, false, op);
    constexpr uint32_t perBlock = 32 / sizeof(T);
    for (uint32_t r = 0; r < repeatTime; ++r) {
        for (uint32_t j = 0; j < 8; ++j) {
            const uint64_t at = emu::BlockAt(r, j, repeatParams.dstBlkStride, repeatParams.dstRepStride);
            emu::TouchLocal(emu::P_V, seq, Hardware::UB, dst.ByteOffset() + at, 32, true, op);
            T* out = reinterpret_cast<T*>(dst.Raw() + at);
            for (uint32_t e = 0; e < perBlock; ++e) out[e] = src.Data()[r * 8 + j];
        }
    }
    emu::CountVector(static_cast<uint64_t>(repeatTime) * 8 * perBlock);
}

// ------------------------------------------------------------------ ReduceDataBlock (kernel_operator_vec_reduce_intf.h)
// Each enabled 32-byte block of a repeat is reduced to one element by a binary tree of adjacent
// pairs (every addition rounded to T); the repeat's results are written consecutively at
// dst + r * dstRepStride * 8 elements ("ReduceDataBlock" page: dstRepStride in units of one
// repeat's result, 16 bytes for half, 32 for float). The mask must enable whole blocks here.
template <ReduceType reduceType, typename T, typename U, bool isSetMask = true>
void ReduceDataBlock(const LocalTensor<T>& dst, const LocalTensor<U>& src, const int32_t mask, const int32_t repeatTime,
                     const int32_t dstRepStride, const int32_t srcBlkStride, const int32_t srcRepStride)
{
    const char* op = "ReduceDataBlock";
    static_assert(std::is_same<T, U>::value, "ReduceDataBlock: dst and src types must match on Atlas A2");
    emu::CheckVecType<T>();
    static_assert(reduceType == ReduceType::SUM || reduceType == ReduceType::MAX, "the emulation reduces by SUM or MAX");
    constexpr int32_t perBlock = 32 / sizeof(T), lanes = 256 / sizeof(T);
    if (mask <= 0 || mask > lanes || mask % perBlock != 0) {
        emu::Fail("%s: mask %d must enable whole blocks (a multiple of %d up to %d) in the emulation", op, mask, perBlock, lanes);
    }
    if (repeatTime < 0 || repeatTime > 255) emu::Fail("%s: repeatTime %d outside [0, 255]", op, repeatTime);
    if (!emu::UbPosition(dst.GetPosition())) emu::Fail("%s: dst must be in UB", op);
    if (dst.ByteOffset() % (sizeof(T) == 2 ? 16 : 32) != 0) emu::Fail("%s: dst must be %d-byte aligned", op, sizeof(T) == 2 ? 16 : 32);
    emu::Core().partialMask = mask < lanes ? static_cast<uint64_t>(mask) : 0;
    if (repeatTime == 0) return;
    const uint32_t blocks = static_cast<uint32_t>(mask / perBlock);
    emu::CheckStridedOperand(src, repeatTime, blocks, srcBlkStride, srcRepStride, op, "src");
    const uint64_t dstSpan = (static_cast<uint64_t>(repeatTime - 1) * dstRepStride * 8 + blocks) * sizeof(T);
    emu::CheckExtent(dst, dstSpan, op, "dst");
    const uint32_t seq = emu::Issue(emu::P_V);
    emu::Dispatch(emu::P_V, emu::VecCycles(emu::VecKind::ReduceDataBlock, sizeof(T), repeatTime));
    for (int32_t r = 0; r < repeatTime; ++r) {
        for (uint32_t k = 0; k < blocks; ++k) {
            const uint64_t at = emu::BlockAt(r, k, srcBlkStride, srcRepStride);
            emu::TouchLocal(emu::P_V, seq, Hardware::UB, src.ByteOffset() + at, 32, false, op);
        }
    }
    std::vector<T> out(static_cast<size_t>(repeatTime) * blocks);
    for (int32_t r = 0; r < repeatTime; ++r) {
        for (uint32_t k = 0; k < blocks; ++k) {
            const T* x = reinterpret_cast<const T*>(src.Raw() + emu::BlockAt(r, k, srcBlkStride, srcRepStride));
            float lane[perBlock];
            for (int32_t e = 0; e < perBlock; ++e) lane[e] = static_cast<float>(x[e]);
            for (int32_t width = perBlock / 2; width >= 1; width /= 2) {
                for (int32_t e = 0; e < width; ++e) {
                    lane[e] = reduceType == ReduceType::SUM ? static_cast<float>(emu::RoundTo<T>(lane[2 * e] + lane[2 * e + 1]))
                                                            : emu::MaxProp(lane[2 * e], lane[2 * e + 1]);
                }
            }
            out[r * blocks + k] = static_cast<T>(lane[0]);
        }
    }
    for (int32_t r = 0; r < repeatTime; ++r) {
        const uint64_t at = static_cast<uint64_t>(r) * dstRepStride * 8 * sizeof(T);
        emu::TouchLocal(emu::P_V, seq, Hardware::UB, dst.ByteOffset() + at, blocks * sizeof(T), true, op);
        for (uint32_t k = 0; k < blocks; ++k) reinterpret_cast<T*>(dst.Raw() + at)[k] = out[r * blocks + k];
    }
    emu::CountVector(static_cast<uint64_t>(repeatTime) * mask);
}

// ResetMask (kernel_common.h): every lane of the vector mask enabled again.
inline void ResetMask() { emu::Core().partialMask = 0; }

// ------------------------------------------------------------------ Compares / Select (kernel_operator_vec_cmpsel_intf.h)
// Compares (count mode): bit i of dst (little-endian bytes) is src0[i] <cmpMode> src1Scalar;
// count elements must fill whole 256-byte repeats ("Compares" page: the tail is ignored).
template <typename T, typename U>
void Compares(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const T src1Scalar, CMPMODE cmpMode, uint32_t count)
{
    const char* op = "Compares";
    static_assert(std::is_same<U, uint8_t>::value, "Compares writes uint8_t bits on Atlas A2");
    emu::CheckVecType<T>();
    emu::CheckVector(src0, static_cast<int32_t>(count), op, "src0");
    emu::CheckVector(dst, static_cast<int32_t>((count + 7) / 8), op, "dst");
    if ((count * sizeof(T)) % 256 != 0) {
        emu::Fail("%s: count %u x %zu bytes is not a whole number of 256-byte repeats; the hardware ignores the tail",
                  op, count, sizeof(T));
    }
    if (emu::Core().partialMask != 0) {
        emu::Fail("%s: the vector mask holds the %llu lanes a level-0 call left; Compares (count mode) compares "
                  "only those lanes of each repeat (Huawei's implementation leaves the mask as it finds it): "
                  "ResetMask() first", op, static_cast<unsigned long long>(emu::Core().partialMask));
    }
    if (count == 0) return;
    emu::CheckOverlap(dst, src0, count / 8, count * sizeof(T), op, false);
    const uint32_t seq = emu::Issue(emu::P_V);
    emu::Dispatch(emu::P_V, emu::VecCycles(emu::VecKind::Simple, sizeof(T), emu::Repeats(count * sizeof(T))));
    emu::TouchLocal(emu::P_V, seq, Hardware::UB, src0.ByteOffset(), count * sizeof(T), false, op);
    emu::TouchLocal(emu::P_V, seq, Hardware::UB, dst.ByteOffset(), count / 8, true, op);
    const float s = static_cast<float>(src1Scalar);
    uint8_t* bits = reinterpret_cast<uint8_t*>(dst.Raw());
    for (uint32_t i = 0; i < count; i += 8) {
        uint8_t byte = 0;
        for (uint32_t b = 0; b < 8; ++b) {
            const float x = static_cast<float>(src0.Data()[i + b]);
            bool v = false;
            switch (cmpMode) {
                case CMPMODE::LT: v = x < s; break;
                case CMPMODE::GT: v = x > s; break;
                case CMPMODE::EQ: v = x == s; break;
                case CMPMODE::LE: v = x <= s; break;
                case CMPMODE::GE: v = x >= s; break;
                case CMPMODE::NE: v = x != s; break;
            }
            byte |= static_cast<uint8_t>(v) << b;
        }
        bits[i / 8] = byte;
    }
    emu::CountVector(count);
}

namespace emu {
// On Atlas A2 the APIs that need a scratch keep it in UB from TMP_UB_OFFSET = 184 KiB up
// (impl/basic_api/utils/kernel_utils_constants.h, dav_c220 Select).
constexpr uint32_t kTmpUbOffset = 184 * 1024;

// vsel through the compare-mask register: the A2 implementation first writes the scalar (or the
// mask's address) into the UB scratch with a one-repeat Duplicate and set_cmpmask, then
// selects: two instructions, and the scratch's first 32 elements overwritten.
template <typename T, typename U, typename G>
void SelectCount(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0, uint32_t count,
                 const char* op, const LocalTensor<T>* src1Tensor, G src1At)
{
    CheckVecType<T>();
    static_assert(std::is_same<U, uint8_t>::value || std::is_same<U, uint16_t>::value, "selMask: uint8_t or uint16_t");
    CheckVector(dst, static_cast<int32_t>(count), op, "dst");
    CheckVector(src0, static_cast<int32_t>(count), op, "src0");
    if (!UbPosition(selMask.GetPosition())) Fail("%s: selMask must be in UB", op);
    CheckAligned(selMask, 32, op, "selMask");
    CheckExtent(selMask, (count + 7) / 8, op, "selMask");
    if (count == 0) return;
    const uint64_t bytes = count * sizeof(T);
    CheckOverlap(dst, src0, bytes, bytes, op);
    if (tls_pipe != nullptr && tls_pipe->next[static_cast<int>(Hardware::UB)] > kTmpUbOffset) {
        Fail("%s: on Atlas A2 Select keeps a scratch in UB from byte %u (TMP_UB_OFFSET); the kernel's buffers reach "
             "byte %u and would be overwritten", op, kTmpUbOffset, tls_pipe->next[static_cast<int>(Hardware::UB)]);
    }
    const uint32_t seq = Issue(P_V);
    Dispatch(P_V, VecCycles(VecKind::Simple, sizeof(T), 1));
    Dispatch(P_V, VecCycles(VecKind::Simple, sizeof(T), Repeats(bytes)));
    TouchLocal(P_V, seq, Hardware::UB, kTmpUbOffset, 32 * sizeof(T), true, op);
    std::memset(Core().mem[static_cast<int>(Hardware::UB)].data() + kTmpUbOffset, 0xA5, 32 * sizeof(T));
    TouchLocal(P_V, seq, Hardware::UB, src0.ByteOffset(), bytes, false, op);
    TouchLocal(P_V, seq, Hardware::UB, selMask.ByteOffset(), (count + 7) / 8, false, op);
    if (src1Tensor != nullptr) {
        CheckVector(*src1Tensor, static_cast<int32_t>(count), op, "src1");
        CheckOverlap(dst, *src1Tensor, bytes, bytes, op);
        TouchLocal(P_V, seq, Hardware::UB, src1Tensor->ByteOffset(), bytes, false, op);
    }
    TouchLocal(P_V, seq, Hardware::UB, dst.ByteOffset(), bytes, true, op);
    const uint8_t* bits = reinterpret_cast<const uint8_t*>(selMask.Raw());
    for (uint32_t i = 0; i < count; ++i) {
        const bool take0 = (bits[i / 8] >> (i % 8)) & 1u;
        dst.Data()[i] = take0 ? src0.Data()[i] : src1At(i);
    }
    auto& st = Core().stats;
    st.vector_instructions += 2;
    st.vector_elements += count;
}
}  // namespace emu

// Select, count mode: bit 1 takes src0, bit 0 takes the scalar src1 ("Select" page, mode 1).
template <typename T, typename U>
void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0, T src1, SELMODE selMode,
            uint32_t count)
{
    if (selMode != SELMODE::VSEL_TENSOR_SCALAR_MODE) emu::Fail("Select with a scalar src1 needs VSEL_TENSOR_SCALAR_MODE");
    emu::SelectCount(dst, selMask, src0, count, "Select", static_cast<const LocalTensor<T>*>(nullptr),
                     [src1](uint32_t) { return src1; });
}

// Select, count mode: bit 1 takes src0, bit 0 takes src1 (mode 2, VSEL_TENSOR_TENSOR_MODE).
template <typename T, typename U>
void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
            SELMODE selMode, uint32_t count)
{
    if (selMode != SELMODE::VSEL_TENSOR_TENSOR_MODE) emu::Fail("Select of two tensors is emulated in VSEL_TENSOR_TENSOR_MODE");
    const T* s1 = src1.Data();
    emu::SelectCount(dst, selMask, src0, count, "Select", &src1, [s1](uint32_t i) { return s1[i]; });
}

}  // namespace AscendC
