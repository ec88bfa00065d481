// Self-test kernels of the AscendC CPU emulation: small AscendC programs that either must
// run (and produce known values) or must be rejected the way the hardware would fail
// (over-capacity buffers, misaligned copies, broken queue order, missing or unpaired
// synchronisation, a cross-core wait that can never be satisfied).
// tests/ascend_kernels/test_ascendc_emu_internals.py runs each by name through the development
// module _ascendc_emu_selftest (run_selftest).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kernel_operator.h"

namespace pasa_selftest {

using namespace AscendC;
using emu::GmRegistry;
using emu::LaunchOptions;

struct Gm {
    std::vector<half> in, out;
    std::vector<float> outF;
    GmRegistry reg;
    Gm(size_t nIn, size_t nOut)
        : in(nIn), out(nOut), outF(nOut)
    {
        for (size_t i = 0; i < nIn; ++i) in[i] = half(static_cast<float>(i % 61) - 30.0f);
        reg.Add("in", in.data(), in.size() * sizeof(half), false, false);
        reg.Add("out", out.data(), out.size() * sizeof(half), true, true);
        reg.Add("outF", outF.data(), outF.size() * sizeof(float), true, true);
    }
    GM_ADDR In() { return reinterpret_cast<GM_ADDR>(in.data()); }
    GM_ADDR Out() { return reinterpret_cast<GM_ADDR>(out.data()); }
    GM_ADDR OutF() { return reinterpret_cast<GM_ADDR>(outF.data()); }
    // `in` as 32-bit words from its first 64-byte boundary on: word 16k starts a data-cache line
    GlobalTensor<uint32_t> LineAlignedWords()
    {
        GlobalTensor<uint32_t> w;
        w.SetGlobalBuffer(reinterpret_cast<__gm__ uint32_t*>((reinterpret_cast<uintptr_t>(In()) + 63) & ~uintptr_t(63)));
        return w;
    }
    std::vector<float> Half() const
    {
        std::vector<float> r;
        for (half h : out) r.push_back(static_cast<float>(h));
        return r;
    }
};

// ---- vector: out = 2 * in through a VECIN and a VECOUT queue (must pass).
inline void VectorScale(GM_ADDR in, GM_ADDR out)
{
    TPipe pipe;
    TQue<TPosition::VECIN, 1> qin;
    TQue<TPosition::VECOUT, 1> qout;
    pipe.InitBuffer(qin, 2, 128 * sizeof(half));
    pipe.InitBuffer(qout, 2, 128 * sizeof(half));
    GlobalTensor<half> gin, gout;
    gin.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(in), 256);
    gout.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(out), 256);
    for (int tile = 0; tile < 2; ++tile) {
        LocalTensor<half> x = qin.AllocTensor<half>();
        DataCopy(x, gin[tile * 128], 128);
        qin.EnQue(x);
        x = qin.DeQue<half>();
        LocalTensor<half> y = qout.AllocTensor<half>();
        Muls(y, x, half(2.0f), 128);
        qin.FreeTensor(x);
        qout.EnQue(y);
        y = qout.DeQue<half>();
        DataCopy(gout[tile * 128], y, 128);
        qout.FreeTensor(y);
    }
}

// ---- cube: C (20 x 48, fp32) = A (20 x 32) B (32 x 48), A and B read from `in` (A first, then
// B, both row-major), through GM -> L1 (NZ) -> L0A (Zz) / L0B (Zn) -> Mmad -> Fixpipe (ND).
// unitFlags: L0C is a TBuf handed over by unitFlag, and it computes 2 A B (an Mmad with 2, then one
// with 3 accumulating onto it) into outF, then A B (one Mmad with 3, into the same L0C once the first
// Fixpipe has read it) into outF + 20 x 48.
inline void CubeMatmul(GM_ADDR in, GM_ADDR outF, bool unitFlags = false)
{
    constexpr uint32_t M = 20, K = 32, N = 48, MP = 32;
    TPipe pipe;
    TQue<TPosition::A1, 1> a1;
    TQue<TPosition::B1, 1> b1;
    TQue<TPosition::A2, 1> a2;
    TQue<TPosition::B2, 1> b2;
    TQue<TPosition::CO1, 1> c1;
    pipe.InitBuffer(a1, 1, MP * K * 2);
    pipe.InitBuffer(b1, 1, K * N * 2);
    pipe.InitBuffer(a2, 1, MP * K * 2);
    pipe.InitBuffer(b2, 1, K * N * 2);
    pipe.InitBuffer(c1, 1, MP * N * 4);
    GlobalTensor<half> a, b;
    a.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(in), M * K);
    b.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(in) + M * K, K * N);
    GlobalTensor<float> c;
    c.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(outF), M * N);

    LocalTensor<half> la = a1.AllocTensor<half>();
    DataCopy(la, a, Nd2NzParams(1, M, K, 0, K, MP, 1, 0));
    a1.EnQue(la);
    LocalTensor<half> lb = b1.AllocTensor<half>();
    DataCopy(lb, b, Nd2NzParams(1, K, N, 0, N, K, 1, 0));
    b1.EnQue(lb);
    la = a1.DeQue<half>();
    lb = b1.DeQue<half>();
    LocalTensor<half> za = a2.AllocTensor<half>();
    for (uint32_t mb = 0; mb < MP / 16; ++mb) {
        LoadData(za[mb * (K / 16) * 256], la[mb * 256], LoadData2DParams(0, K / 16, MP / 16, 0, 0, false, 0));
    }
    LocalTensor<half> zb = b2.AllocTensor<half>();
    for (uint32_t kb = 0; kb < K / 16; ++kb) {
        LoadData(zb[kb * (N / 16) * 256], lb[kb * 256], LoadData2DParams(0, N / 16, K / 16, 0, 0, true, 0));
    }
    a2.EnQue(za);
    b2.EnQue(zb);
    a1.FreeTensor(la);
    b1.FreeTensor(lb);
    za = a2.DeQue<half>();
    zb = b2.DeQue<half>();
    if (unitFlags) {
        TBuf<TPosition::CO1> l0c;
        pipe.InitBuffer(l0c, MP * N * 4);
        LocalTensor<float> lc = l0c.Get<float>();
        const FixpipeParamsV220 fix(N, M, MP, N, false, QuantMode_t::NoQuant, 0, 1, 0, 0, 3);
        Mmad(lc, za, zb, MmadParams(M, N, K, 2, false, true));
        Mmad(lc, za, zb, MmadParams(M, N, K, 3, false, false));
        Fixpipe<float, float, CFG_ROW_MAJOR>(c, lc, fix);
        Mmad(lc, za, zb, MmadParams(M, N, K, 3, false, true));
        GlobalTensor<float> c2;
        c2.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(outF) + M * N, M * N);
        Fixpipe<float, float, CFG_ROW_MAJOR>(c2, lc, fix);
        a2.FreeTensor(za);
        b2.FreeTensor(zb);
        return;
    }
    LocalTensor<float> lc = c1.AllocTensor<float>();
    Mmad(lc, za, zb, MmadParams(M, N, K, 0, false, true));
    a2.FreeTensor(za);
    b2.FreeTensor(zb);
    c1.EnQue(lc);
    lc = c1.DeQue<float>();
    Fixpipe<float, float, CFG_ROW_MAJOR>(c, lc, FixpipeParamsV220(N, M, MP, N, false, QuantMode_t::NoQuant, 0, 1, 0, 0, 0));
    c1.FreeTensor(lc);
}

// ---- AIV0 writes GM, then tells the AIC through a cross-core flag raised on `pipe`; the AIC
// then reads that GM. With PIPE_MTE3 (the pipe of the write) this is ordered; with PIPE_V the
// flag may fire before the write lands.
template <pipe_t pipe>
inline void CrossCoreHandoff(GM_ADDR out)
{
    GlobalTensor<half> g;
    g.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(out), 256);
    if ASCEND_IS_AIV {
        TPipe tp;
        TQue<TPosition::VECOUT, 1> q;
        tp.InitBuffer(q, 1, 256 * sizeof(half));
        LocalTensor<half> x = q.AllocTensor<half>();
        Duplicate(x, half(3.0f), 256);
        q.EnQue(x);
        x = q.DeQue<half>();
        if (GetSubBlockIdx() == 0) DataCopy(g, x, 256);
        q.FreeTensor(x);
        CrossCoreSetFlag<2, pipe>(0);
    }
    if ASCEND_IS_AIC {
        TPipe tp;
        TQue<TPosition::A1, 1> q;
        tp.InitBuffer(q, 1, 256 * sizeof(half));
        CrossCoreWaitFlag(0);
        LocalTensor<half> l1 = q.AllocTensor<half>();
        DataCopy(l1, g, Nd2NzParams(1, 16, 16, 0, 16, 16, 1, 0));
        q.EnQue(l1);
        l1 = q.DeQue<half>();
        q.FreeTensor(l1);
    }
}

struct Case {
    KernelMetaType type;
    size_t nIn, nOut;
    std::function<void(Gm&)> kernel;
    bool halfOut;  // report out (half) instead of outF (float)
    int blockDim = 1;
};

// ---- SyncAll between AI Cores: AIV0 of each of `blocks` AI Cores writes its index + 1 to its
// 16 halves of out, then, past SyncAll<false>, copies the next AI Core's 16 to out[16 (blocks + b)].
// Without the SyncAll, reading another AI Core's write is a race. `skip`: the AI Core that
// skips the SyncAll (-1: none).
inline void SyncAllExchange(GM_ADDR out, int blocks, int skip)
{
    const int b = static_cast<int>(GetBlockIdx()) / 2;
    if (b == skip) return;
    GlobalTensor<half> g;
    g.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(out), 32 * blocks);
    TPipe tp;
    TBuf<TPosition::VECCALC> buf;
    if ASCEND_IS_AIV {
        tp.InitBuffer(buf, 16 * sizeof(half));
        if (GetSubBlockIdx() == 0) {
            LocalTensor<half> x = buf.Get<half>();
            Duplicate(x, half(static_cast<float>(b + 1)), 16);
            SetFlag<HardEvent::V_MTE3>(EVENT_ID0);
            WaitFlag<HardEvent::V_MTE3>(EVENT_ID0);
            DataCopy(g[16 * b], x, 16);
        }
    }
    SyncAll<false>();
    if ASCEND_IS_AIV {
        if (GetSubBlockIdx() == 0) {
            LocalTensor<half> x = buf.Get<half>();
            DataCopy(x, g[16 * ((b + 1) % blocks)], 16);
            SetFlag<HardEvent::MTE2_MTE3>(EVENT_ID0);
            WaitFlag<HardEvent::MTE2_MTE3>(EVENT_ID0);
            DataCopy(g[16 * (blocks + b)], x, 16);
        }
    }
}

// Programs that must run.
inline void AddRunCases(std::map<std::string, Case>& c)
{
    c["vector_scale"] = {KERNEL_TYPE_AIV_ONLY, 256, 256, [](Gm& g) { VectorScale(g.In(), g.Out()); }, true};
    c["cube_matmul"] = {KERNEL_TYPE_AIC_ONLY, 20 * 32 + 32 * 48, 20 * 48, [](Gm& g) { CubeMatmul(g.In(), g.OutF()); }, false};
    c["cross_core_handoff"] = {KERNEL_TYPE_MIX_AIC_1_2, 16, 256,
                               [](Gm& g) { CrossCoreHandoff<PIPE_MTE3>(g.Out()); }, true};
    c["sync_all_exchange"] = {KERNEL_TYPE_MIX_AIC_1_2, 16, 32 * 4,
                              [](Gm& g) { SyncAllExchange(g.Out(), 4, -1); }, true, 4};
    c["synced_tbuf"] = {KERNEL_TYPE_AIV_ONLY, 128, 128, [](Gm& g) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 128 * sizeof(half));
        GlobalTensor<half> in, out;
        in.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(g.In()), 128);
        out.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(g.Out()), 128);
        LocalTensor<half> t = buf.Get<half>();
        DataCopy(t, in, 128);
        SetFlag<HardEvent::MTE2_V>(EVENT_ID0);
        WaitFlag<HardEvent::MTE2_V>(EVENT_ID0);
        Muls(t, t, half(-1.0f), 128);
        SetFlag<HardEvent::V_MTE3>(EVENT_ID0);
        WaitFlag<HardEvent::V_MTE3>(EVENT_ID0);
        DataCopy(out, t, 128);
    }, true};
}

// Small programs whose timelines tests/ascend_kernels/test_npu_timing.py derives by hand.
inline void AddTimingCases(std::map<std::string, Case>& c)
{
    c["timing_unit_flag"] = {KERNEL_TYPE_AIC_ONLY, 20 * 32 + 32 * 48, 2 * 20 * 48,
                             [](Gm& g) { CubeMatmul(g.In(), g.OutF(), true); }, false};
    c["timing_copy_scale"] = {KERNEL_TYPE_AIV_ONLY, 256, 256, [](Gm& g) {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> qin;
        TQue<TPosition::VECOUT, 1> qout;
        pipe.InitBuffer(qin, 1, 256 * sizeof(half));
        pipe.InitBuffer(qout, 1, 256 * sizeof(half));
        GlobalTensor<half> gin, gout;
        gin.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(g.In()), 256);
        gout.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(g.Out()), 256);
        LocalTensor<half> x = qin.AllocTensor<half>();
        DataCopy(x, gin, 256);
        qin.EnQue(x);
        x = qin.DeQue<half>();
        LocalTensor<half> y = qout.AllocTensor<half>();
        Muls(y, x, half(2.0f), 256);
        qin.FreeTensor(x);
        qout.EnQue(y);
        y = qout.DeQue<half>();
        DataCopy(gout, y, 256);
        qout.FreeTensor(y);
    }, true};
    c["timing_scalar_read"] = {KERNEL_TYPE_AIV_ONLY, 16, 16, [](Gm& g) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024 * sizeof(half));
        LocalTensor<half> t = buf.Get<half>();
        Duplicate(t, half(1.0f), 1024);
        const half first = t.GetValue(0);  // the scalar unit waits for the vector pipe
        (void)first;
    }, true};
    // Scalar GM reads through the data cache, from a 64-byte aligned word: words 0 and 16 lie
    // in two lines; a whole-cache clean-and-invalidate drops both, a single-line one only its own.
    c["timing_scalar_gm_cache"] = {KERNEL_TYPE_AIV_ONLY, 1024, 16, [](Gm& g) {
        GlobalTensor<uint32_t> w = g.LineAlignedWords();
        uint32_t sum = w.GetValue(0) + w.GetValue(1) + w.GetValue(15) + w.GetValue(16) + w.GetValue(0);
        DataCacheCleanAndInvalid<uint32_t, CacheLine::ENTIRE_DATA_CACHE, DcciDst::CACHELINE_OUT>(w);
        sum += w.GetValue(0) + w.GetValue(16);
        DataCacheCleanAndInvalid<uint32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(w[16]);
        sum += w.GetValue(16) + w.GetValue(0);
        (void)sum;
    }, true};
    // A preload of 256 bytes (lines 0-3) at cycle 0: word 0 waits for its fill, word 48 (line 3)
    // hits, word 64 (line 4) misses; a second preload of line 0, held, brings nothing.
    c["timing_scalar_gm_preload"] = {KERNEL_TYPE_AIV_ONLY, 1024, 16, [](Gm& g) {
        GlobalTensor<uint32_t> w = g.LineAlignedWords();
        GlobalTensor<uint64_t> w64;
        w64.SetGlobalBuffer(reinterpret_cast<__gm__ uint64_t*>(const_cast<uint32_t*>(w.GetPhyAddr())));
        DataCachePreload(w64, int64_t(0));
        uint32_t sum = w.GetValue(0) + w.GetValue(48) + w.GetValue(64);
        DataCachePreload(w64, int64_t(0));
        sum += w.GetValue(16);
        (void)sum;
    }, true};
    // One more line than the data cache holds, then the first line (evicted) and the last (held).
    c["timing_scalar_gm_cache_eviction"] = {KERNEL_TYPE_AIV_ONLY, 20000, 16, [](Gm& g) {
        GlobalTensor<uint32_t> w = g.LineAlignedWords();
        constexpr uint32_t kLineWords = 64 / sizeof(uint32_t), kLines = 32 * 1024 / 64;
        uint32_t sum = 0;
        for (uint32_t line = 0; line <= kLines; ++line) sum += w.GetValue(line * kLineWords);
        sum += w.GetValue(0) + w.GetValue(kLines * kLineWords);
        (void)sum;
    }, true};
    c["timing_barrier"] = {KERNEL_TYPE_AIV_ONLY, 256, 256, [](Gm& g) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 256 * sizeof(half));
        GlobalTensor<half> gin;
        gin.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(g.In()), 256);
        LocalTensor<half> t = buf.Get<half>();
        DataCopy(t, gin, 256);
        PipeBarrier<PIPE_ALL>();
        Muls(t, t, half(2.0f), 256);
        Muls(t, t, half(2.0f), 256);
    }, true};
    c["timing_queue_depth"] = {KERNEL_TYPE_AIV_ONLY, 128, 16, [](Gm& g) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> a, b;
        pipe.InitBuffer(a, 256 * sizeof(half));
        pipe.InitBuffer(b, 128 * sizeof(half));
        GlobalTensor<half> gin;
        gin.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(g.In()), 128);
        LocalTensor<half> t = a.Get<half>();
        Duplicate(t, half(1.0f), 256);
        Muls(t, t, half(2.0f), 256);
        Muls(t, t, half(2.0f), 256);
        DataCopy(b.Get<half>(), gin, 128);  // starts when the scalar unit gets to it
    }, true};
}

// Memory and queue misuse the emulation must reject, as the hardware would fail it.
inline void AddRejectedMemoryCases(std::map<std::string, Case>& c)
{
    c["ub_over_capacity"] = {KERNEL_TYPE_AIV_ONLY, 16, 16, [](Gm&) {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> q;
        pipe.InitBuffer(q, 2, 100 * 1024);  // 200 KiB > 192 KiB of UB
    }, true};
    c["l0a_over_capacity"] = {KERNEL_TYPE_AIC_ONLY, 16, 16, [](Gm&) {
        TPipe pipe;
        TBuf<TPosition::A2> b;
        pipe.InitBuffer(b, 65 * 1024);  // > 64 KiB of L0A
    }, true};
    c["misaligned_ub_copy"] = {KERNEL_TYPE_AIV_ONLY, 64, 16, [](Gm& g) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        GlobalTensor<half> in;
        in.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(g.In()), 64);
        DataCopy(buf.Get<half>()[8], in, 16);  // UB destination at byte 16
    }, true};
    c["unaligned_copy_length"] = {KERNEL_TYPE_AIV_ONLY, 64, 16, [](Gm& g) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        GlobalTensor<half> in;
        in.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(g.In()), 64);
        DataCopy(buf.Get<half>(), in, 10);  // 20 bytes: not a whole 32-byte block
    }, true};
    c["dequeue_before_enqueue"] = {KERNEL_TYPE_AIV_ONLY, 16, 16, [](Gm&) {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> q;
        pipe.InitBuffer(q, 1, 256);
        LocalTensor<half> x = q.DeQue<half>();
        (void)x;
    }, true};
    c["alloc_without_free"] = {KERNEL_TYPE_AIV_ONLY, 16, 16, [](Gm&) {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> q;
        pipe.InitBuffer(q, 1, 256);
        LocalTensor<half> x = q.AllocTensor<half>();
        LocalTensor<half> y = q.AllocTensor<half>();
        (void)x;
        (void)y;
    }, true};
    c["missing_pipe_sync"] = {KERNEL_TYPE_AIV_ONLY, 128, 128, [](Gm& g) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 128 * sizeof(half));
        GlobalTensor<half> in;
        in.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(g.In()), 128);
        LocalTensor<half> t = buf.Get<half>();
        DataCopy(t, in, 128);      // PIPE_MTE2 writes UB
        Muls(t, t, half(2.0f), 128);  // PIPE_V reads it with no MTE2_V flag in between
    }, true};
}

// Broken synchronisation and operand rules the emulation must reject.
inline void AddRejectedSyncCases(std::map<std::string, Case>& c)
{
    c["wait_without_set"] = {KERNEL_TYPE_AIV_ONLY, 16, 16, [](Gm&) { WaitFlag<HardEvent::MTE2_V>(EVENT_ID1); }, true};
    c["set_twice"] = {KERNEL_TYPE_AIC_ONLY, 16, 16, [](Gm&) {
        SetFlag<HardEvent::M_MTE1>(EVENT_ID0);
        SetFlag<HardEvent::M_MTE1>(EVENT_ID0);
    }, true};
    c["set_never_waited"] = {KERNEL_TYPE_AIC_ONLY, 16, 16, [](Gm&) { SetFlag<HardEvent::MTE2_MTE1>(EVENT_ID2); }, true};
    c["missing_cross_core_flag"] = {KERNEL_TYPE_MIX_AIC_1_2, 16, 16, [](Gm&) {
        if ASCEND_IS_AIV {
            CrossCoreWaitFlag(3);  // the AIC never sets flag 3
        }
    }, true};
    c["cross_core_flag_never_waited"] = {KERNEL_TYPE_MIX_AIC_1_2, 16, 16, [](Gm&) {
        if ASCEND_IS_AIC {
            CrossCoreSetFlag<2, PIPE_FIX>(5);
        }
    }, true};
    c["cross_core_counter_overflow"] = {KERNEL_TYPE_MIX_AIC_1_2, 16, 16, [](Gm&) {
        if ASCEND_IS_AIC {
            for (int i = 0; i < 16; ++i) CrossCoreSetFlag<2, PIPE_FIX>(0);  // 16 > the counter's 15
            CrossCoreSetFlag<2, PIPE_FIX>(1);
        }
        if ASCEND_IS_AIV {
            CrossCoreWaitFlag(1);
            for (int i = 0; i < 16; ++i) CrossCoreWaitFlag(0);
        }
    }, true};
    c["sync_all_missed"] = {KERNEL_TYPE_MIX_AIC_1_2, 16, 32 * 3,
                            [](Gm& g) { SyncAllExchange(g.Out(), 3, 1); }, true, 3};
    c["sync_all_then_fail"] = {KERNEL_TYPE_MIX_AIC_1_2, 16, 32 * 3, [](Gm& g) {
        SyncAllExchange(g.Out(), 3, -1);
        if ASCEND_IS_AIV {
            if (GetBlockIdx() == 0) WaitFlag<HardEvent::MTE2_V>(EVENT_ID1);  // AIV0 of AI Core 0 fails past the barrier
        }
    }, true, 3};
    c["sync_all_aiv_only_in_mix"] = {KERNEL_TYPE_MIX_AIC_1_2, 16, 16, [](Gm&) { SyncAll<true>(); }, true};
    c["cross_core_wrong_pipe"] = {KERNEL_TYPE_MIX_AIC_1_2, 16, 256,
                                  [](Gm& g) { CrossCoreHandoff<PIPE_V>(g.Out()); }, true};
    c["queue_event_ids_exhausted"] = {KERNEL_TYPE_AIC_ONLY, 16, 16, [](Gm&) {
        TPipe pipe;
        TQue<TPosition::A1, 1> a1;
        TQue<TPosition::B1, 1> b1;
        pipe.InitBuffer(a1, 4, 512);
        pipe.InitBuffer(b1, 5, 512);  // A1 and B1 share MTE1_MTE2: nine freed buffers need nine IDs
        for (int i = 0; i < 4; ++i) {
            LocalTensor<half> t = a1.AllocTensor<half>();
            a1.FreeTensor(t);
        }
        for (int i = 0; i < 5; ++i) {
            LocalTensor<half> t = b1.AllocTensor<half>();
            b1.FreeTensor(t);
        }
    }, true};
    c["fixed_event_id_under_queue"] = {KERNEL_TYPE_AIV_ONLY, 16, 16, [](Gm&) {
        TPipe pipe;
        TQue<TPosition::VECOUT, 1> out;
        pipe.InitBuffer(out, 1, 512);
        LocalTensor<half> t = out.AllocTensor<half>();
        out.FreeTensor(t);                     // the queue sets MTE3_V on the first free ID, 0
        SetFlag<HardEvent::MTE3_V>(EVENT_ID0);  // the wait below would take the queue's flag
        WaitFlag<HardEvent::MTE3_V>(EVENT_ID0);
    }, true};
    c["partial_overlap"] = {KERNEL_TYPE_AIV_ONLY, 16, 16, [](Gm&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> t = buf.Get<float>();
        Duplicate(t, 1.0f, 256);
        Add(t[8], t, t, 64);  // dst [32, 288) bytes overlaps src [0, 256) partially
    }, true};
    c["select_over_api_scratch"] = {KERNEL_TYPE_AIV_ONLY, 16, 16, [](Gm&) {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 190 * 1024);  // reaches into the UB Select keeps its scratch in
        LocalTensor<half> t = buf.Get<half>();
        Duplicate(t, half(1.0f), 256);
        Select(t, t[1024].ReinterpretCast<uint8_t>(), t, half(0.0f), SELMODE::VSEL_TENSOR_SCALAR_MODE, 256);
    }, true};
    c["mmad_misaligned"] = {KERNEL_TYPE_AIC_ONLY, 16, 16, [](Gm&) {
        TPipe pipe;
        TBuf<TPosition::A2> a;
        TBuf<TPosition::B2> b;
        TBuf<TPosition::CO1> c0;
        pipe.InitBuffer(a, 2048);
        pipe.InitBuffer(b, 2048);
        pipe.InitBuffer(c0, 4096);
        Mmad(c0.Get<float>(), a.Get<half>()[16], b.Get<half>(), MmadParams(16, 16, 16, 0, false, true));
    }, true};
    // unitFlag misuse: each leaves an L0C fractal's unit flag where the next instruction would wait forever
    auto unitFlagCase = [](uint8_t first, int second, uint8_t fixFlag) {
        return Case{KERNEL_TYPE_AIC_ONLY, 16, 256, [=](Gm& g) {
            TPipe pipe;
            TBuf<TPosition::A2> a;
            TBuf<TPosition::B2> b;
            TBuf<TPosition::CO1> c0;
            pipe.InitBuffer(a, 512);
            pipe.InitBuffer(b, 512);
            pipe.InitBuffer(c0, 1024);
            GlobalTensor<float> out;
            out.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(g.OutF()), 256);
            Mmad(c0.Get<float>(), a.Get<half>(), b.Get<half>(), MmadParams(16, 16, 16, first, false, true));
            if (second >= 0) {
                Mmad(c0.Get<float>(), a.Get<half>(), b.Get<half>(), MmadParams(16, 16, 16, static_cast<uint8_t>(second), false, true));
            }
            Fixpipe<float, float, CFG_ROW_MAJOR>(out, c0.Get<float>(), FixpipeParamsV220(16, 16, 16, 16, false, QuantMode_t::NoQuant, 0, 1, 0, 0, fixFlag));
        }, false};
    };
    c["unit_flag_fixpipe_before_the_last_mmad"] = unitFlagCase(2, -1, 3);
    c["unit_flag_mmad_over_an_unread_result"] = unitFlagCase(3, 3, 3);
    c["unit_flag_fixpipe_without_it"] = unitFlagCase(3, -1, 0);
    c["fixpipe_without_quant"] = {KERNEL_TYPE_AIC_ONLY, 16, 256, [](Gm& g) {
        TPipe pipe;
        TQue<TPosition::CO1, 1> c0;
        pipe.InitBuffer(c0, 1, 1024);
        GlobalTensor<half> out;
        out.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(g.Out()), 256);
        LocalTensor<float> x = c0.AllocTensor<float>();
        c0.EnQue(x);
        x = c0.DeQue<float>();
        Fixpipe<half, float, CFG_ROW_MAJOR>(out, x, FixpipeParamsV220(16, 16, 16, 16, false));  // NoQuant to half
        c0.FreeTensor(x);
    }, true};
}

inline std::map<std::string, Case> Cases()
{
    std::map<std::string, Case> c;
    AddRunCases(c);
    AddTimingCases(c);
    AddRejectedMemoryCases(c);
    AddRejectedSyncCases(c);
    return c;
}

inline std::vector<std::string> Names()
{
    std::vector<std::string> n;
    for (auto& kv : Cases()) n.push_back(kv.first);
    return n;
}

inline std::vector<float> Run(const std::string& name, const emu::TimingParams& timing, double timeoutSeconds,
                              emu::Stats& stats)
{
    auto cases = Cases();
    auto it = cases.find(name);
    if (it == cases.end()) throw std::invalid_argument("no emulation self-test named '" + name + "'");
    Case& c = it->second;
    Gm g(c.nIn, c.nOut);
    LaunchOptions opt{c.blockDim, c.type, timeoutSeconds, timing};
    {
        pybind11::gil_scoped_release release;
        stats = AscendC::emu::Launch(opt, g.reg, [&]() { c.kernel(g); });
    }
    return c.halfOut ? g.Half() : g.outF;
}

}  // namespace pasa_selftest
