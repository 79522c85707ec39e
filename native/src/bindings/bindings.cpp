// bindings.cpp - the lampo._native module: the engine (`Engine`, engine_bindings.cpp), the device
// helpers, the timeline hooks and the CudaError exception (cuda_error.h). The per-op test bindings
// are a module of their own, lampo._native_ops (op_tests/). The engine registers itself from its
// own file; the hook is weak so that a build restricted to a subset of sources
// (-DLAMPO_SOURCES=...) still links.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/cuda_error.h"
#include "diagnostics/timeline.h"

namespace py = pybind11;

namespace lampo {
void register_engine(py::module_& m) __attribute__((weak));
}  // namespace lampo

PYBIND11_MODULE(_native, m) {
    m.doc() = "Lampo's C++/CUDA engine for the Qwen3.5/3.6 family";
    lampo::register_cuda_error(m);
    m.def("device_count", []() {
        int n = 0;
        return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
    }, "Number of CUDA devices visible (0 when no driver or GPU).");

#ifdef LAMPO_CUDA_ARCHITECTURES
    m.attr("cuda_architectures") = LAMPO_CUDA_ARCHITECTURES;  // CMake's list, e.g. "90a" or "86,120"
#endif
    m.attr("timeline_built") = lampo::timeline_built();
    m.def("timeline_start", &lampo::timeline_start, py::arg("per_sm"),
          "Start recording block timestamps of every kernel (a LAMPO_TIMELINE=ON build only).");
    m.def("timeline_stop", []() {
        const std::vector<lampo::TimelineEvent> ev = lampo::timeline_stop();
        return py::bytes(reinterpret_cast<const char*>(ev.data()), ev.size() * sizeof(lampo::TimelineEvent));
    }, "Stop recording; the events as bytes of 24-byte records (time_ns u64, grid_id u64, block u32, sm u16, stage u8, pad u8).");
    m.def("timeline_launches", &lampo::timeline_launches, py::arg("tokens") = 1,
          "Launch names ('<model op>: <launcher>') of the last forward pass of `tokens` tokens and the sampler, in order.");

    if (lampo::register_engine) lampo::register_engine(m);
}
