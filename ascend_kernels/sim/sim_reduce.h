// Reduction and broadcast instructions: vcadd, vcmax, vcmin (whole repeat), vcgadd, vcgmax,
// vcgmin (per 32-byte block), vcpadd (adjacent pairs), vbrcb, and the registers they leave
// (get_acc_val, get_max_min_cnt).
//
// Contract.
// * Sums: a binary tree of adjacent active lanes (level by level, lane 2k with lane 2k + 1),
//   each addition rounded to the element type; inactive lanes take no part.
// * vcadd(dst, src, repeat, dstRep, srcBlk, srcRep, acc): acc == 0 writes repeat r's sum to
//   dst[r * dstRep]; acc != 0 adds the repeats' sums in order (each addition rounded) and writes
//   the total to dst[0] and to the accumulator register.
// * vcmax/vcmin(dst, src, repeat, dstRep, srcBlk, srcRep, order): the extreme active lane of a
//   repeat (the first of equals; a NaN lane wins), written as value and lane index (an unsigned
//   integer of the element's width) in `order`; dstRep counts results (a pair, or one element
//   for ONLY_VALUE / ONLY_INDEX). The last repeat's result stays in the register that
//   get_max_min_cnt reads: value bits in bits 0..31, index in bits 32..63.
// * vcgadd/vcgmax/vcgmin(dst, src, repeat, dstRep, srcBlk, srcRep): one result per 32-byte
//   block of the repeat, at dst[r * dstRep * 8 + block]; a block without active lanes is not
//   written.
// * vcpadd: lane pair (2k, 2k + 1) summed into dst[r * dstRep * lanes / 2 + k].
// * vbrcb(dst, src, dstBlk, dstRep, repeat): src[8 r + j] fills block j of repeat r of dst, at
//   (r * dstRep + j * dstBlk) * 32 bytes; the mask plays no part.
// * Each reports PIPE_V, the source blocks holding an active lane, the destination elements
//   from the first result to the last, and its repeats (sim_pipes.h): vcadd / vcmax / vcmin at
//   the published whole-repeat reduction rate, vcg* at the per-block one, vcpadd and vbrcb one
//   repeat a cycle.
#ifndef PASA_SIM_REDUCE_H
#define PASA_SIM_REDUCE_H

#include <vector>

#include "sim_core.h"
#include "sim_pipes.h"

namespace pasa_sim {

template <typename T>
inline T TreeSum(std::vector<T> v)
{
    if (v.empty()) return Store<T>(0.0);
    while (v.size() > 1) {
        std::vector<T> next;
        for (size_t k = 0; k + 1 < v.size(); k += 2) next.push_back(Store<T>(Value(v[k]) + Value(v[k + 1])));
        if (v.size() % 2) next.push_back(v.back());
        v.swap(next);
    }
    return v[0];
}

// The record of a reduction: `resultElems` results of `perResult` elements, result r at
// dst + r * pitch elements.
template <typename T>
inline void ReduceRecord(const char* name, AscendC::emu::VecKind kind, const T* dst, uint64_t pitch, uint64_t perResult,
                         const T* src, uint64_t repeat, uint64_t srcBlk, uint64_t srcRep)
{
    const uint64_t n = VecIter(sizeof(T), repeat).Repeats();
    Begin(name, PIPE_V);
    VecOperand(src, sizeof(T), 256 / sizeof(T), repeat, srcBlk, srcRep, false);
    if (n > 0) Write(dst, ((n - 1) * pitch + perResult) * sizeof(T));
    VecCost(kind, sizeof(T), repeat);
    Issue();
}

// The active lanes of each repeat, gathered: f(r, values, laneIndices).
template <typename T, typename F>
inline void Gather(T* src, uint64_t repeat, uint64_t srcBlk, uint64_t srcRep, F f)
{
    const VecIter it(sizeof(T), repeat);
    ++State().instructions;
    for (uint64_t r = 0, n = it.Repeats(); r < n; ++r) {
        std::vector<T> vals;
        std::vector<uint32_t> idx;
        for (uint32_t i = 0; i < it.lanes; ++i) {
            if (!it.Active(r, i)) continue;
            vals.push_back(*Lane(src, r, i, srcBlk, srcRep));
            idx.push_back(i);
        }
        f(r, vals, idx);
    }
}

template <typename T>
inline uint64_t RawBits(const T& v)
{
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}

template <typename T>
inline T IndexAs(uint32_t i)
{
    T r{};
    if constexpr (sizeof(T) == 2) {
        const uint16_t v = static_cast<uint16_t>(i);
        std::memcpy(&r, &v, 2);
    } else {
        std::memcpy(&r, &i, 4);
    }
    return r;
}

template <typename T>
inline void Extreme(T* dst, T* src, uint64_t repeat, uint64_t dstRep, uint64_t srcBlk, uint64_t srcRep, Order_t order,
                    bool isMax)
{
    const bool pair = order == Order_t::VALUE_INDEX || order == Order_t::INDEX_VALUE;
    ReduceRecord(isMax ? "vcmax" : "vcmin", AscendC::emu::VecKind::ReduceRepeat, dst, dstRep * (pair ? 2 : 1),
                 pair ? 2 : 1, src, repeat, srcBlk, srcRep);
    Gather(src, repeat, srcBlk, srcRep, [&](uint64_t r, const std::vector<T>& v, const std::vector<uint32_t>& idx) {
        if (v.empty()) return;
        size_t best = 0;
        for (size_t k = 1; k < v.size() && !std::isnan(Value(v[best])); ++k) {
            const double x = Value(v[k]), b = Value(v[best]);
            if (std::isnan(x) || (isMax ? x > b : x < b)) best = k;
        }
        T* out = dst + r * dstRep * (pair ? 2 : 1);
        const T value = v[best], index = IndexAs<T>(idx[best]);
        switch (order) {
        case Order_t::VALUE_INDEX: out[0] = value; out[1] = index; break;
        case Order_t::INDEX_VALUE: out[0] = index; out[1] = value; break;
        case Order_t::ONLY_VALUE: out[0] = value; break;
        case Order_t::ONLY_INDEX: out[0] = index; break;
        }
        State().maxMinCnt = RawBits(value) | (static_cast<uint64_t>(idx[best]) << 32);
    });
}

template <typename T>
inline void BlockReduce(T* dst, T* src, uint64_t repeat, uint64_t dstRep, uint64_t srcBlk, uint64_t srcRep, int kind)
{
    constexpr uint32_t perBlock = 32 / sizeof(T);
    static const char* names[] = {"vcgadd", "vcgmax", "vcgmin"};
    ReduceRecord(names[kind], AscendC::emu::VecKind::ReduceDataBlock, dst, dstRep * 8, 8, src, repeat, srcBlk, srcRep);
    Gather(src, repeat, srcBlk, srcRep, [&](uint64_t r, const std::vector<T>& v, const std::vector<uint32_t>& idx) {
        for (uint32_t b = 0; b < 8; ++b) {
            std::vector<T> part;
            for (size_t k = 0; k < v.size(); ++k) {
                if (idx[k] / perBlock == b) part.push_back(v[k]);
            }
            if (part.empty()) continue;
            T res = part[0];
            if (kind == 0) {
                res = TreeSum(part);
            } else {
                for (const T& x : part) {
                    const double a = Value(x), c = Value(res);
                    if (std::isnan(c)) break;
                    if (std::isnan(a) || (kind == 1 ? a > c : a < c)) res = x;
                }
            }
            dst[r * dstRep * 8 + b] = res;
        }
    });
}

}  // namespace pasa_sim

template <typename T>
inline void vcadd(T* dst, T* src, uint64_t repeat, uint64_t dstRep, uint64_t srcBlk, uint64_t srcRep, uint64_t acc)
{
    using namespace pasa_sim;
    bool first = true;
    T total = Store<T>(0.0);
    ReduceRecord("vcadd", AscendC::emu::VecKind::ReduceRepeat, dst, acc ? 0 : dstRep, 1, src, repeat, srcBlk, srcRep);
    Gather(src, repeat, srcBlk, srcRep, [&](uint64_t r, const std::vector<T>& v, const std::vector<uint32_t>&) {
        const T s = TreeSum(v);
        if (!acc) {
            dst[r * dstRep] = s;
            return;
        }
        total = first ? s : Store<T>(Value(total) + Value(s));
        first = false;
    });
    if (acc) {
        dst[0] = total;
        State().accVal = RawBits(total);
    }
}

template <typename T>
inline void vcmax(T* dst, T* src, uint64_t repeat, uint64_t dstRep, uint64_t srcBlk, uint64_t srcRep, Order_t order)
{
    pasa_sim::Extreme(dst, src, repeat, dstRep, srcBlk, srcRep, order, true);
}

template <typename T>
inline void vcmin(T* dst, T* src, uint64_t repeat, uint64_t dstRep, uint64_t srcBlk, uint64_t srcRep, Order_t order)
{
    pasa_sim::Extreme(dst, src, repeat, dstRep, srcBlk, srcRep, order, false);
}

template <typename T>
inline void vcgadd(T* dst, T* src, uint64_t repeat, uint64_t dstRep, uint64_t srcBlk, uint64_t srcRep)
{
    pasa_sim::BlockReduce(dst, src, repeat, dstRep, srcBlk, srcRep, 0);
}

template <typename T>
inline void vcgmax(T* dst, T* src, uint64_t repeat, uint64_t dstRep, uint64_t srcBlk, uint64_t srcRep)
{
    pasa_sim::BlockReduce(dst, src, repeat, dstRep, srcBlk, srcRep, 1);
}

template <typename T>
inline void vcgmin(T* dst, T* src, uint64_t repeat, uint64_t dstRep, uint64_t srcBlk, uint64_t srcRep)
{
    pasa_sim::BlockReduce(dst, src, repeat, dstRep, srcBlk, srcRep, 2);
}

template <typename T>
inline void vcpadd(T* dst, T* src, uint64_t repeat, uint64_t dstRep, uint64_t srcBlk, uint64_t srcRep)
{
    using namespace pasa_sim;
    const uint32_t half_lanes = 128 / sizeof(T);
    ReduceRecord("vcpadd", AscendC::emu::VecKind::Simple, dst, dstRep * half_lanes, half_lanes, src, repeat, srcBlk, srcRep);
    Gather(src, repeat, srcBlk, srcRep, [&](uint64_t r, const std::vector<T>& v, const std::vector<uint32_t>& idx) {
        for (size_t k = 0; k < v.size(); ++k) {
            const uint32_t p = idx[k] / 2;
            const bool partner = k + 1 < v.size() && idx[k + 1] == idx[k] + 1 && idx[k] % 2 == 0;
            dst[r * dstRep * half_lanes + p] = partner ? Store<T>(Value(v[k]) + Value(v[k + 1])) : v[k];
            if (partner) ++k;
        }
    });
}

template <typename T>
inline void vbrcb(T* dst, T* src, uint64_t dstBlk, uint64_t dstRep, uint64_t repeat)
{
    constexpr uint32_t perBlock = 32 / sizeof(T);
    ++pasa_sim::State().instructions;
    pasa_sim::Begin("vbrcb", PIPE_V);
    pasa_sim::Read(src, repeat * 8 * sizeof(T));
    for (uint64_t r = 0; r < repeat; ++r) {
        for (uint32_t j = 0; j < 8; ++j) pasa_sim::Write(reinterpret_cast<uint8_t*>(dst) + (r * dstRep + j * dstBlk) * 32, 32);
    }
    pasa_sim::Cost(pasa_sim::Work::kVec, static_cast<double>(repeat));
    pasa_sim::Issue();
    for (uint64_t r = 0; r < repeat; ++r) {
        for (uint32_t j = 0; j < 8; ++j) {
            T* block = reinterpret_cast<T*>(reinterpret_cast<uint8_t*>(dst) + (r * dstRep + j * dstBlk) * 32);
            for (uint32_t k = 0; k < perBlock; ++k) block[k] = src[r * 8 + j];
        }
    }
}

template <typename... A>
inline int64_t get_acc_val(A...) { return static_cast<int64_t>(pasa_sim::State().accVal); }
template <typename... A>
inline int64_t get_max_min_cnt(A...) { return static_cast<int64_t>(pasa_sim::State().maxMinCnt); }

#endif
