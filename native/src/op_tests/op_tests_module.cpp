// op_tests_module.cpp - the lampo._native_ops module, built only with -DLAMPO_OP_TESTS=ON (for the
// GPU tests, tests/cuda; `pip install .` never builds it): each launcher of kernels/ops.h on numpy
// arrays, registered from ops_core_bindings.cpp, ops_gdn_moe_bindings.cpp, ops_lq_bindings.cpp,
// ops_lq_gemm_bindings.cpp, ops_lq_quant_bindings.cpp and ops_lq_fused_bindings.cpp, and the
// CudaError exception (bindings/cuda_error.h, the same registration as lampo._native's). The hooks
// are weak so that a build restricted to a subset of sources (-DLAMPO_SOURCES=...) still links.
#include <pybind11/pybind11.h>

#include "bindings/cuda_error.h"

namespace py = pybind11;

namespace lampo {
void register_core_ops(py::module_& ops) __attribute__((weak));
void register_gdn_moe_ops(py::module_& ops) __attribute__((weak));
void register_lq_ops(py::module_& ops) __attribute__((weak));
void register_lq_gemm_ops(py::module_& ops) __attribute__((weak));
void register_lq_quant_ops(py::module_& ops) __attribute__((weak));
void register_lq_fused_ops(py::module_& ops) __attribute__((weak));
}  // namespace lampo

PYBIND11_MODULE(_native_ops, m) {
    m.doc() = "Lampo's CUDA kernels one launcher at a time, on numpy arrays, for the GPU tests";
    lampo::register_cuda_error(m);
    if (lampo::register_core_ops) lampo::register_core_ops(m);
    if (lampo::register_gdn_moe_ops) lampo::register_gdn_moe_ops(m);
    if (lampo::register_lq_ops) lampo::register_lq_ops(m);
    if (lampo::register_lq_gemm_ops) lampo::register_lq_gemm_ops(m);
    if (lampo::register_lq_quant_ops) lampo::register_lq_quant_ops(m);
    if (lampo::register_lq_fused_ops) lampo::register_lq_fused_ops(m);
}
