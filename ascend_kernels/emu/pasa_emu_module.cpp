// Python extension pasa_npu._ascendc_emu: runs the PASA AscendC kernel sources on CPU
// threads against the emulated kernel_operator.h. The kernel files are compiled here
// unchanged; only the include path differs from a CANN build.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <functional>

#include <cstring>
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "kernel_operator.h"
#include "../host/pasa_tiling.h"
#include "../host/pasa_problem_params.h"
#include "../host/pasa_tiling.cpp"
#include "../host/pasa_launcher.cpp"
#include "../kernels/pasa_prepare_keys.cpp"
#include "../kernels/pasa_attention.cpp"
#include "emu_launch_runtime.h"
#include "emu_pybind.h"

namespace py = pybind11;
using AscendC::emu::GmRegistry;
using pasa_emu::StatsDict;
using pasa_emu::TimingFrom;

namespace {

// A C-contiguous array of the given element size and count, or a ValueError naming it.
uint8_t* Buffer(py::array& a, const char* name, size_t itemsize, size_t count, bool writable)
{
    if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string(name) + " must be C-contiguous");
    if (static_cast<size_t>(a.itemsize()) != itemsize) {
        throw py::value_error(std::string(name) + " must have " + std::to_string(itemsize) + "-byte elements, got " +
                              std::to_string(a.itemsize()));
    }
    if (static_cast<size_t>(a.size()) != count) {
        throw py::value_error(std::string(name) + " must have " + std::to_string(count) + " elements, got " +
                              std::to_string(a.size()));
    }
    if (writable && !a.writeable()) throw py::value_error(std::string(name) + " must be writable");
    return static_cast<uint8_t*>(a.mutable_data());
}

// The named parameters of a Python dict, as pasa::ProblemFromParams reads them.
struct DictParams {
    const py::dict& p;
    template <typename T>
    T need(const char* name) const { return p[name].cast<T>(); }
    template <typename T>
    T get(const char* name, T fallback) const { return p.contains(name) ? p[name].cast<T>() : fallback; }
};

pasa::PasaProblem ProblemFrom(const py::dict& p) { return pasa::ProblemFromParams(DictParams{p}); }

py::dict TilingDict(const PasaTilingData& t, const pasa::PasaBudget& b)
{
    py::dict d;
    d["block_dim"] = t.blockDim;
    d["q_tile"] = t.qTile;
    d["kv_block"] = t.kvBlock;
    d["num_kv_blocks"] = t.numKvBlocks;
    d["q_tile_rows"] = t.qTile;
    d["num_tasks"] = t.numTasks;
    d["kv_splits"] = t.kvSplits;
    d["tail_from"] = t.tailFrom;
    d["tail_pieces"] = t.tailPieces;
    d["shift_scores"] = t.shiftScores;
    d["row_constants"] = t.rowConstants;
    d["repair_in_launch"] = t.repairTilingOffset != 0;
    d["prep_dim"] = t.prepDim;
    d["prep_in_attention"] = t.prepInAttention != 0;
    d["merge_dim"] = t.mergeDim;
    d["merge_in_attention"] = t.mergeInAttention != 0;
    d["cube_rows"] = t.cubeRows;
    d["cube_cols"] = t.cubeCols;
    d["cube_keys"] = t.cubeKeys;
    d["key_buffer_keys"] = t.keyBufferKeys;
    d["prob_buffer_keys"] = t.probBufferKeys;
    d["prob_buffers"] = t.probBuffers;
    d["value_buffers"] = t.valueBuffers;
    d["head_dim_v"] = t.headDimV;
    d["pv_cols"] = t.pvCols;
    d["prep_cols"] = t.prepCols;
    d["query_buffers"] = t.queryBuffers;
    d["shift_rows"] = t.shiftRows;
    d["shift_window"] = t.shiftWindow != 0;
    d["prep_vec_rows"] = t.prepVecRows;
    d["prep_key_buffers"] = t.prepKeyBuffers;
    d["prep_l0c_buffers"] = t.prepL0cBuffers;
    d["vec_rows"] = t.vecRowsPad;
    d["vec_chunk_rows"] = t.vecChunkRows;
    d["vec_stat_rows"] = t.vecStatRows;
    d["vec_sum_rows"] = t.vecSumRows;
    d["ub_score_buffers"] = t.ubScoreBuffers;
    d["ub_prob_buffers"] = t.ubProbBuffers;
    d["ub_pv_buffers"] = t.ubPvBuffers;
    d["workspace_bytes"] = t.workspaceBytes;
    d["gamma"] = t.gamma;
    d["shift_diag_bits"] = t.shiftDiagBits;
    d["shift_off_bits"] = t.shiftOffBits;
    d["resolution_limit"] = t.resolutionLimit;
    py::dict use;
    use["l1"] = b.l1; use["l0a"] = b.l0a; use["l0b"] = b.l0b; use["l0c"] = b.l0c; use["ub"] = b.ub;
    use["prep_l1"] = b.prepL1; use["prep_l0a"] = b.prepL0a; use["prep_l0b"] = b.prepL0b;
    use["prep_l0c"] = b.prepL0c; use["prep_ub"] = b.prepUb;
    d["bytes_per_core"] = use;
    return d;
}

// The per-batch arrays of `lengths` (q_lens, kv_lens; optional next_tokens, pre_tokens, q_starts,
// kv_starts), int32 with `batch` entries each; they stay owned by the dict.
struct Lengths {
    pasa::BatchLengths view;
    std::vector<py::array> keep;
};

Lengths LengthsFrom(const py::dict& lengths, uint32_t batch)
{
    Lengths l;
    auto take = [&](const char* name, const int32_t** dst) {
        if (!lengths.contains(name)) return;
        py::array a = lengths[name].cast<py::array>();
        *dst = reinterpret_cast<const int32_t*>(Buffer(a, name, 4, batch, false));
        l.keep.push_back(a);
    };
    take("q_lens", &l.view.qLens);
    take("kv_lens", &l.view.kvLens);
    take("next_tokens", &l.view.nextTokens);
    take("pre_tokens", &l.view.preTokens);
    take("q_starts", &l.view.qStarts);
    take("kv_starts", &l.view.kvStarts);
    return l;
}

// The call's tiling; a checked call's repair pass must fit as well (the launch tiles both).
py::dict Tiling(const py::dict& params, const py::object& lengths)
{
    pasa::PasaBudget budget;
    const pasa::PasaProblem prob = ProblemFrom(params);
    Lengths l;
    const pasa::BatchLengths* view = nullptr;
    if (!lengths.is_none()) {
        l = LengthsFrom(lengths.cast<py::dict>(), prob.batch);
        view = &l.view;
    }
    const PasaTilingData t = pasa::ComputeTiling(prob, view, &budget);
    if (prob.overflowCheck) pasa::RepairTiling(prob, view);
    return TilingDict(t, budget);
}

py::tuple RefTuple(const pasa_emu::BufferRef& r) { return py::make_tuple(r.buffer, r.offset); }

// The runtime calls of the shared launcher, as Python tuples: ("allocate", buffer, bytes),
// ("upload", (buffer, offset), data), ("launch", kernel, blockDim, ((buffer, offset), ...)).
py::list CallList(const std::vector<pasa_emu::RuntimeCall>& calls)
{
    py::list out;
    for (const auto& c : calls) {
        if (c.kind == "allocate") {
            out.append(py::make_tuple(c.kind, c.buffer, c.bytes));
        } else if (c.kind == "upload") {
            out.append(py::make_tuple(c.kind, RefTuple(c.target),
                                      py::bytes(reinterpret_cast<const char*>(c.data.data()), c.data.size())));
        } else {
            py::list args;
            for (const auto& a : c.args) args.append(RefTuple(a));
            out.append(py::make_tuple(c.kind, c.kernel, c.blockDim, py::tuple(args)));
        }
    }
    return out;
}

// Run a call through the shared host launcher (ascend_kernels/host/pasa_launcher.h) with the
// emulated runtime: preprocessing (pasa, pasa-exact), the attention kernel, the merge of split kv.
// Arrays: query/key/value fp16 bits in their layouts (key/value: the caches when paged), out fp16
// or bf16 bits, lse float32 (query batch x heads x seq_q); lengths: int32 per batch (LengthsFrom);
// mask: the bytes of the bool mask from its first element; block_table and key_slots int32; sink
// float32, num_heads (params['has_sink']); row_flags uint8 laid out as lse (params['overflow_check']:
// the kernels write them).
py::dict RunAttention(py::array query, py::array key, py::array value, py::array out, py::array lse,
                      const py::dict& lengths, const py::dict& params, py::object mask, py::object blockTable,
                      py::object keySlots, py::object rowFlags, py::object sink)
{
    const pasa::PasaProblem prob = ProblemFrom(params);
    const double timeout = params.contains("timeout_s") ? params["timeout_s"].cast<double>() : 60.0;
    if (!params.contains("timing")) throw py::value_error("params['timing']: the timing model's parameters are required");
    const AscendC::emu::TimingParams timing = TimingFrom(params["timing"].cast<py::dict>());
    const Lengths l = LengthsFrom(lengths, prob.batch);

    const size_t qb = prob.packed ? 1 : prob.batch, kb = prob.paged ? prob.numBlocks : qb;
    const size_t qN = qb * prob.numHeads * prob.seqQ * prob.headDim;
    const size_t kN = kb * prob.numKvHeads * prob.seqKv * prob.headDim;
    const size_t vN = kb * prob.numKvHeads * prob.seqKv * prob.headDimV;
    const size_t oN = qb * prob.numHeads * prob.seqQ * prob.headDimV;
    const size_t lN = qb * prob.numHeads * prob.seqQ;
    pasa::AttentionTensors tensors;
    tensors.query = Buffer(query, "query", 2, qN, false);
    tensors.key = Buffer(key, "key", 2, kN, false);
    tensors.value = Buffer(value, "value", 2, vN, false);
    tensors.out = Buffer(out, "out", 2, oN, true);
    tensors.lse = Buffer(lse, "lse", 4, lN, true);
    GmRegistry gm;
    pasa_emu::EmuLaunchRuntime runtime(gm, timeout, timing);
    runtime.AddTensor("query", tensors.query, qN * 2, false);
    runtime.AddTensor("key", tensors.key, kN * 2, false);
    runtime.AddTensor("value", tensors.value, vN * 2, false);
    runtime.AddTensor("out", tensors.out, oN * 2, true);
    runtime.AddTensor("lse", tensors.lse, lN * 4, true);
    std::vector<py::array> keep;
    auto optional = [&](py::object obj, const char* name, size_t itemsize, void** dst) {
        if (obj.is_none()) return;
        py::array a = obj.cast<py::array>();
        if (a.size() == 0) throw py::value_error(std::string(name) + " must not be empty");
        *dst = Buffer(a, name, itemsize, static_cast<size_t>(a.size()), false);
        runtime.AddTensor(name, *dst, a.size() * itemsize, false);
        keep.push_back(a);
    };
    optional(mask, "mask", 1, &tensors.mask);
    optional(blockTable, "block_table", 4, &tensors.blockTable);
    optional(keySlots, "key_slots", 4, &tensors.keySlots);
    if (!sink.is_none()) {
        if (!prob.hasSink) throw py::value_error("sink given but params['has_sink'] is not set");
        py::array a = sink.cast<py::array>();
        tensors.sink = Buffer(a, "sink", 4, prob.numHeads, false);
        runtime.AddTensor("sink", tensors.sink, static_cast<size_t>(prob.numHeads) * 4, false);
        keep.push_back(a);
    }
    if (!rowFlags.is_none()) {  // written by the kernels
        py::array a = rowFlags.cast<py::array>();
        tensors.rowFlags = Buffer(a, "row_flags", 1, lN, true);
        runtime.AddTensor("row_flags", tensors.rowFlags, lN, true);
        keep.push_back(a);
    }
    PasaTilingData t;
    {
        py::gil_scoped_release release;
        t = pasa::LaunchAttention(prob, tensors, l.view, runtime);
    }
    py::dict result;
    result["preprocess"] = py::none();
    result["merge"] = py::none();
    result["repair"] = py::none();
    bool attended = false;  // a second attention launch is the repair launch of a checked call
    for (const auto& [kernel, stats] : runtime.LaunchStats()) {
        const bool attention = kernel == pasa::PasaKernel::kAttention;
        const char* name = attention ? (attended ? "repair" : "attention")
                           : kernel == pasa::PasaKernel::kMerge ? "merge"
                                                                : "preprocess";
        attended = attended || attention;
        result[name] = StatsDict(stats);
    }
    pasa::PasaBudget budget;
    pasa::ComputeTiling(prob, &l.view, &budget);
    py::dict tiling = TilingDict(t, budget);
    // a checked call's repair pass: the kv blocks of its fa-fp32 tiling
    tiling["repair_kv_block"] = t.overflowCheck && prob.tilingKey != PASA_KEY_FA_FP32 ? pasa::RepairTiling(prob, &l.view).kvBlock : 0;
    result["tiling"] = tiling;
    result["runtime_calls"] = CallList(runtime.Calls());
    return result;
}

// The attention tasks each AI Core runs, as the kernel's own task iterator deals them: per core a
// list of (rows, kv blocks, kv blocks visible in full). Runs the iterator alone (no attention).
py::list AttentionTasks(const py::dict& params, const py::dict& lengths)
{
    const pasa::PasaProblem prob = ProblemFrom(params);
    const Lengths l = LengthsFrom(lengths, prob.batch);
    const PasaTilingData t = pasa::ComputeTiling(prob, &l.view);
    std::vector<uint8_t> parameters = pasa::ParameterBytes(prob, t, l.view);
    GmRegistry gm;
    gm.Add("parameters", parameters.data(), parameters.size(), false, false);
    std::vector<std::vector<std::array<uint32_t, 3>>> perCore(t.blockDim);
    AscendC::emu::LaunchOptions opt{static_cast<int>(t.blockDim), KERNEL_TYPE_AIV_ONLY, 10.0,
                      TimingFrom(params["timing"].cast<py::dict>())};
    {
        py::gil_scoped_release release;
        AscendC::emu::Launch(opt, gm, [&]() {
            const uint32_t core = static_cast<uint32_t>(AscendC::GetBlockIdx());
            pasa::BatchTable batches;
            batches.Init(parameters.data(), t);
            pasa::AttentionTaskIter it(t, batches, core, t.blockDim, t.kvSplits);
            pasa::AttentionTask task;
            while (it.Next(task)) {
                const uint32_t end = task.blockBegin + task.numBlocks;
                const uint32_t lo = std::max(task.blockBegin, task.fullFrom), hi = std::min(end, task.fullTo);
                perCore[core].push_back({task.rows, task.numBlocks, hi > lo ? hi - lo : 0u});
            }
        });
    }
    py::list out;
    for (const auto& tasks : perCore) {
        py::list l2;
        for (const auto& x : tasks) l2.append(py::make_tuple(x[0], x[1], x[2]));
        out.append(l2);
    }
    return out;
}

}  // namespace

PYBIND11_MODULE(_ascendc_emu, m)
{
    m.doc() = "PASA AscendC kernels executed on CPU threads against an emulation of the AscendC API";
    m.def("tiling", &Tiling, py::arg("params"), py::arg("lengths") = py::none(),
          "Host tiling and per-core buffer use (for the per-batch lengths, if given); ValueError if a budget fails");
    m.def("optimal_beta", &pasa::OptimalBeta, py::arg("beta0"), py::arg("n"), py::arg("scale"),
          "The host tiling's solver of the optimal accuracy condition (C++ twin of pasa_npu.beta.optimal_beta)");
    m.def("run_attention", &RunAttention, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("out"),
          py::arg("lse"), py::arg("lengths"), py::arg("params"), py::arg("mask") = py::none(),
          py::arg("block_table") = py::none(), py::arg("key_slots") = py::none(), py::arg("row_flags") = py::none(),
          py::arg("sink") = py::none());
    m.def("attention_tasks", &AttentionTasks, py::arg("params"), py::arg("lengths"),
          "The attention kernel's tasks per AI Core, as its task iterator deals them: [(rows, numBlocks, fullBlocks)]");
    m.attr("tiling_data_bytes") = py::int_(sizeof(PasaTilingData));  // what a launch's LoadTiling reads
}
