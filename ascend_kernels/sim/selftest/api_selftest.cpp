// One AscendC API call per case, in one AIV core, on operands read from files. Built two ways
// from this one source: against the asc-devkit headers and the simulator (tools/sim_build.py:
// the call runs Huawei's implementation down to the simulated instructions), and with
// -DPASA_SELFTEST_EMU against ascend_kernels/emu (the project's emulation of the same API).
// tests/ascend_kernels/test_ascendc_sim.py runs both on the same cases and compares the outputs bit for bit.
//
// Input: one case per line on stdin,
//   OP TYPE N SCALAR A B C INIT OUT [I0 .. I7]
// TYPE an element type (half float bfloat16 uint8 uint16 int16 int32) or, for Cast, FROM>TO;
// A, B, C the operand files (whole 32-byte blocks, loaded to UB; A also lies in GM for the
// copies); INIT the initial contents of the destination (UB, or GM for the copies to GM); OUT
// receives the destination after the call (OUT starts as INIT in GM). I0..I7 integer parameters of the call (see Call
// and RunCube).
// Exit status 0 when every case ran.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernel_operator.h"

#ifdef PASA_SELFTEST_EMU
#include <functional>
#else
#include "sim_globals.h"
#endif

using namespace AscendC;

namespace {

struct Case {
    std::string op, type;
    uint32_t n = 0;
    float scalar = 0;
    std::vector<uint8_t> a, b, c, init, out;
    int64_t i[8] = {};
};

std::vector<uint8_t> ReadFile(const std::string& path)
{
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read " + path);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

uint32_t Blocks32(size_t bytes) { return static_cast<uint32_t>((bytes + 31) / 32 * 32); }

template <typename T>
GlobalTensor<T> Gm(std::vector<uint8_t>& v)
{
    GlobalTensor<T> g;
    g.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(v.data()), static_cast<uint32_t>(v.size() / sizeof(T)));
    return g;
}

// The call of case `k` on UB operands x, y, w (element type S) and destination z (type T).
template <typename T, typename S>
void Call(Case& k, const LocalTensor<T>& z, const LocalTensor<S>& x, const LocalTensor<S>& y, const LocalTensor<S>& w,
          const LocalTensor<T>& tmp, GlobalTensor<S>& ga, GlobalTensor<T>& gout)
{
    const std::string& op = k.op;
    const int32_t n = static_cast<int32_t>(k.n);
    const int64_t* i = k.i;
    if constexpr (!std::is_same<T, S>::value) {
        constexpr bool supported = (std::is_same<S, float>::value && !std::is_same<T, uint8_t>::value &&
                                    !std::is_same<T, int32_t>::value) ||
                                   (std::is_same<S, half>::value && (std::is_same<T, float>::value ||
                                                                     std::is_same<T, uint8_t>::value)) ||
                                   (std::is_same<S, uint8_t>::value && std::is_same<T, half>::value);
        if constexpr (supported) {
            if (op == "Cast") return Cast(z, x, static_cast<RoundMode>(i[0]), k.n);
        }
        throw std::invalid_argument("no case '" + op + "' from this type to that");
    } else {
        const T s = static_cast<T>(k.scalar);
        constexpr uint32_t perBlock = 32 / sizeof(T), lanes = 256 / sizeof(T);
        if constexpr (std::is_same<T, half>::value || std::is_same<T, float>::value) {
            if (op == "Add" || op == "AddNoWait") return Add(z, x, y, n);
            if (op == "Sub") return Sub(z, x, y, n);
            if (op == "Mul") return Mul(z, x, y, n);
            if (op == "Div") return Div(z, x, y, n);
            if (op == "Max") return Max(z, x, y, n);
            if (op == "Adds") return Adds(z, x, s, n);
            if (op == "Muls") return Muls(z, x, s, n);
            if (op == "Exp") return Exp(z, x, n);
            if (op == "Ln") return Ln(z, x, n);
            if (op == "Abs") return Abs(z, x, n);
            if (op == "Duplicate") return Duplicate(z, s, n);
            if (op == "ReduceSum") return ReduceSum(z, x, tmp, n);
            if (op == "ReduceMax") return ReduceMax(z, x, tmp, n);
            // level 0: I0 mask (element count), I1 repeat, I2..I7 dst/src0/src1 block strides, repeat strides
            if (op == "AddL0" || op == "MaxL0" || op == "SubL0" || op == "MulL0" || op == "DivL0" || op == "PairAdd" ||
                op == "PairMax") {
                const bool pair = op.rfind("Pair", 0) == 0;
                const BinaryRepeatParams p = pair ? BinaryRepeatParams(1, 2, 2, 8, 16, 16)
                                                  : BinaryRepeatParams(i[2], i[3], i[4], i[5], i[6], i[7]);
                const uint64_t mask = pair ? lanes : static_cast<uint64_t>(i[0]);
                const uint8_t repeat = static_cast<uint8_t>(pair ? n / (2 * lanes) : i[1]);
                const LocalTensor<T> second = pair ? x[perBlock] : y;
                if (op == "AddL0" || op == "PairAdd") return Add(z, x, second, mask, repeat, p);
                if (op == "SubL0") return Sub(z, x, second, mask, repeat, p);
                if (op == "MulL0") return Mul(z, x, second, mask, repeat, p);
                if (op == "DivL0") return Div(z, x, second, mask, repeat, p);
                return Max(z, x, second, mask, repeat, p);
            }
            // I0 mask, I1 repeat, I2 dstRepStride, I3 srcBlkStride, I4 srcRepStride
            if (op == "ReduceDataBlockSum") return ReduceDataBlock<ReduceType::SUM>(z, x, i[0], i[1], i[2], i[3], i[4]);
            if (op == "ReduceDataBlockMax") return ReduceDataBlock<ReduceType::MAX>(z, x, i[0], i[1], i[2], i[3], i[4]);
            // I0 repeat, I1 dstBlkStride, I2 dstRepStride
            if (op == "Brcb") return Brcb(z, x, static_cast<uint8_t>(i[0]), BrcbRepeatParams(i[1], i[2]));
            // I0 CMPMODE; the bits go to the destination's bytes
            if (op == "Compares") return Compares(z.template ReinterpretCast<uint8_t>(), x, s, static_cast<CMPMODE>(i[0]), k.n);
            // a level-0 call with a mask of I1 lanes just before (it leaves the mask set)
            if (op == "ComparesAfterL0") {
                Add(tmp, x, x, static_cast<uint64_t>(i[1]), 1, BinaryRepeatParams());
                return Compares(z.template ReinterpretCast<uint8_t>(), x, s, static_cast<CMPMODE>(i[0]), k.n);
            }
            // selection bits in B
            if (op == "SelectTS") {
                return Select(z, y.template ReinterpretCast<uint8_t>(), x, s, SELMODE::VSEL_TENSOR_SCALAR_MODE, k.n);
            }
            if (op == "SelectTT") {
                return Select(z, y.template ReinterpretCast<uint8_t>(), x, w, SELMODE::VSEL_TENSOR_TENSOR_MODE, k.n);
            }
        }
        if constexpr (std::is_same<T, uint16_t>::value) {
            if (op == "And") return And(z, x, y, n);
        }
        // data movement: DataCopyParams / DataCopyExtParams from I0..I3, padding from I4..I6
        if (op == "DataCopyCount") return DataCopy(z, ga, k.n);
        if (op == "DataCopyIn") return DataCopy(z, ga, DataCopyParams(i[0], i[1], i[2], i[3]));
        if (op == "DataCopyOut") return DataCopy(gout, x, DataCopyParams(i[0], i[1], i[2], i[3]));
        if (op == "DataCopyPadIn") {
            return DataCopyPad(z, ga, DataCopyExtParams(i[0], i[1], i[2], i[3], 0),
                               DataCopyPadExtParams<T>(i[4] != 0, i[5], i[6], s));
        }
        if (op == "DataCopyPadOut") return DataCopyPad(gout, x, DataCopyExtParams(i[0], i[1], i[2], i[3], 0));
        throw std::invalid_argument("no case '" + op + "' for this type");
    }
}

// Cube (AIC) cases. "MatmulBT": C = A B^T with A m x k and B n x k, both ND in GM (the score
// product's pattern); "MatmulB": C = A B with B k x n ND (the P V pattern: B's fractals
// transposed into L0B). Nd2Nz into L1, LoadData into L0A/L0B, Mmad, Fixpipe row-major to GM
// (F322F16 / F322BF16 for a 16-bit result). I0..I2: m, k, n; I3: "MatmulBT", 1 to Fill B's L1
// rows past n - 3 with zeros after the copy (InitConstValue); "MatmulBzz", B's valid rows (the
// rest zero), B laid out Zz in L1 and each fractal transposed into L0B (the P V pattern).
// "MatmulBTunit": as MatmulBT with L0C handed from the Mmad to the Fixpipe by unitFlag (3 on both),
// no M_FIX flag; "MatmulBTunitMixed": the Mmad with unitFlag 3, the Fixpipe without (rejected).
template <typename T, typename S>
void RunCube(Case& k)
{
    if constexpr (!std::is_same<S, half>::value && !std::is_same<S, bfloat16_t>::value) {
        throw std::invalid_argument("cube cases take half or bfloat16 operands");
    } else {
        const uint32_t m = k.i[0], kk = k.i[1], n = k.i[2];
        const uint32_t mp = (m + 15) / 16 * 16, kp = (kk + 15) / 16 * 16, np = (n + 15) / 16 * 16;
        const bool handOff = k.op == "MatmulBTunit", mixed = k.op == "MatmulBTunitMixed";  // unit flags on both, on the Mmad only
        const bool bt = k.op == "MatmulBT" || handOff || mixed;
        TPipe pipe;
        TBuf<TPosition::A1> a1;
        TBuf<TPosition::B1> b1;
        TBuf<TPosition::A2> a2;
        TBuf<TPosition::B2> b2;
        TBuf<TPosition::CO1> c1;
        pipe.InitBuffer(a1, mp * kp * sizeof(S));
        pipe.InitBuffer(b1, kp * np * sizeof(S));
        pipe.InitBuffer(a2, mp * kp * sizeof(S));
        pipe.InitBuffer(b2, kp * np * sizeof(S));
        pipe.InitBuffer(c1, mp * np * sizeof(float));
        GlobalTensor<S> ga = Gm<S>(k.a), gb = Gm<S>(k.b);
        GlobalTensor<T> gout = Gm<T>(k.out);
        LocalTensor<S> la1 = a1.Get<S>(), lb1 = b1.Get<S>(), la2 = a2.Get<S>(), lb2 = b2.Get<S>();
        LocalTensor<float> c = c1.Get<float>();
        DataCopy(la1, ga, Nd2NzParams(1, m, kk, 0, kk, mp, 1, 0));
        const bool zz = k.op == "MatmulBzz";
        if (bt) {
            DataCopy(lb1, gb, Nd2NzParams(1, n, kk, 0, kk, np, 1, 0));
            if (k.i[3]) Fill(lb1[(n - 3) * 16], InitConstValueParams<S>(kp / 16, 3, np - 3, S(0.0f)));
        } else if (zz) {  // B's first I3 rows, laid out Zz (16-row blocks, their column fractals together); the rest 0
            const uint32_t valid = k.i[3], full = valid / 16, tail = valid % 16, block = (np / 16) * 256;
            if (tail > 0) Fill(lb1[full * block + tail * 16], InitConstValueParams<S>(np / 16, 16 - tail, tail, S(0.0f)));
            const uint32_t zeroFrom = full + (tail > 0 ? 1 : 0);
            if (zeroFrom < kp / 16) Fill(lb1[zeroFrom * block], InitConstValueParams<S>(1, (kp / 16 - zeroFrom) * (np / 16) * 16, 0, S(0.0f)));
            if (full > 0) DataCopy(lb1, gb, Nd2NzParams(full, 16, n, 16 * n, n, 16, 1, block));
            if (tail > 0) DataCopy(lb1[full * block], gb[full * 16 * n], Nd2NzParams(1, tail, n, 0, n, 16, 1, 0));
        } else {
            DataCopy(lb1, gb, Nd2NzParams(1, kk, n, 0, n, kp, 1, 0));
        }
        SetFlag<HardEvent::MTE2_MTE1>(EVENT_ID0);
        WaitFlag<HardEvent::MTE2_MTE1>(EVENT_ID0);
        for (uint32_t mb = 0; mb < mp / 16; ++mb) {
            LoadData(la2[mb * (kp / 16) * 256], la1[mb * 256], LoadData2DParams(0, kp / 16, mp / 16, 0, 0, false, 0));
        }
        if (bt) {
            LoadData(lb2, lb1, LoadData2DParams(0, (kp / 16) * (np / 16), 1, 0, 0, false, 0));
        } else if (zz) {
            LoadData(lb2, lb1, LoadData2DParams(0, (kp / 16) * (np / 16), 1, 0, 0, true, 0));
        } else {
            for (uint32_t kb = 0; kb < kp / 16; ++kb) {
                LoadData(lb2[kb * (np / 16) * 256], lb1[kb * 256], LoadData2DParams(0, np / 16, kp / 16, 0, 0, true, 0));
            }
        }
        SetFlag<HardEvent::MTE1_M>(EVENT_ID0);
        WaitFlag<HardEvent::MTE1_M>(EVENT_ID0);
        Mmad(c, la2, lb2, MmadParams(m, n, kk, handOff || mixed ? 3 : 0, false, true));
        if (!handOff) {
            SetFlag<HardEvent::M_FIX>(EVENT_ID0);
            WaitFlag<HardEvent::M_FIX>(EVENT_ID0);
        }
        const QuantMode_t quant = std::is_same<T, half>::value ? QuantMode_t::F322F16
                                  : std::is_same<T, bfloat16_t>::value ? QuantMode_t::F322BF16 : QuantMode_t::NoQuant;
        Fixpipe<T, float, CFG_ROW_MAJOR>(gout, c, FixpipeParamsV220(n, m, mp, n, false, quant, 0, 1, 0, 0,
                                                                    handOff ? 3 : 0));
    }
}

bool Cube(const std::string& op) { return op.rfind("Matmul", 0) == 0; }

bool ToGm(const std::string& op) { return op == "DataCopyOut" || op == "DataCopyPadOut"; }

template <typename T, typename S>
void Run(Case& k)
{
    TPipe pipe;
    TBuf<TPosition::VECCALC> bufA, bufB, bufC, bufOut, bufTmp;
    pipe.InitBuffer(bufA, Blocks32(k.a.size()) + 512);
    pipe.InitBuffer(bufB, Blocks32(k.b.size()) + 512);
    pipe.InitBuffer(bufC, Blocks32(k.c.size()) + 512);
    pipe.InitBuffer(bufOut, Blocks32(k.init.size()) + 512);
    pipe.InitBuffer(bufTmp, 8192);
    GlobalTensor<S> ga = Gm<S>(k.a), gb = Gm<S>(k.b), gc = Gm<S>(k.c);
    GlobalTensor<T> ginit = Gm<T>(k.init), gout = Gm<T>(k.out);
    LocalTensor<S> x = bufA.Get<S>(), y = bufB.Get<S>(), w = bufC.Get<S>();
    LocalTensor<T> z = bufOut.Get<T>(), tmp = bufTmp.Get<T>();
    const auto load = [](const LocalTensor<S>& dst, GlobalTensor<S>& src, size_t bytes) {
        if (bytes) DataCopy(dst, src, DataCopyParams(1, static_cast<uint16_t>(bytes / 32), 0, 0));
    };
    load(x, ga, k.a.size());
    load(y, gb, k.b.size());
    load(w, gc, k.c.size());
    if (!ToGm(k.op) && !k.init.empty()) DataCopy(z, ginit, DataCopyParams(1, static_cast<uint16_t>(k.init.size() / 32), 0, 0));
    SetFlag<HardEvent::MTE2_V>(EVENT_ID0);
    if (k.op != "AddNoWait") WaitFlag<HardEvent::MTE2_V>(EVENT_ID0);  // without it: a pipe hazard
    if (ToGm(k.op)) {
        SetFlag<HardEvent::MTE2_MTE3>(EVENT_ID0);
        WaitFlag<HardEvent::MTE2_MTE3>(EVENT_ID0);
    }
    Call<T, S>(k, z, x, y, w, tmp, ga, gout);
    if (!ToGm(k.op)) {
        SetFlag<HardEvent::V_MTE3>(EVENT_ID0);
        WaitFlag<HardEvent::V_MTE3>(EVENT_ID0);
        SetFlag<HardEvent::MTE2_MTE3>(EVENT_ID1);
        WaitFlag<HardEvent::MTE2_MTE3>(EVENT_ID1);
        DataCopy(gout, z, DataCopyParams(1, static_cast<uint16_t>(k.init.size() / 32), 0, 0));
    }
}

template <typename S>
void RunFrom(Case& k, const std::string& to)
{
    if (to == "half") return Run<half, S>(k);
    if (to == "float") return Run<float, S>(k);
    if (to == "bfloat16") return Run<bfloat16_t, S>(k);
    if (to == "uint8") return Run<uint8_t, S>(k);
    if (to == "int32") return Run<int32_t, S>(k);
    throw std::invalid_argument("no conversion to " + to);
}

void Dispatch(Case& k)
{
    const size_t arrow = k.type.find('>');
    if (Cube(k.op)) {
        const std::string from = k.type.substr(0, arrow), to = k.type.substr(arrow + 1);
        if (from == "half" && to == "float") return RunCube<float, half>(k);
        if (from == "half" && to == "half") return RunCube<half, half>(k);
        if (from == "bfloat16" && to == "float") return RunCube<float, bfloat16_t>(k);
        if (from == "bfloat16" && to == "bfloat16") return RunCube<bfloat16_t, bfloat16_t>(k);
        throw std::invalid_argument("no cube case " + k.type);
    }
    if (arrow != std::string::npos) {
        const std::string from = k.type.substr(0, arrow), to = k.type.substr(arrow + 1);
        if (from == "float") return RunFrom<float>(k, to);
        if (from == "half") return RunFrom<half>(k, to);
        if (from == "uint8") return RunFrom<uint8_t>(k, to);
        throw std::invalid_argument("no conversion from " + from);
    }
    if (k.type == "half") return Run<half, half>(k);
    if (k.type == "float") return Run<float, float>(k);
    if (k.type == "uint8") return Run<uint8_t, uint8_t>(k);
    if (k.type == "uint16") return Run<uint16_t, uint16_t>(k);
    if (k.type == "int16") return Run<int16_t, int16_t>(k);
    if (k.type == "int32") return Run<int32_t, int32_t>(k);
    throw std::invalid_argument("no element type " + k.type);
}

#ifdef PASA_SELFTEST_EMU
void InCore(Case& k)
{
    emu::TimingParams timing;
    for (const char* name : {"cube_macs_per_cycle", "mmad_head_cycles", "mte1_l0a_bytes_per_cycle",
                             "mte1_l0b_bytes_per_cycle", "mte1_head_cycles", "mte2_bytes_per_cycle",
                             "mte2_head_cycles", "gm_read_latency_cycles", "mte3_bytes_per_cycle",
                             "mte3_head_cycles", "core_write_bytes_per_cycle", "gm_write_latency_cycles",
                             "fix_bytes_per_cycle", "fix_head_cycles", "vec_head_cycles", "scalar_issue_cycles",
                             "scalar_ub_access_cycles", "vs_sync_cycles", "scalar_gm_access_cycles", "queue_depth",
                             "cross_core_latency_cycles", "l2_aggregate_bytes_per_cycle",
                             "hbm_aggregate_bytes_per_cycle", "launch_overhead_cycles"}) {
        timing.Set(name, 1.0);
    }
    emu::GmRegistry reg;
    reg.Add("a", k.a.data(), k.a.size(), false, false);
    reg.Add("b", k.b.data(), k.b.size(), false, false);
    reg.Add("c", k.c.data(), k.c.size(), false, false);
    reg.Add("init", k.init.data(), k.init.size(), false, false);
    reg.Add("out", k.out.data(), k.out.size(), true, false);
    emu::LaunchOptions opt{1, Cube(k.op) ? KERNEL_TYPE_AIC_ONLY : KERNEL_TYPE_AIV_ONLY, 20.0, timing};
    emu::Launch(opt, reg, [&]() { Dispatch(k); });
}
#endif

}  // namespace

int main()
{
    std::string line;
    int failures = 0;
    while (std::getline(std::cin, line)) {
        if (line.empty()) continue;
        std::istringstream in(line);
        Case k;
        std::string a, b, c, init, out;
        in >> k.op >> k.type >> k.n >> k.scalar >> a >> b >> c >> init >> out;
        for (int64_t& v : k.i) {
            if (!(in >> v)) break;
        }
        try {
            k.a = ReadFile(a);
            k.b = ReadFile(b);
            k.c = ReadFile(c);
            k.init = ReadFile(init);
            k.out = k.init;  // the destination in GM starts as INIT
#ifdef PASA_SELFTEST_EMU
            InCore(k);
#else
            pasa_sim::ResetState();
            g_coreType = Cube(k.op) ? AscendC::AIC : AscendC::AIV;
            Dispatch(k);
#endif
            std::ofstream f(out, std::ios::binary);
            f.write(reinterpret_cast<const char*>(k.out.data()), static_cast<std::streamsize>(k.out.size()));
        } catch (const std::exception& e) {
            std::cerr << "case '" << line << "': " << e.what() << "\n";
            ++failures;
        }
    }
    return failures ? 1 : 0;
}
