// GeGLU: y = gelu_tanh(a) * b on [rows, cols] (launchers; no CUDA or torch headers here).
//
// gelu_tanh(a) = 0.5 a (1 + tanh(u)), u = sqrt(2/pi) (a + 0.044715 a^3)  (GELU(approximate="tanh")).
// Forward reads a and b, writes y; nothing extra is saved (the op keeps a and b).
// Backward recomputes the activation:
//   gelu'(a) = 0.5 (1 + tanh(u)) + 0.5 a (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 a^2)
//   da = dy * b * gelu'(a),   db = dy * gelu_tanh(a)        (both =).
// da and db may each be dy, a or b itself (same pointer and row stride): every element is read before it
// is written, by the thread that writes it. Backward can also write h = gelu_tanh(a) * b (the optional h
// operand), bit for bit the forward's y.
// Same operand layout as SwiGLU (kernels/cuda/swiglu.h); fp32 math; 64-bit offsets.
#pragma once

#include <cstdint>

#include "kernels/cuda/dtype.h"
#include "kernels/cuda/swiglu.h"

namespace tigon::cuda {

LaunchStatus geglu_forward(const GluForwardParams& params, void* stream);
LaunchStatus geglu_backward(const GluBackwardParams& params, void* stream);

}  // namespace tigon::cuda
