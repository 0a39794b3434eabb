// The gated activations y = act(a) * b on [rows, cols] (launchers; no CUDA or torch headers here):
//   SwiGLU: act = silu,      silu(a) = a s, s = sigmoid(a),   silu'(a) = s (1 + a (1 - s))
//   GeGLU:  act = gelu_tanh, gelu_tanh(a) = 0.5 a (1 + tanh(u)), u = sqrt(2/pi) (a + 0.044715 a^3)
//           (GELU(approximate="tanh")), gelu'(a) = 0.5 (1 + tanh(u)) + 0.5 a (1 - tanh(u)^2) u'(a)
//
// Forward reads a and b, writes y; nothing extra is saved (the op keeps a and b).
// Backward recomputes the activation:
//   da = dy * b * act'(a),   db = dy * act(a)      (both =).
// da and db may each be dy, a or b itself (same pointer and row stride): every element is read before it
// is written, by the thread that writes it. Backward can also write h = act(a) * b, bit for bit the
// forward's y, into a sixth operand (which may likewise be dy, a or b): glu_linear takes the down
// projection's weight gradient from it instead of running the forward kernel again.
// Rows have unit stride inside and any row stride between them (a and b may be the two halves of one
// gate_up projection); fp32 math; 64-bit offsets.
#pragma once

#include <cstdint>

#include "kernels/cuda/dtype.h"

namespace tigon::cuda {

// One [rows, cols] operand: pointer and row stride in elements.
struct GluOperand {
  const void* data = nullptr;
  int64_t row_stride = 0;
};
struct GluOutput {
  void* data = nullptr;
  int64_t row_stride = 0;
};

struct GluForwardParams {
  GluOperand a, b;
  GluOutput y;
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kFloat32;  // a, b, y
};

struct GluBackwardParams {
  GluOperand dy, a, b;
  GluOutput da, db;
  GluOutput h;  // optional (data null: not written): act(a) * b as the forward computes it
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kFloat32;
};

LaunchStatus swiglu_forward(const GluForwardParams& params, void* stream);
LaunchStatus swiglu_backward(const GluBackwardParams& params, void* stream);
LaunchStatus geglu_forward(const GluForwardParams& params, void* stream);
LaunchStatus geglu_backward(const GluBackwardParams& params, void* stream);

}  // namespace tigon::cuda
