// Python extension pasa_npu._ascendc_emu: runs the PASA AscendC kernel sources on CPU
// threads against the emulated kernel_operator.h. The kernel files are compiled here
// unchanged; only the include path differs from a CANN build.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <functional>

#include <cstring>
#include <string>
#include <vector>

#include "kernel_operator.h"
#include "../host/pasa_tiling.h"
#include "../host/pasa_tiling.cpp"
#include "../kernels/pasa_prepare_keys.cpp"
#include "../kernels/pasa_attention.cpp"
#include "selftest_kernels.h"
#include "selftest_vector.h"

namespace py = pybind11;
using AscendC::emu::GmRegistry;
using AscendC::emu::LaunchOptions;
using AscendC::emu::Stats;

namespace {

py::dict StatsDict(const Stats& s)
{
    py::dict d;
    d["gm_to_l1_bytes"] = s.gm_to_l1;
    d["l1_fill_bytes"] = s.l1_fill;
    d["l1_to_l0a_bytes"] = s.l1_to_l0a;
    d["l1_to_l0b_bytes"] = s.l1_to_l0b;
    d["l0c_to_gm_bytes"] = s.l0c_to_gm;
    d["gm_to_ub_bytes"] = s.gm_to_ub;
    d["ub_to_gm_bytes"] = s.ub_to_gm;
    d["mmad_calls"] = s.mmad_calls;
    d["cube_macs"] = s.cube_macs;
    d["vector_instructions"] = s.vector_instructions;
    d["vector_elements"] = s.vector_elements;
    d["scalar_ub_accesses"] = s.scalar_ub_accesses;
    d["cross_core_sets"] = s.cross_core_sets;
    d["cross_core_waits"] = s.cross_core_waits;
    d["ai_cores"] = s.blocks;
    d["cores"] = s.cores;
    return d;
}

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

pasa::PasaProblem ProblemFrom(const py::dict& p)
{
    pasa::PasaProblem d;
    d.tilingKey = p["tiling_key"].cast<uint32_t>();
    d.batch = p["batch"].cast<uint32_t>();
    d.numHeads = p["num_heads"].cast<uint32_t>();
    d.numKvHeads = p["num_kv_heads"].cast<uint32_t>();
    d.seqQ = p["seq_q"].cast<uint32_t>();
    d.seqKv = p["seq_kv"].cast<uint32_t>();
    d.headDim = p["head_dim"].cast<uint32_t>();
    d.headDimV = p["head_dim_v"].cast<uint32_t>();
    d.qLayout = p["q_layout"].cast<uint32_t>();
    d.kvLayout = p["kv_layout"].cast<uint32_t>();
    d.outLayout = p["out_layout"].cast<uint32_t>();
    d.outDtype = p["out_dtype"].cast<uint32_t>();
    d.inDtype = p.contains("in_dtype") ? p["in_dtype"].cast<uint32_t>() : PASA_IN_FP16;
    d.maskMode = p["mask_mode"].cast<uint32_t>();
    d.scale = p["scale"].cast<double>();
    d.beta = p["beta"].cast<double>();
    d.qTile = p["q_tile"].cast<uint32_t>();
    d.kvBlock = p["kv_block"].cast<uint32_t>();
    d.coreNum = p["core_num"].cast<uint32_t>();
    return d;
}

py::dict TilingDict(const PasaTilingData& t, const pasa::PasaBudget& b)
{
    py::dict d;
    d["block_dim"] = t.blockDim;
    d["q_tile"] = t.qTile;
    d["kv_block"] = t.kvBlock;
    d["num_kv_blocks"] = t.numKvBlocks;
    d["l1_buffers"] = t.l1Buffers;
    d["l0b_buffers"] = t.l0bBuffers;
    d["l0c_buffers"] = t.l0cBuffers;
    d["workspace_bytes"] = t.workspaceBytes;
    d["gamma"] = t.gamma;
    d["shift_diag_bits"] = t.shiftDiagBits;
    d["shift_off_bits"] = t.shiftOffBits;
    py::dict use;
    use["l1"] = b.l1; use["l0a"] = b.l0a; use["l0b"] = b.l0b; use["l0c"] = b.l0c; use["ub"] = b.ub;
    use["prep_l1"] = b.prepL1; use["prep_l0a"] = b.prepL0a; use["prep_l0b"] = b.prepL0b;
    use["prep_l0c"] = b.prepL0c; use["prep_ub"] = b.prepUb;
    d["bytes_per_core"] = use;
    return d;
}

py::dict Tiling(const py::dict& params)
{
    pasa::PasaBudget budget;
    const PasaTilingData t = pasa::ComputeTiling(ProblemFrom(params), &budget);
    return TilingDict(t, budget);
}

// Run preprocessing (pasa, pasa-exact) and the attention kernel. Arrays: query/key/value fp16
// in their layouts, lens int32 (batch), out fp16 or bf16 bits, lse float32 (batch, heads, seq_q).
py::dict RunAttention(py::array query, py::array key, py::array value, py::array qLens, py::array kvLens,
                      py::array nextTokens, py::array out, py::array lse, const py::dict& params)
{
    const pasa::PasaProblem prob = ProblemFrom(params);
    pasa::PasaBudget budget;
    PasaTilingData t = pasa::ComputeTiling(prob, &budget);
    const double timeout = params.contains("timeout_s") ? params["timeout_s"].cast<double>() : 60.0;

    const size_t qN = static_cast<size_t>(t.batch) * t.numHeads * t.seqQ * t.headDim;
    const size_t kN = static_cast<size_t>(t.batch) * t.numKvHeads * t.seqKv * t.headDim;
    const size_t vN = static_cast<size_t>(t.batch) * t.numKvHeads * t.seqKv * t.headDimV;
    const size_t oN = static_cast<size_t>(t.batch) * t.numHeads * t.seqQ * t.headDimV;
    const size_t lN = static_cast<size_t>(t.batch) * t.numHeads * t.seqQ;
    uint8_t* q = Buffer(query, "query", 2, qN, false);
    uint8_t* k = Buffer(key, "key", 2, kN, false);
    uint8_t* v = Buffer(value, "value", 2, vN, false);
    uint8_t* ql = Buffer(qLens, "q_lens", 4, t.batch, false);
    uint8_t* kl = Buffer(kvLens, "kv_lens", 4, t.batch, false);
    uint8_t* nx = Buffer(nextTokens, "next_tokens", 4, t.batch, false);
    uint8_t* o = Buffer(out, "out", 2, oN, true);
    uint8_t* ls = Buffer(lse, "lse", 4, lN, true);
    for (uint32_t b = 0; b < t.batch; ++b) {
        int32_t qv, kvv;
        std::memcpy(&qv, ql + 4 * b, 4);
        std::memcpy(&kvv, kl + 4 * b, 4);
        if (qv < 0 || static_cast<uint32_t>(qv) > t.seqQ || kvv < 0 || static_cast<uint32_t>(kvv) > t.seqKv) {
            throw py::value_error("q_lens/kv_lens[" + std::to_string(b) + "] outside the tensors' sequence lengths");
        }
    }

    std::vector<uint8_t> workspace(t.workspaceBytes, 0);
    std::vector<uint8_t> tiling(sizeof(PasaTilingData));
    std::memcpy(tiling.data(), &t, sizeof(t));
    if (t.tilingKey == PASA_KEY_PASA) {
        pasa::FillShiftMatrix(t, reinterpret_cast<uint16_t*>(workspace.data() + t.shiftMatrixOffset));
    }

    GmRegistry gm;
    gm.Add("query", q, qN * 2, false, false);
    gm.Add("key", k, kN * 2, false, false);
    gm.Add("value", v, vN * 2, false, false);
    gm.Add("q_lens", ql, t.batch * 4, false, false);
    gm.Add("kv_lens", kl, t.batch * 4, false, false);
    gm.Add("next_tokens", nx, t.batch * 4, false, false);
    gm.Add("out", o, oN * 2, true, false);
    gm.Add("lse", ls, lN * 4, true, false);
    gm.Add("workspace", workspace.data(), workspace.size(), true, true);
    gm.Add("tiling", tiling.data(), tiling.size(), false, false);

    GM_ADDR ws = workspace.data();
    GM_ADDR td = tiling.data();
    py::dict result;
    {
        py::gil_scoped_release release;
        Stats prep;
        bool ran = false;
        if (t.tilingKey == PASA_KEY_PASA) {
            LaunchOptions opt{static_cast<int>(t.blockDim), KERNEL_TYPE_AIC_ONLY, timeout};
            prep = AscendC::emu::Launch(opt, gm, [&]() { pasa_shift_keys(k, ql, kl, nx, ws, td); });
            ran = true;
        } else if (t.tilingKey == PASA_KEY_PASA_EXACT) {
            LaunchOptions opt{static_cast<int>(t.blockDim), KERNEL_TYPE_MIX_AIC_1_2, timeout};
            prep = AscendC::emu::Launch(opt, gm, [&]() { pasa_center_keys(k, ql, kl, nx, ws, td); });
            ran = true;
        }
        LaunchOptions opt{static_cast<int>(t.blockDim), KERNEL_TYPE_MIX_AIC_1_2, timeout};
        const Stats att = AscendC::emu::Launch(opt, gm, [&]() { pasa_attention(q, k, v, ql, kl, nx, o, ls, ws, td); });
        py::gil_scoped_acquire acquire;
        result["preprocess"] = ran ? py::object(StatsDict(prep)) : py::object(py::none());
        result["attention"] = StatsDict(att);
    }
    result["tiling"] = TilingDict(t, budget);
    return result;
}

}  // namespace

PYBIND11_MODULE(_ascendc_emu, m)
{
    m.doc() = "PASA AscendC kernels executed on CPU threads against an emulation of the AscendC API";
    m.def("tiling", &Tiling, py::arg("params"), "Host tiling and per-core buffer use; ValueError if a budget fails");
    m.def("optimal_beta", &pasa::OptimalBeta, py::arg("beta0"), py::arg("n"), py::arg("scale"),
          "The host tiling's solver of the optimal accuracy condition (C++ twin of pasa_npu.beta.optimal_beta)");
    m.def("run_attention", &RunAttention, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("q_lens"),
          py::arg("kv_lens"), py::arg("next_tokens"), py::arg("out"), py::arg("lse"), py::arg("params"));
    m.def("run_selftest", &pasa_selftest::Run, py::arg("name"), py::arg("timeout_s") = 5.0,
          "Run one emulation self-test kernel; returns its output values; RuntimeError if the emulation rejects it");
    m.def("selftest_names", &pasa_selftest::Names);
    m.def("run_vector_instruction", &pasa_selftest::RunVectorInstruction, py::arg("op"), py::arg("dtype"),
          py::arg("a"), py::arg("b") = std::vector<float>(), py::arg("scalar") = 0.0f,
          "Run one emulated vector instruction on the given operands in an AIV core; returns its result");
}
