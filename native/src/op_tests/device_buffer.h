// device_buffer.h - RAII device memory and numpy <-> device copies for the op test bindings.
#pragma once

#include <cstring>
#include <vector>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "kernels/common.cuh"

namespace lampo {

namespace py = pybind11;

// Owning device allocation (cudaMalloc / cudaFree).
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
        if (bytes_) LAMPO_CUDA_CHECK(cudaMalloc(&ptr_, bytes_));
    }
    ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) { if (ptr_) cudaFree(ptr_); ptr_ = o.ptr_; bytes_ = o.bytes_; o.ptr_ = nullptr; o.bytes_ = 0; }
        return *this;
    }
    template <class T> T* as() const { return static_cast<T*>(ptr_); }
    void* get() const { return ptr_; }
    size_t bytes() const { return bytes_; }

private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

// A new device buffer with every byte set to `byte`.
inline DeviceBuffer filled(size_t bytes, int byte) {
    DeviceBuffer b(bytes);
    if (bytes) LAMPO_CUDA_CHECK(cudaMemset(b.get(), byte, bytes));
    return b;
}

// Output buffers start as 0xFF bytes (NaN / -1), so a value a kernel fails to write shows up.
inline DeviceBuffer poisoned(size_t bytes) { return filled(bytes, 0xFF); }

// Copy a C-contiguous numpy array of element type T to a new device buffer.
// bf16 tensors travel as numpy uint16 (bit patterns), fp16 as numpy float16.
template <class T>
DeviceBuffer upload(const py::array_t<T, py::array::c_style | py::array::forcecast>& a) {
    DeviceBuffer buf(size_t(a.size()) * sizeof(T));
    if (a.size()) LAMPO_CUDA_CHECK(cudaMemcpy(buf.get(), a.data(), buf.bytes(), cudaMemcpyHostToDevice));
    return buf;
}

// Copy a device buffer (from element `offset` on) back into a new numpy array of the given shape.
template <class T>
py::array_t<T> download(const DeviceBuffer& buf, const std::vector<py::ssize_t>& shape, size_t offset = 0) {
    py::array_t<T> out(shape);
    size_t n = 1;
    for (auto s : shape) n *= size_t(s);
    if ((offset + n) * sizeof(T) > buf.bytes()) throw std::runtime_error("download: shape larger than the buffer");
    LAMPO_CUDA_CHECK(cudaDeviceSynchronize());
    if (n)
        LAMPO_CUDA_CHECK(cudaMemcpy(out.mutable_data(), buf.as<T>() + offset, n * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
}

}  // namespace lampo
