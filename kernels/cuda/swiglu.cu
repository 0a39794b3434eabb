// SwiGLU: the activation and the entry points (contract in swiglu.h); the kernels and their launchers are
// shared with the other gated activation (glu_common.cuh).
#include "kernels/cuda/glu_common.cuh"
#include "kernels/cuda/swiglu.h"

namespace tigon::cuda {
namespace {

// silu(a) = a * sigmoid(a); silu'(a) = s (1 + a (1 - s)). expf keeps fp32 within 1e-6 relative.
struct SiLU {
  __device__ __forceinline__ static float value(float a) { return a / (1.f + expf(-a)); }
  __device__ __forceinline__ static void value_and_grad(float a, float& value, float& grad) {
    const float s = 1.f / (1.f + expf(-a));
    value = a * s;
    grad = s * (1.f + a * (1.f - s));
  }
};

}  // namespace

LaunchStatus swiglu_forward(const GluForwardParams& p, void* stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  return dispatch_float_type(p.dtype, [&](auto tag) {
    return glu::launch_forward<typename decltype(tag)::type, SiLU>(p, static_cast<cudaStream_t>(stream));
  });
}

LaunchStatus swiglu_backward(const GluBackwardParams& p, void* stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  return dispatch_float_type(p.dtype, [&](auto tag) {
    return glu::launch_backward<typename decltype(tag)::type, SiLU>(p, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace tigon::cuda
