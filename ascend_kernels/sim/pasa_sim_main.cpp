// One PASA attention call on the instruction-level simulator: the kernel sources compiled in the
// CPU-debug configuration against the asc-devkit headers (Huawei's implementation of every
// AscendC API they call), the shared host launcher (tiling, parameter buffer, launches) driving
// them through a runtime whose GM is the simulator's shared memory.
//
//   pasa_sim_attention DIR
//
// DIR holds params.txt ("name value" lines: the fields of pasa_emu_module.cpp's ProblemFrom),
// the tensors as raw bytes (query.bin key.bin value.bin out.bin lse.bin; optional mask.bin
// block_table.bin key_slots.bin sink.bin row_flags.bin) and the int32 lengths (q_lens.bin
// kv_lens.bin; optional next_tokens.bin pre_tokens.bin q_starts.bin kv_starts.bin). Lines
// "timing.NAME value" of params.txt set the timing model's parameters (emu::TimingParams names).
// The call overwrites out.bin, lse.bin and row_flags.bin and writes timing.jsonl: one JSON
// object a launch, {"kernel", "block_dim", "cores": [{"slot", "cycles", "busy": {pipe: cycles},
// "instructions": {pipe: count}, "gm_read": {pipe: bytes}, "gm_write": {pipe: bytes}, "hazards",
// "first_hazard"}]} (the instruction-level model, sim_timing.h; hazards are counted under
// PASA_SIM_HAZARDS=report, sim_hazards.h). Exit status 0 on success; else the error on stderr.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernel_operator.h"
#include "../host/pasa_tiling.h"
#include "../host/pasa_problem_params.h"
#include "../host/pasa_tiling.cpp"
#include "../host/pasa_launcher.cpp"
#include "../kernels/pasa_prepare_keys.cpp"
#include "../kernels/pasa_attention.cpp"
#include "sim_globals.h"
#include "sim_launch.h"

static_assert(AscendC::AIV == AscendC::AIV_TYPE && AscendC::AIC == AscendC::AIC_TYPE, "core type values");

namespace {

struct File {
    void* data = nullptr;
    size_t bytes = 0;
};

// A file's bytes in shared GM (null when absent and optional).
File Load(const std::string& path, bool required)
{
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) {
        if (required) throw std::runtime_error("missing " + path);
        return {};
    }
    File r;
    r.bytes = static_cast<size_t>(f.tellg());
    r.data = pasa_sim::SharedAlloc(r.bytes ? r.bytes : 1);
    f.seekg(0);
    f.read(static_cast<char*>(r.data), static_cast<std::streamsize>(r.bytes));
    return r;
}

void Store(const std::string& path, const File& file)
{
    if (file.data == nullptr) return;
    std::ofstream f(path, std::ios::binary);
    f.write(static_cast<const char*>(file.data), static_cast<std::streamsize>(file.bytes));
}

// One launch's per-core reports as a JSON line.
std::string LaunchJson(const char* kernel, uint32_t blockDim)
{
    std::ostringstream o;
    o.precision(17);
    auto perPipe = [&](const char* key, auto values) {
        o << ", \"" << key << "\": {";
        for (int s = 0; s < pasa_sim::kSlots; ++s) o << (s ? ", " : "") << "\"" << pasa_sim::SlotName(s) << "\": " << values(s);
        o << "}";
    };
    o << "{\"kernel\": \"" << kernel << "\", \"block_dim\": " << blockDim << ", \"cores\": [";
    bool first = true;
    const std::vector<pasa_sim::CoreReport>& reports = pasa_sim::LastReports();
    for (size_t slot = 0; slot < reports.size(); ++slot) {
        const pasa_sim::CoreReport& r = reports[slot];
        if (!r.ran) continue;
        o << (first ? "" : ", ") << "{\"slot\": " << slot << ", \"cycles\": " << r.cycles;
        perPipe("busy", [&](int s) { return r.busy[s]; });
        perPipe("instructions", [&](int s) { return r.count[s]; });
        perPipe("gm_read", [&](int s) { return r.gmRead[s]; });
        perPipe("gm_write", [&](int s) { return r.gmWrite[s]; });
        o << ", \"hazards\": " << r.hazards << ", \"first_hazard\": \"" << r.firstHazard << "\"";
        o << "}";
        first = false;
    }
    o << "]}";
    return o.str();
}

class SimRuntime final : public pasa::LaunchRuntime {
public:
    std::vector<std::string> launches;  // timing.jsonl's lines

    void* Allocate(size_t bytes, pasa::BufferRole) override
    {
        void* p = pasa_sim::SharedAlloc(bytes ? bytes : 1);
        std::memset(p, pasa_sim::kUnwrittenByte, bytes);  // fresh device memory is not zero
        return p;
    }

    void Upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

    void Launch(pasa::PasaKernel kernel, uint32_t blockDim, const pasa::KernelArgs& a) override
    {
        auto gm = [](void* p) { return reinterpret_cast<GM_ADDR>(p); };
        static const char* names[] = {"shift_keys", "center_keys", "attention", "merge"};
        Run(kernel, blockDim, a, gm);
        launches.push_back(LaunchJson(names[static_cast<int>(kernel)], blockDim));
    }

private:
    template <typename G>
    void Run(pasa::PasaKernel kernel, uint32_t blockDim, const pasa::KernelArgs& a, G gm)
    {
        switch (kernel) {
        case pasa::PasaKernel::kShiftKeys:
            return pasa_sim::Launch(blockDim, pasa_sim::kMix, [&]() {
                pasa_shift_keys(gm(a.key), gm(a.blockTable), gm(a.keySlots), gm(a.workspace), gm(a.tiling));
            });
        case pasa::PasaKernel::kCenterKeys:
            return pasa_sim::Launch(blockDim, pasa_sim::kMix, [&]() {
                pasa_center_keys(gm(a.key), gm(a.blockTable), gm(a.keySlots), gm(a.workspace), gm(a.tiling));
            });
        case pasa::PasaKernel::kAttention:
            return pasa_sim::Launch(blockDim, pasa_sim::kMix, [&]() {
                pasa_attention(gm(a.query), gm(a.key), gm(a.value), gm(a.mask), gm(a.blockTable), gm(a.keySlots),
                               gm(a.sink), gm(a.out), gm(a.lse), gm(a.rowFlags), gm(a.workspace), gm(a.tiling));
            });
        case pasa::PasaKernel::kMerge:
            return pasa_sim::Launch(blockDim, pasa_sim::kAiv, [&]() {
                pasa_merge_splits(gm(a.sink), gm(a.out), gm(a.lse), gm(a.rowFlags), gm(a.workspace), gm(a.tiling));
            });
        }
        throw std::runtime_error("unknown kernel");
    }
};

// The parameters of params.txt (numbers by name), as pasa::ProblemFromParams reads them.
struct FileParams {
    const std::map<std::string, double>& p;
    template <typename T>
    T need(const char* name) const
    {
        auto it = p.find(name);
        if (it == p.end()) throw std::runtime_error(std::string("params.txt lacks ") + name);
        return static_cast<T>(it->second);
    }
    template <typename T>
    T get(const char* name, T fallback) const
    {
        auto it = p.find(name);
        return it == p.end() ? fallback : static_cast<T>(it->second);
    }
};

pasa::PasaProblem ProblemFrom(const std::map<std::string, double>& p) { return pasa::ProblemFromParams(FileParams{p}); }

}  // namespace

int main(int argc, char** argv)
{
    if (argc != 2) {
        std::cerr << "usage: pasa_sim_attention DIR\n";
        return 2;
    }
    const std::string dir = argv[1];
    try {
        std::map<std::string, double> params;
        std::ifstream pf(dir + "/params.txt");
        if (!pf) throw std::runtime_error("missing params.txt");
        std::string name;
        double value;
        while (pf >> name >> value) {
            if (name.rfind("timing.", 0) == 0) {
                if (!pasa_sim::Params().Set(name.substr(7), value)) throw std::runtime_error("unknown timing parameter " + name);
            } else {
                params[name] = value;
            }
        }
        const pasa::PasaProblem prob = ProblemFrom(params);
        pasa::AttentionTensors t;
        File query = Load(dir + "/query.bin", true), key = Load(dir + "/key.bin", true);
        File val = Load(dir + "/value.bin", true), out = Load(dir + "/out.bin", true), lse = Load(dir + "/lse.bin", true);
        File mask = Load(dir + "/mask.bin", false), table = Load(dir + "/block_table.bin", false);
        File slots = Load(dir + "/key_slots.bin", false), sink = Load(dir + "/sink.bin", false);
        File flags = Load(dir + "/row_flags.bin", false);
        t.query = query.data;
        t.key = key.data;
        t.value = val.data;
        t.out = out.data;
        t.lse = lse.data;
        t.mask = mask.data;
        t.blockTable = table.data;
        t.keySlots = slots.data;
        t.sink = sink.data;
        t.rowFlags = flags.data;
        std::vector<File> lengthFiles;
        pasa::BatchLengths lengths;
        auto len = [&](const char* n, const int32_t** dst) {
            File f = Load(dir + "/" + n + ".bin", false);
            if (f.data) *dst = static_cast<const int32_t*>(f.data);
        };
        len("q_lens", &lengths.qLens);
        len("kv_lens", &lengths.kvLens);
        len("next_tokens", &lengths.nextTokens);
        len("pre_tokens", &lengths.preTokens);
        len("q_starts", &lengths.qStarts);
        len("kv_starts", &lengths.kvStarts);
        SimRuntime runtime;
        const PasaTilingData tiling = pasa::LaunchAttention(prob, t, lengths, runtime);
        Store(dir + "/out.bin", out);
        Store(dir + "/lse.bin", lse);
        Store(dir + "/row_flags.bin", flags);
        std::ofstream tf(dir + "/timing.jsonl");
        for (const std::string& line : runtime.launches) tf << line << "\n";
        std::cout << "block_dim " << tiling.blockDim << "\n";
    } catch (const std::exception& e) {
        std::cerr << "pasa-sim: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
