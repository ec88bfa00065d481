// One vector instruction of the AscendC CPU emulation on operands given from Python, run in
// an AIV core (GM -> UB, the instruction, UB -> GM): tests/ascend_kernels/test_ascendc_vector.py checks each
// instruction the kernels use against an independent model of its documented rounding and
// order through the development module _ascendc_emu_selftest (run_vector_instruction).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "kernel_operator.h"

namespace pasa_selftest {

using namespace AscendC;

// Elements of T in whole 32-byte blocks covering n.
template <typename T>
inline uint32_t Padded(size_t n)
{
    constexpr size_t perBlock = 32 / sizeof(T);
    return static_cast<uint32_t>((n + perBlock - 1) / perBlock * perBlock);
}

// dst = op(a[, b] | scalar) over n elements of T; a reduction writes one element.
template <typename T, typename U = T>
inline void VectorKernel(const std::string& op, GM_ADDR a, GM_ADDR b, GM_ADDR out, uint32_t n, float scalar)
{
    const uint32_t nIn = Padded<U>(n), nOut = Padded<T>(n);
    TPipe pipe;
    TBuf<TPosition::VECCALC> bufA, bufB, bufOut, bufTmp;
    pipe.InitBuffer(bufA, nIn * sizeof(U));
    pipe.InitBuffer(bufB, nIn * sizeof(U));
    pipe.InitBuffer(bufOut, nOut * sizeof(T));
    pipe.InitBuffer(bufTmp, nOut * sizeof(T) + 64);
    GlobalTensor<U> ga, gb;
    GlobalTensor<T> gout;
    ga.SetGlobalBuffer(reinterpret_cast<__gm__ U*>(a), nIn);
    gb.SetGlobalBuffer(reinterpret_cast<__gm__ U*>(b), nIn);
    gout.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(out), nOut);
    LocalTensor<U> x = bufA.Get<U>(), y = bufB.Get<U>();
    LocalTensor<T> z = bufOut.Get<T>(), tmp = bufTmp.Get<T>();
    DataCopy(x, ga, nIn);
    DataCopy(y, gb, nIn);
    SetFlag<HardEvent::MTE2_V>(EVENT_ID0);
    WaitFlag<HardEvent::MTE2_V>(EVENT_ID0);
    const int32_t count = static_cast<int32_t>(n);
    if constexpr (std::is_same<T, U>::value) {
        const T s = static_cast<T>(scalar);
        if (op == "Add") Add(z, x, y, count);
        else if (op == "Sub") Sub(z, x, y, count);
        else if (op == "Mul") Mul(z, x, y, count);
        else if (op == "Div") Div(z, x, y, count);
        else if (op == "Max") Max(z, x, y, count);
        else if (op == "Adds") Adds(z, x, s, count);
        else if (op == "Muls") Muls(z, x, s, count);
        else if (op == "Exp") Exp(z, x, count);
        else if (op == "Ln") Ln(z, x, count);
        else if (op == "Duplicate") Duplicate(z, s, count);
        else if (op == "ReduceSum") ReduceSum(z, x, tmp, count);
        else if (op == "ReduceMax") ReduceMax(z, x, tmp, count);
        else throw std::invalid_argument("no emulated vector instruction '" + op + "' on this type");
    } else {
        if (op != "Cast") throw std::invalid_argument("'" + op + "' does not convert types");
        Cast(z, x, std::is_same<T, float>::value ? RoundMode::CAST_NONE : RoundMode::CAST_RINT, n);
    }
    SetFlag<HardEvent::V_MTE3>(EVENT_ID0);
    WaitFlag<HardEvent::V_MTE3>(EVENT_ID0);
    DataCopy(gout, z, nOut);
}

// Elements of T the instruction `op` writes for n operand elements.
template <typename T>
inline size_t OutputCount(const std::string& op, size_t n)
{
    constexpr size_t perBlock = 32 / sizeof(T);
    if (op == "ReduceSum" || op == "ReduceMax") return 1;
    if (op == "ReduceDataBlockSum" || op == "ReduceDataBlockMax") return n / perBlock;
    if (op == "PairAdd" || op == "PairMax") return n / 2;
    if (op == "Brcb") return n * perBlock;
    return n;
}

// The repeat/stride (level-0) forms the kernels use, over n elements of T (n a multiple of two
// 256-byte repeats): "PairAdd"/"PairMax", block i of dst = op(block 2i, block 2i + 1) of a
// (BinaryRepeatParams(1, 2, 2, 8, 16, 16)); "ReduceDataBlockSum"/"...Max", one element per
// 32-byte block of a; "Brcb", each element of a filling one block; "SelectLE", Compares(a <=
// scalar) then Select of a (bit set) or b (tensor-tensor); "SelectGE", Compares(a >= scalar)
// then Select of b (bit set) or -2.5 (tensor-scalar).
template <typename T>
inline void StridedKernel(const std::string& op, GM_ADDR a, GM_ADDR b, GM_ADDR out, uint32_t n, float scalar)
{
    constexpr uint32_t perBlock = 32 / sizeof(T), lanes = 256 / sizeof(T);
    if (n % (2 * lanes) != 0) throw std::invalid_argument(op + " takes a multiple of two 256-byte repeats");
    const uint32_t nOut = Padded<T>(OutputCount<T>(op, n));
    TPipe pipe;
    TBuf<TPosition::VECCALC> bufA, bufB, bufOut, bufBits;
    pipe.InitBuffer(bufA, n * sizeof(T));
    pipe.InitBuffer(bufB, n * sizeof(T));
    pipe.InitBuffer(bufOut, nOut * sizeof(T));
    pipe.InitBuffer(bufBits, n / 8 < 32 ? 32 : n / 8);
    GlobalTensor<T> ga, gb, gout;
    ga.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(a), n);
    gb.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(b), n);
    gout.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(out), nOut);
    LocalTensor<T> x = bufA.Get<T>(), y = bufB.Get<T>(), z = bufOut.Get<T>();
    LocalTensor<uint8_t> bits = bufBits.Get<uint8_t>();
    DataCopy(x, ga, n);
    DataCopy(y, gb, n);
    SetFlag<HardEvent::MTE2_V>(EVENT_ID0);
    WaitFlag<HardEvent::MTE2_V>(EVENT_ID0);
    const BinaryRepeatParams pairs(1, 2, 2, 8, 16, 16);
    const uint8_t pairRepeats = static_cast<uint8_t>(n / (2 * lanes));
    if (op == "PairAdd") Add(z, x, x[perBlock], lanes, pairRepeats, pairs);
    else if (op == "PairMax") Max(z, x, x[perBlock], lanes, pairRepeats, pairs);
    else if (op == "ReduceDataBlockSum") ReduceDataBlock<ReduceType::SUM>(z, x, lanes, n / lanes, 1, 1, 8);
    else if (op == "ReduceDataBlockMax") ReduceDataBlock<ReduceType::MAX>(z, x, lanes, n / lanes, 1, 1, 8);
    else if (op == "Brcb") Brcb(z, x, static_cast<uint8_t>(n / 8), BrcbRepeatParams(1, 8));
    else if (op == "SelectLE") {
        Compares(bits, x, static_cast<T>(scalar), CMPMODE::LE, n);
        Select(z, bits, x, y, SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
    } else if (op == "SelectGE") {
        Compares(bits, x, static_cast<T>(scalar), CMPMODE::GE, n);
        Select(z, bits, y, static_cast<T>(-2.5f), SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
    } else if (op == "ComparesAfterPartialMask" || op == "ComparesAfterResetMask") {
        Add(z, x, y, lanes / 2, 1, BinaryRepeatParams(1, 1, 1, 8, 8, 8));  // leaves half the lanes
        if (op == "ComparesAfterResetMask") ResetMask();
        Compares(bits, x, static_cast<T>(scalar), CMPMODE::LE, n);
        Select(z, bits, x, y, SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
    } else {
        throw std::invalid_argument("no emulated strided vector instruction '" + op + "'");
    }
    SetFlag<HardEvent::V_MTE3>(EVENT_ID0);
    WaitFlag<HardEvent::V_MTE3>(EVENT_ID0);
    DataCopy(gout, z, nOut);
}

inline bool Strided(const std::string& op)
{
    return op.rfind("Pair", 0) == 0 || op.rfind("ReduceDataBlock", 0) == 0 || op == "Brcb" ||
           op.rfind("Select", 0) == 0 || op.rfind("ComparesAfter", 0) == 0;
}

template <typename T, typename U = T>
inline std::vector<float> RunVector(const std::string& op, const std::vector<float>& a, const std::vector<float>& b,
                                    float scalar, const emu::TimingParams& timing)
{
    if (!b.empty() && b.size() != a.size()) throw std::invalid_argument("the operands differ in length");
    const size_t n = a.size();
    std::vector<U> ga(Padded<U>(n)), gb(Padded<U>(n));
    const size_t nOut = OutputCount<T>(op, n);
    std::vector<T> gout(Padded<T>(nOut > n ? nOut : n));  // VectorKernel writes n back
    for (size_t i = 0; i < n; ++i) {
        ga[i] = static_cast<U>(a[i]);
        gb[i] = static_cast<U>(b.empty() ? 0.0f : b[i]);
    }
    GmRegistry reg;
    reg.Add("a", ga.data(), ga.size() * sizeof(U), false, false);
    reg.Add("b", gb.data(), gb.size() * sizeof(U), false, false);
    reg.Add("out", gout.data(), gout.size() * sizeof(T), true, true);
    emu::LaunchOptions opt{1, KERNEL_TYPE_AIV_ONLY, 5.0, timing};
    {
        pybind11::gil_scoped_release release;
        emu::Launch(opt, reg, [&]() {
            const auto kernel = [&](auto run) {
                run(op, reinterpret_cast<GM_ADDR>(ga.data()), reinterpret_cast<GM_ADDR>(gb.data()),
                    reinterpret_cast<GM_ADDR>(gout.data()), static_cast<uint32_t>(n), scalar);
            };
            if constexpr (std::is_same<T, U>::value) {
                if (Strided(op)) return kernel(StridedKernel<T>);
            }
            kernel(VectorKernel<T, U>);
        });
    }
    std::vector<float> result;
    for (size_t i = 0; i < nOut; ++i) result.push_back(static_cast<float>(gout[i]));
    return result;
}

// `dtype`: "half" or "float" for the arithmetic; for "Cast", the conversion "float->half",
// "float->bfloat16" or "half->float".
inline std::vector<float> RunVectorInstruction(const std::string& op, const std::string& dtype,
                                               const std::vector<float>& a, const std::vector<float>& b,
                                               float scalar, const emu::TimingParams& timing)
{
    if (op == "Cast") {
        if (dtype == "float->half") return RunVector<half, float>(op, a, b, scalar, timing);
        if (dtype == "float->bfloat16") return RunVector<bfloat16_t, float>(op, a, b, scalar, timing);
        if (dtype == "half->float") return RunVector<float, half>(op, a, b, scalar, timing);
        throw std::invalid_argument("Cast converts float->half, float->bfloat16 or half->float, not '" + dtype + "'");
    }
    if (dtype == "half") return RunVector<half>(op, a, b, scalar, timing);
    if (dtype == "float") return RunVector<float>(op, a, b, scalar, timing);
    throw std::invalid_argument("vector instructions take dtype 'half' or 'float', not '" + dtype + "'");
}

}  // namespace pasa_selftest
