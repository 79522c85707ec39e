// timeline.h - block-level timestamps of the decode step's kernels, for seeing how the PDL chain
// overlaps (no profiler can: Nsight Compute serialises kernels). Compiled in only with the CMake
// option LAMPO_TIMELINE=ON (a diagnostic build; the default build has none of it).
//
// Every kernel marks, from thread 0 of each block, when the block started (before pdl_begin's
// wait) and when its wait returned, i.e. when the kernel before it had completed; a kernel may add
// marks of its own (the MoE gate_up marks when its experts are known). An event is
// {globaltimer ns, %gridid, block, SM, stage, warp}; %gridid is one per graph node, the same in every
// replay, so record one step at a time. Events go to per-SM slices of one device buffer, so
// blocks of different SMs never contend for a counter.
// The host side also keeps the name of every launch of the last one-token forward pass in order
// (model_forward and launch_pdl note them), so a script can name each launch
// (tests/gpu/timeline.py).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lampo {

enum TimelineStage : uint8_t { TL_ENTRY = 0, TL_RELEASED = 1, TL_SELECTED = 2, TL_STAGED = 3, TL_DONE = 4 };

struct TimelineEvent {
    uint64_t time_ns;
    uint64_t grid_id;
    uint32_t block;  // blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)
    uint16_t sm;
    uint8_t stage;
    uint8_t warp;  // a warp's mark (timeline_mark_warp): its index in the block; else 0
};
static_assert(sizeof(TimelineEvent) == 24, "the Python reader assumes 24-byte events");

// Where the marks go (all zero while no timeline is recording).
struct TimelineBuffer {
    TimelineEvent* events;  // [SMs][per_sm]
    uint32_t* counts;       // [SMs]
    uint32_t per_sm;
    uint32_t sms;           // SM ids below this are recorded (%smid need not stay below the SM count)
};

constexpr bool timeline_built() {
#ifdef LAMPO_TIMELINE
    return true;
#else
    return false;
#endif
}

// Every CUDA translation unit registers the setter of its own copy of the device-side buffer view.
using TimelineBind = void (*)(const TimelineBuffer&);
bool timeline_register(TimelineBind bind);

// Start recording (up to per_sm events per SM), stop and read the events back (in SM order).
void timeline_start(uint32_t per_sm);
std::vector<TimelineEvent> timeline_stop();

// Launch names of the last forward pass of `tokens` tokens (a decode step: 1, a verify window:
// its rows) and the launches after it (the sampler), in launch order: "<model op>: <launcher>"
// (launch_pdl notes every decode-step launch).
void timeline_forward_begin(int tokens);
void timeline_note_op(const char* name);
void timeline_note_launch(const char* launcher);
std::vector<std::string> timeline_launches(int tokens);

}  // namespace lampo
