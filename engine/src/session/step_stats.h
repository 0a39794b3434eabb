// How a step's statistics combine its forward-backward pass with its optimizer update.
#pragma once

#include <algorithm>

#include "tigon/engine.h"

namespace tigon::engine {

// `update` (an optimizer step's statistics) into `step` (the forward-backward pass before it): the step
// counter, gradient norm and learning rate of the update, no gradients left pending, the higher peaks.
// Wall time and tokens per second are the caller's to stamp over the whole call.
inline void MergeUpdateStats(const StepStats& update, StepStats* step) {
  step->step = update.step;
  step->grad_norm = update.grad_norm;
  step->lr = update.lr;
  step->accumulated_batches = 0;
  step->peak_allocated_bytes = std::max(step->peak_allocated_bytes, update.peak_allocated_bytes);
  step->peak_reserved_bytes = std::max(step->peak_reserved_bytes, update.peak_reserved_bytes);
}

}  // namespace tigon::engine
