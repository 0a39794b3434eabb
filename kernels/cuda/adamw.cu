// AdamW over flat buffers: one grid-stride kernel, 8 elements per thread per step (16-byte loads for
// bf16/fp16, two for fp32) when every buffer is aligned, scalar otherwise. With grad_square_partials, each
// thread also sums its gradients' exact fp64 squares and each block writes its total (fixed order:
// deterministic for a given device and length).
// Floor for 1.2e9 bf16 elements (param, grad, m, v read; param, m, v written): 16.8 GB = 3.9 ms at 4.3 TB/s.
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/common.cuh"

namespace tigon::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kN = 8;

template <typename T>
struct alignas(sizeof(T) * kN) Pack8 {
  T v[kN];
};

// No copy requested.
struct NoCopy {};

// One element of torch.optim.AdamW's single-tensor update, in its op order, in fp32, with the roundings
// spelled out (the same as the CPU path): lerp and addcmul as one FMA each, addcdiv as
// self + (value * t1) / t2, IEEE sqrt and division.
__device__ __forceinline__ void adamw_update(float& p, float g, float& m, float& v, const AdamWParams& a) {
  g = __fmul_rn(g, a.grad_scale);
  p = __fmul_rn(p, a.decay_factor);
  const float w = a.one_minus_beta1;
  m = w < 0.5f ? fmaf(w, g - m, m) : fmaf(w - 1.f, g - m, g);
  v = fmaf(__fmul_rn(a.one_minus_beta2, g), g, __fmul_rn(v, a.beta2));
  const float denom = __fadd_rn(__fdiv_rn(sqrtf(v), a.bias_correction2_sqrt), a.eps);
  p = __fadd_rn(p, __fdiv_rn(__fmul_rn(-a.step_size, m), denom));
}

// Block 0 also zeroes the entries past the last block, so the caller never has to clear the buffer.
__device__ __forceinline__ void write_grad_square_partial(double acc, double* partials) {
  __shared__ double scratch[32];
  const double total = block_reduce_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
  if (blockIdx.x == 0) {
    for (int64_t i = gridDim.x + threadIdx.x; i < kAdamWGradSquarePartials; i += kThreads) partials[i] = 0.0;
  }
}

template <typename P, typename G, typename S, typename C, bool kVec, bool kSquares>
__global__ void __launch_bounds__(kThreads) adamw_step_kernel(const AdamWParams a) {
  P* param = static_cast<P*>(a.param);
  const G* grad = static_cast<const G*>(a.grad);
  S* exp_avg = static_cast<S*>(a.exp_avg);
  S* exp_avg_sq = static_cast<S*>(a.exp_avg_sq);
  C* copy = static_cast<C*>(a.param_copy);
  constexpr bool kCopy = !std::is_same<C, NoCopy>::value;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t n_packs = kVec ? a.n / kN : 0;
  [[maybe_unused]] double squares = 0.0;
  for (int64_t i = first; i < n_packs; i += stride) {
    Pack8<P> p = reinterpret_cast<const Pack8<P>*>(param)[i];
    const Pack8<G> g = reinterpret_cast<const Pack8<G>*>(grad)[i];
    Pack8<S> m = reinterpret_cast<const Pack8<S>*>(exp_avg)[i];
    Pack8<S> v = reinterpret_cast<const Pack8<S>*>(exp_avg_sq)[i];
    [[maybe_unused]] Pack8<typename std::conditional<kCopy, C, P>::type> c;
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      float pf = to_float(p.v[k]), mf = to_float(m.v[k]), vf = to_float(v.v[k]);
      const float gf = to_float(g.v[k]);
      if constexpr (kSquares) squares = fma(static_cast<double>(gf), static_cast<double>(gf), squares);
      adamw_update(pf, gf, mf, vf, a);
      p.v[k] = from_float<P>(pf);
      m.v[k] = from_float<S>(mf);
      v.v[k] = from_float<S>(vf);
      if constexpr (kCopy) c.v[k] = from_float<C>(pf);
    }
    reinterpret_cast<Pack8<P>*>(param)[i] = p;
    reinterpret_cast<Pack8<S>*>(exp_avg)[i] = m;
    reinterpret_cast<Pack8<S>*>(exp_avg_sq)[i] = v;
    if constexpr (kCopy) reinterpret_cast<Pack8<C>*>(copy)[i] = c;
  }
  for (int64_t j = n_packs * kN + first; j < a.n; j += stride) {
    float pf = to_float(param[j]), mf = to_float(exp_avg[j]), vf = to_float(exp_avg_sq[j]);
    const float gf = to_float(grad[j]);
    if constexpr (kSquares) squares = fma(static_cast<double>(gf), static_cast<double>(gf), squares);
    adamw_update(pf, gf, mf, vf, a);
    param[j] = from_float<P>(pf);
    exp_avg[j] = from_float<S>(mf);
    exp_avg_sq[j] = from_float<S>(vf);
    if constexpr (kCopy) copy[j] = from_float<C>(pf);
  }
  if constexpr (kSquares) write_grad_square_partial(squares, a.grad_square_partials);
}

bool aligned(const void* p, int64_t bytes) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0; }

int64_t dtype_size(DType d) { return d == DType::kFloat32 ? 4 : 2; }

template <typename P, typename G, typename S, typename C>
LaunchStatus launch(const AdamWParams& a, cudaStream_t stream) {
  const bool vec = aligned(a.param, dtype_size(a.param_dtype) * kN) && aligned(a.grad, dtype_size(a.grad_dtype) * kN) &&
                   aligned(a.exp_avg, dtype_size(a.state_dtype) * kN) &&
                   aligned(a.exp_avg_sq, dtype_size(a.state_dtype) * kN) &&
                   aligned(a.param_copy, dtype_size(a.param_copy_dtype) * kN);
  const bool squares = a.grad_square_partials != nullptr;
  auto kernel = vec ? (squares ? adamw_step_kernel<P, G, S, C, true, true> : adamw_step_kernel<P, G, S, C, true, false>)
                    : (squares ? adamw_step_kernel<P, G, S, C, false, true> : adamw_step_kernel<P, G, S, C, false, false>);
  // A grid-stride loop wants exactly the blocks that are resident at once (a second wave would start late
  // and finish alone).
  int device = 0, sms = 132, per_sm = 4;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
  const int64_t work = vec ? (a.n + kN - 1) / kN : a.n;
  int64_t blocks = (work + kThreads - 1) / kThreads;
  const int64_t resident = static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  if (blocks > resident) blocks = resident;
  if (blocks > kAdamWGradSquarePartials) blocks = kAdamWGradSquarePartials;
  if (blocks < 1) blocks = 1;
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  return static_cast<LaunchStatus>(cudaGetLastError());
}

template <typename P, typename G, typename S>
LaunchStatus dispatch_copy(const AdamWParams& a, cudaStream_t stream) {
  if (a.param_copy == nullptr) return launch<P, G, S, NoCopy>(a, stream);
  switch (a.param_copy_dtype) {
    case DType::kFloat32:
      return launch<P, G, S, float>(a, stream);
    case DType::kBFloat16:
      return launch<P, G, S, __nv_bfloat16>(a, stream);
    case DType::kFloat16:
      return launch<P, G, S, __half>(a, stream);
  }
  return static_cast<LaunchStatus>(cudaErrorInvalidValue);
}

template <typename P, typename S>
LaunchStatus dispatch_grad(const AdamWParams& a, cudaStream_t stream) {
  switch (a.grad_dtype) {
    case DType::kFloat32:
      return dispatch_copy<P, float, S>(a, stream);
    case DType::kBFloat16:
      return dispatch_copy<P, __nv_bfloat16, S>(a, stream);
    case DType::kFloat16:
      return dispatch_copy<P, __half, S>(a, stream);
  }
  return static_cast<LaunchStatus>(cudaErrorInvalidValue);
}

template <typename P>
LaunchStatus dispatch_param(const AdamWParams& a, cudaStream_t stream) {
  if (a.state_dtype == DType::kFloat32) return dispatch_grad<P, float>(a, stream);
  if (a.state_dtype == a.param_dtype) return dispatch_grad<P, P>(a, stream);
  return static_cast<LaunchStatus>(cudaErrorInvalidValue);
}

}  // namespace

LaunchStatus adamw_step(const AdamWParams& params, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (params.n == 0) {
    if (params.grad_square_partials == nullptr) return 0;
    return static_cast<LaunchStatus>(
        cudaMemsetAsync(params.grad_square_partials, 0, kAdamWGradSquarePartials * sizeof(double), s));
  }
  switch (params.param_dtype) {
    case DType::kFloat32:
      return dispatch_param<float>(params, s);
    case DType::kBFloat16:
      return dispatch_param<__nv_bfloat16>(params, s);
    case DType::kFloat16:
      return dispatch_param<__half>(params, s);
  }
  return static_cast<LaunchStatus>(cudaErrorInvalidValue);
}

}  // namespace tigon::cuda
