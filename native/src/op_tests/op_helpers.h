// op_helpers.h - the one set of helpers behind lampo._native_ops (ops_core_bindings.cpp,
// ops_gdn_moe_bindings.cpp): numpy argument types and checks, and the two ways an op call runs.
//
// Arguments: every function takes Arr<T> (C-contiguous, force-cast numpy arrays; bf16 travels as
// uint16 bit patterns). A bad argument raises std::invalid_argument (ValueError in Python) through
// require (kernels/launch_utils.cuh), worded "<op>: <argument> must ..., got ...":
//   check_ndim   "<name> must have N dims, got shape (...)"
//   check_shape  "<name> must have shape (...), got (...)"
//   check_dim    "<name>: <what> must be W, got G"          (one extent or a size)
//   check_ids_below  "expert id I out of range [0, E)"
//
// Running (each form is part of its functions' behaviour, and the timings the tests print were
// measured that way):
//   OpStream + time_graph: the core ops (ops_core_bindings.cpp) run on a private stream; their
//     bench_* functions time a captured CUDA graph (which also checks that a launcher captures).
//   run_op (+ mean_launch_ms): the GDN / MoE ops (ops_gdn_moe_bindings.cpp) run on the default
//     stream; with repeat = N > 0 the launch runs N more times after the outputs were read, each
//     after evicting L2, and the mean ms per run is appended to the returned tuple.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "kernels/launch_utils.cuh"
#include "op_tests/device_buffer.h"

namespace lampo {

namespace py = pybind11;

// ---- arguments ------------------------------------------------------------------------------------

template <class T>
using Arr = py::array_t<T, py::array::c_style | py::array::forcecast>;
using Shape = std::vector<py::ssize_t>;

inline std::string shape_str(const Shape& s) {
    std::string out = "(";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + (s.size() == 1 ? ",)" : ")");
}

inline Shape shape_of(const py::array& a) { return Shape(a.shape(), a.shape() + a.ndim()); }

inline void check_ndim(const char* op, const char* name, const py::array& a, int ndim) {
    require(a.ndim() == ndim, op, std::string(name) + " must have " + std::to_string(ndim) + " dims, got shape " +
                                      shape_str(shape_of(a)));
}

inline void check_shape(const char* op, const char* name, const py::array& a, const Shape& want) {
    require(shape_of(a) == want, op,
            std::string(name) + " must have shape " + shape_str(want) + ", got " + shape_str(shape_of(a)));
}

inline void check_dim(const char* op, const char* name, py::ssize_t got, py::ssize_t want, const char* what) {
    require(got == want, op, std::string(name) + ": " + what + " must be " + std::to_string(want) + ", got " +
                                 std::to_string(got));
}

inline void check_ids_below(const char* op, const Arr<int32_t>& ids, int E) {
    const int32_t* p = ids.data();
    for (py::ssize_t i = 0; i < ids.size(); ++i)
        require(p[i] >= 0 && p[i] < E, op,
                "expert id " + std::to_string(p[i]) + " out of range [0, " + std::to_string(E) + ")");
}

// Copies of a weight buffer of `bytes` (every byte `byte`) for a timing loop to rotate through, so
// the matrix is never served from L2: at least three L2s in all, at most 8 copies.
inline std::vector<DeviceBuffer> l2_rotating_copies(size_t bytes, int byte) {
    const size_t l2 = size_t(device_attribute(cudaDevAttrL2CacheSize));
    const size_t copies = std::min<size_t>(8, std::max<size_t>(1, (3 * l2 + bytes - 1) / bytes));
    std::vector<DeviceBuffer> out;
    for (size_t i = 0; i < copies; ++i) out.push_back(filled(bytes, byte));
    return out;
}

// A device int32 holding v (positions, step counters: launchers read them from device memory).
inline DeviceBuffer device_int(int32_t v) {
    DeviceBuffer b(sizeof(int32_t));
    LAMPO_CUDA_CHECK(cudaMemcpy(b.get(), &v, sizeof(v), cudaMemcpyHostToDevice));
    return b;
}

// ---- the core ops: a private stream, graph timing ------------------------------------------------

// A private stream for one op call; synchronised and destroyed on scope exit. It is created after
// a device synchronisation: the uploads and poisoned / filled buffers made before it went through
// the default stream, which a non-blocking stream does not wait for.
struct OpStream {
    cudaStream_t s{};
    OpStream() {
        LAMPO_CUDA_CHECK(cudaDeviceSynchronize());
        LAMPO_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    }
    ~OpStream() {
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
    }
    OpStream(const OpStream&) = delete;
    OpStream& operator=(const OpStream&) = delete;
    void finish(const char* op) {
        LAMPO_CHECK_LAUNCH(op);
        LAMPO_CUDA_CHECK(cudaStreamSynchronize(s));
    }
};

// Captures `iters` calls of launch(i, stream) into one graph, replays it once to warm up, then
// returns the mean microseconds per call of a second replay.
template <class Launch>
double time_graph(int iters, Launch launch) {
    OpStream st;
    cudaGraph_t graph{};
    cudaGraphExec_t exec{};
    LAMPO_CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < iters; ++i) launch(i, st.s);
    LAMPO_CUDA_CHECK(cudaStreamEndCapture(st.s, &graph));
    LAMPO_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t a, b;
    LAMPO_CUDA_CHECK(cudaEventCreate(&a));
    LAMPO_CUDA_CHECK(cudaEventCreate(&b));
    LAMPO_CUDA_CHECK(cudaGraphLaunch(exec, st.s));
    LAMPO_CUDA_CHECK(cudaEventRecord(a, st.s));
    LAMPO_CUDA_CHECK(cudaGraphLaunch(exec, st.s));
    LAMPO_CUDA_CHECK(cudaEventRecord(b, st.s));
    LAMPO_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    LAMPO_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return double(ms) * 1000.0 / iters;
}

// ---- the GDN / MoE ops: the default stream, `repeat` timing ---------------------------------------

// Mean time of `launch` over `repeat` cold-L2 runs, in ms.
template <class Launch>
double mean_launch_ms(const char* op, Launch&& launch, int repeat) {
    DeviceBuffer flush(size_t(256) << 20);
    cudaEvent_t start, stop;
    LAMPO_CUDA_CHECK(cudaEventCreate(&start));
    LAMPO_CUDA_CHECK(cudaEventCreate(&stop));
    double total = 0.0;
    for (int i = 0; i < repeat; ++i) {
        LAMPO_CUDA_CHECK(cudaMemsetAsync(flush.get(), i & 0xff, flush.bytes(), 0));
        LAMPO_CUDA_CHECK(cudaEventRecord(start, 0));
        launch();
        LAMPO_CHECK_LAUNCH(op);
        LAMPO_CUDA_CHECK(cudaEventRecord(stop, 0));
        LAMPO_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0.f;
        LAMPO_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        total += ms;
    }
    LAMPO_CUDA_CHECK(cudaEventDestroy(start));
    LAMPO_CUDA_CHECK(cudaEventDestroy(stop));
    return total / repeat;
}

// Runs `launch` once (checked), lets `collect` download the outputs into a list, then appends
// the timing when asked; returns the list as a tuple.
template <class Launch, class Collect>
py::tuple run_op(const char* op, int repeat, Launch&& launch, Collect&& collect) {
    require(repeat >= 0, op, "repeat must be >= 0");
    launch();
    LAMPO_CHECK_LAUNCH(op);
    LAMPO_CUDA_CHECK(cudaDeviceSynchronize());
    py::list out;
    collect(out);
    if (repeat > 0) out.append(mean_launch_ms(op, launch, repeat));
    return py::tuple(out);
}

// Returns the single output itself when no timing was asked for.
inline py::object single_or_tuple(py::tuple t) { return t.size() == 1 ? py::object(t[0]) : py::object(t); }

}  // namespace lampo
