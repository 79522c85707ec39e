// nonfinite_scan.h - the NaN/Inf census of the weights in VRAM, run once when loading finishes
// (nonfinite_scan.cu), so that a checkpoint holding non-finite values is refused at load, naming
// the tensor, instead of failing at the first reply.
#pragma once

#include <vector>

#include "weights/weights.h"

namespace lampo {

struct NonFiniteCount {
    unsigned long long count;  // NaN and +-Inf values in the tensor as stored in VRAM
    unsigned long long first;  // flat (C-order) index of the first of them (LQ: of its scale in the
                               // scales [.., N, K/64]); ~0ull when count == 0
};

// One entry per slot, in slot order: each slot (a tensor of its own block, or one part of a fused
// block, without the zero padding rows) is counted into one small device array, which is read back
// once. Runs on a stream of its own and waits for it; the weights must have landed
// (WeightStore::finish_loading).
std::vector<NonFiniteCount> count_nonfinite(const std::vector<TensorSlot>& slots);

}  // namespace lampo
