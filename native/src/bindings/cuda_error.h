// cuda_error.h - lampo::CudaError (kernels/common.cuh) as a module's Python exception `CudaError`
// (a RuntimeError subclass); both modules register it through this one function: lampo._native
// (bindings.cpp) and lampo._native_ops (op_tests/op_tests_module.cpp).
// The translator is module-local: each module turns a CudaError thrown by its own functions into
// its own class. A global translator (pybind11's registry is shared by every module of the
// process) would let the module imported last catch the other module's throws as well, since the
// two copies of lampo::CudaError (one per module, hidden visibility) still match by type name.
#pragma once

#include <exception>
#include <pybind11/pybind11.h>

#include "kernels/common.cuh"

namespace lampo {

inline void register_cuda_error(pybind11::module_& m) {
    static pybind11::exception<CudaError> cuda_error(m, "CudaError", PyExc_RuntimeError);
    pybind11::register_local_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const CudaError& e) {
            pybind11::set_error(cuda_error, e.what());
        }
    });
}

}  // namespace lampo
