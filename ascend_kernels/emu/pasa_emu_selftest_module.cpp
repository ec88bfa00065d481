// Python module _ascendc_emu_selftest: the emulation's self-tests (selftest_kernels.h,
// selftest_vector.h), for the tests only. Never installed: tests/_emu_selftest.py builds it
// on first use with the shipped extension's compiler flags.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "kernel_operator.h"
#include "emu_pybind.h"
#include "selftest_kernels.h"
#include "selftest_vector.h"

namespace py = pybind11;
using pasa_emu::TimingFrom;

PYBIND11_MODULE(_ascendc_emu_selftest, m)
{
    m.doc() = "Self-tests of the AscendC CPU emulation (development only)";
    m.def("run_selftest", [](const std::string& name, const py::dict& timing, double timeoutSeconds) {
              AscendC::emu::Stats stats;
              std::vector<float> values = pasa_selftest::Run(name, TimingFrom(timing), timeoutSeconds, stats);
              py::dict r;
              r["values"] = values;
              r["stats"] = pasa_emu::StatsDict(stats);
              return r;
          }, py::arg("name"), py::arg("timing"), py::arg("timeout_s") = 5.0,
          "Run one emulation self-test kernel: {'values': its output, 'stats': the launch's counters and timing}; "
          "RuntimeError if the emulation rejects it");
    m.def("selftest_names", &pasa_selftest::Names);
    m.def("run_vector_instruction",
          [](const std::string& op, const std::string& dtype, const std::vector<float>& a, const std::vector<float>& b,
             float scalar, const py::dict& timing) {
              return pasa_selftest::RunVectorInstruction(op, dtype, a, b, scalar, TimingFrom(timing));
          },
          py::arg("op"), py::arg("dtype"), py::arg("a"), py::arg("b"), py::arg("scalar"), py::arg("timing"),
          "Run one emulated vector instruction on the given operands in an AIV core; returns its result");
}
