// sum(x^2) in fp64: grid-stride 16-byte loads, per-thread fp64 accumulation (exact squares of bf16/fp16/
// fp32 values), fixed-order block and final reductions. Floor for 8e9 bf16 elements: 16 GB = 3.7 ms.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/squared_norm.h"

namespace tigon::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) squared_norm_partials_kernel(const T* __restrict__ x, int64_t n,
                                                                         double* __restrict__ partials) {
  constexpr int kN = kElemsPer16Bytes<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t packs = kVec ? n / kN : 0;
  double acc = 0.0;
  for (int64_t i = first; i < packs; i += stride) {
    float v[kN];
    load_floats<T, kN>(x + i * kN, v);
#pragma unroll
    for (int k = 0; k < kN; ++k) acc = fma(static_cast<double>(v[k]), static_cast<double>(v[k]), acc);
  }
  for (int64_t j = packs * kN + first; j < n; j += stride) {
    const double v = static_cast<double>(to_float(x[j]));
    acc = fma(v, v, acc);
  }
  __shared__ double scratch[32];
  const double total = block_reduce_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kMaxBlocks) sum_partials_kernel(const double* __restrict__ partials, int64_t count,
                                                                  double* __restrict__ out) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  __shared__ double scratch[32];
  const double total = block_reduce_sum(acc, scratch);
  if (threadIdx.x == 0) out[0] = total;
}

}  // namespace

int64_t squared_norm_partials(int64_t n) {
  const int64_t blocks = (n + kThreads * 8 - 1) / (kThreads * 8);
  return blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

LaunchStatus squared_norm(const SquaredNormParams& p, void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t blocks = squared_norm_partials(p.n);
  const cudaError_t status = dispatch_float_type(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(p.x);
    if (is_aligned(x, 16)) {
      squared_norm_partials_kernel<T, true><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, p.n, p.partials);
    } else {
      squared_norm_partials_kernel<T, false><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, p.n, p.partials);
    }
    return cudaGetLastError();
  });
  if (status != cudaSuccess) return static_cast<LaunchStatus>(status);
  const int threads = threads_for(blocks, 1, static_cast<int>(kMaxBlocks));
  sum_partials_kernel<<<1, threads, 0, stream>>>(p.partials, blocks, p.out);
  return static_cast<LaunchStatus>(cudaGetLastError());
}

}  // namespace tigon::cuda
