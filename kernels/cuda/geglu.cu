// GeGLU: the activation and the entry points (contract in geglu.h); the kernels and their launchers are
// shared with the other gated activation (glu_common.cuh).
#include "kernels/cuda/glu_common.cuh"
#include "kernels/cuda/geglu.h"

namespace tigon::cuda {
namespace {

// gelu_tanh(a) = 0.5 a (1 + tanh(u)) = a * sigmoid(2u), u = sqrt(2/pi) (a + 0.044715 a^3): the sigmoid form
// has no cancellation for large negative a (1 + tanh(u) underflows gracefully), so fp32 stays within 1e-6.
// gelu'(a) = s + 2 a s (1 - s) u'(a), s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3 * 0.044715 a^2).
struct GeluTanh {
  static constexpr float kSqrt2OverPi = 0.7978845608028654f;
  static constexpr float kCubic = 0.044715f;
  __device__ __forceinline__ static float value(float a) {
    const float u = kSqrt2OverPi * (a + kCubic * a * a * a);
    return a / (1.f + expf(-2.f * u));
  }
  __device__ __forceinline__ static void value_and_grad(float a, float& value, float& grad) {
    const float u = kSqrt2OverPi * (a + kCubic * a * a * a);
    const float s = 1.f / (1.f + expf(-2.f * u));
    value = a * s;
    grad = s + 2.f * a * s * (1.f - s) * kSqrt2OverPi * (1.f + 3.f * kCubic * a * a);
  }
};

}  // namespace

LaunchStatus geglu_forward(const GluForwardParams& p, void* stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  return dispatch_float_type(p.dtype, [&](auto tag) {
    return glu::launch_forward<typename decltype(tag)::type, GeluTanh>(p, static_cast<cudaStream_t>(stream));
  });
}

LaunchStatus geglu_backward(const GluBackwardParams& p, void* stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  return dispatch_float_type(p.dtype, [&](auto tag) {
    return glu::launch_backward<typename decltype(tag)::type, GeluTanh>(p, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace tigon::cuda
