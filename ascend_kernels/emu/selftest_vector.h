// One vector instruction of the AscendC CPU emulation on operands given from Python, run in
// an AIV core (GM -> UB, the instruction, UB -> GM): tests/test_ascendc_emu.py checks each
// instruction the kernels use against an independent model of its documented rounding and
// order through pasa_npu._ascendc_emu.run_vector_instruction.
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

template <typename T, typename U = T>
inline std::vector<float> RunVector(const std::string& op, const std::vector<float>& a, const std::vector<float>& b,
                                    float scalar, const emu::TimingParams& timing)
{
    if (!b.empty() && b.size() != a.size()) throw std::invalid_argument("the operands differ in length");
    const size_t n = a.size();
    std::vector<U> ga(Padded<U>(n)), gb(Padded<U>(n));
    std::vector<T> gout(Padded<T>(n));
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
            VectorKernel<T, U>(op, reinterpret_cast<GM_ADDR>(ga.data()), reinterpret_cast<GM_ADDR>(gb.data()),
                               reinterpret_cast<GM_ADDR>(gout.data()), static_cast<uint32_t>(n), scalar);
        });
    }
    const bool reduce = op == "ReduceSum" || op == "ReduceMax";
    std::vector<float> result;
    for (size_t i = 0; i < (reduce ? 1 : n); ++i) result.push_back(static_cast<float>(gout[i]));
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
