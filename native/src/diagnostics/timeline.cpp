// timeline.cpp - host side of timeline.h: the registry of per-unit buffer setters, the recording
// buffer, and the launch names of the last forward pass of each token count.
#include "diagnostics/timeline.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "kernels/launch_utils.cuh"

namespace lampo {
namespace {

std::vector<TimelineBind>& binders() {
    static std::vector<TimelineBind> list;
    return list;
}

struct Recording {
    void* events = nullptr;
    void* counts = nullptr;
    uint32_t per_sm = 0, sms = 0;
};
Recording g_rec;

struct LaunchNames {
    std::string op = "engine";
    std::map<int, std::vector<std::string>> by_tokens;
    std::vector<std::string>* current = nullptr;  // the pass being launched (none before the first)
};
LaunchNames g_names;

void bind_all(const TimelineBuffer& b) {
    for (TimelineBind bind : binders()) bind(b);
}

}  // namespace

bool timeline_register(TimelineBind bind) {
    binders().push_back(bind);
    return true;
}

void timeline_start(uint32_t per_sm) {
    if (!timeline_built())
        throw std::runtime_error("timeline_start: lampo._native was built without LAMPO_TIMELINE=ON");
    if (g_rec.events) throw std::runtime_error("timeline_start: a timeline is already recording");
    if (per_sm == 0) throw std::invalid_argument("timeline_start: per_sm must be > 0");
    g_rec.sms = uint32_t(sm_count());
    g_rec.per_sm = per_sm;
    LAMPO_CUDA_CHECK(cudaMalloc(&g_rec.events, size_t(g_rec.sms) * per_sm * sizeof(TimelineEvent)));
    LAMPO_CUDA_CHECK(cudaMalloc(&g_rec.counts, size_t(g_rec.sms) * sizeof(uint32_t)));
    LAMPO_CUDA_CHECK(cudaMemset(g_rec.counts, 0, size_t(g_rec.sms) * sizeof(uint32_t)));
    LAMPO_CUDA_CHECK(cudaDeviceSynchronize());
    bind_all({static_cast<TimelineEvent*>(g_rec.events), static_cast<uint32_t*>(g_rec.counts), per_sm, g_rec.sms});
}

std::vector<TimelineEvent> timeline_stop() {
    if (!g_rec.events) throw std::runtime_error("timeline_stop: no timeline is recording");
    LAMPO_CUDA_CHECK(cudaDeviceSynchronize());
    bind_all({nullptr, nullptr, 0, 0});
    std::vector<uint32_t> counts(g_rec.sms);
    LAMPO_CUDA_CHECK(cudaMemcpy(counts.data(), g_rec.counts, counts.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    std::vector<TimelineEvent> out;  // only the used head of each SM's slice comes back
    const TimelineEvent* events = static_cast<const TimelineEvent*>(g_rec.events);
    for (uint32_t s = 0; s < g_rec.sms; ++s) {
        const size_t at = out.size(), n = std::min(counts[s], g_rec.per_sm);  // events past per_sm were dropped
        out.resize(at + n);
        if (n)
            LAMPO_CUDA_CHECK(cudaMemcpy(out.data() + at, events + size_t(s) * g_rec.per_sm, n * sizeof(TimelineEvent),
                                        cudaMemcpyDeviceToHost));
    }
    LAMPO_CUDA_CHECK(cudaFree(g_rec.events));
    LAMPO_CUDA_CHECK(cudaFree(g_rec.counts));
    g_rec = Recording{};
    return out;
}

void timeline_forward_begin(int tokens) {
    g_names.op = "engine";
    g_names.current = &g_names.by_tokens[tokens];
    g_names.current->clear();
}

void timeline_note_op(const char* name) { g_names.op = name; }

void timeline_note_launch(const char* launcher) {
    if (g_names.current) g_names.current->push_back(g_names.op + ": " + launcher);
}

std::vector<std::string> timeline_launches(int tokens) {
    const auto it = g_names.by_tokens.find(tokens);
    return it == g_names.by_tokens.end() ? std::vector<std::string>{} : it->second;
}

}  // namespace lampo
