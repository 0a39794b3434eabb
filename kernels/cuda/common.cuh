// Shared by the CUDA kernels: dtype tags, vector loads, warp/block reductions, launch checks.
// CUDA headers only: nothing here knows about torch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/dtype.h"

// ---- Element conversion, 16-byte packs, block reductions, two-stage column sums ------------------------
// (norm, RoPE and GLU kernels; all math in fp32.)
namespace tigon::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// Rounds through T and back: what a value looks like after being stored as T.
template <typename T>
__device__ __forceinline__ float round_to(float x) { return to_float(from_float<T>(x)); }

// kN elements moved as one access (16 bytes at most per instruction; wider packs split into 16-byte ones).
template <typename T, int kN>
struct alignas(sizeof(T) * kN < 16 ? sizeof(T) * kN : 16) Pack {
  T v[kN];
};

template <typename T, int kN>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[kN]) {
  const Pack<T, kN> pack = *reinterpret_cast<const Pack<T, kN>*>(p);
#pragma unroll
  for (int i = 0; i < kN; ++i) out[i] = to_float(pack.v[i]);
}

template <typename T, int kN>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[kN]) {
  Pack<T, kN> pack;
#pragma unroll
  for (int i = 0; i < kN; ++i) pack.v[i] = from_float<T>(in[i]);
  *reinterpret_cast<Pack<T, kN>*>(p) = pack;
}

// Elements of T per 16-byte access.
template <typename T>
constexpr int kElemsPer16Bytes = 16 / static_cast<int>(sizeof(T));

__host__ __device__ __forceinline__ bool is_aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Sums over a warp and over the whole block, for float (norms) and double (gradient norms) alike.
template <typename T>
__device__ __forceinline__ T warp_reduce_sum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the whole block, returned to every thread, in a fixed order (deterministic). blockDim.x must
// be a multiple of 32; `scratch` is 32 T of shared memory, reusable right after the call returns.
template <typename T>
__device__ __forceinline__ T block_reduce_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  v = warp_reduce_sum(v);
  __syncthreads();  // the previous call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_reduce_sum(lane < num_warps ? scratch[lane] : T(0));
}

// Second stage of a deterministic two-stage reduction: out[c] = sum_r partials[r, c] over
// partials [num_rows, cols] (fp32, contiguous), summed in a fixed order. Launch with
// block (32, kColumnSumRowsPerBlock) and grid (ceil(cols / 32)).
constexpr int kColumnSumRowsPerBlock = 16;

template <typename Out>
__global__ void column_sum_kernel(const float* __restrict__ partials, int64_t num_rows, int64_t cols,
                                  Out* __restrict__ out) {
  __shared__ float sums[kColumnSumRowsPerBlock][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.f;
  if (col < cols) {
    for (int64_t r = threadIdx.y; r < num_rows; r += kColumnSumRowsPerBlock) acc += partials[r * cols + col];
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.f;
#pragma unroll
    for (int r = 0; r < kColumnSumRowsPerBlock; ++r) total += sums[r][threadIdx.x];
    out[col] = from_float<Out>(total);
  }
}

template <typename Out>
inline cudaError_t launch_column_sum(const float* partials, int64_t num_rows, int64_t cols, Out* out,
                                     cudaStream_t stream) {
  const dim3 block(32, kColumnSumRowsPerBlock);
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32));
  column_sum_kernel<Out><<<grid, block, 0, stream>>>(partials, num_rows, cols, out);
  return cudaGetLastError();
}

// Streaming multiprocessors of the current device (cached per device).
inline int current_device_sm_count() {
  static int counts[64] = {0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 132;
  if (counts[device] == 0) {
    int count = 0;
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    counts[device] = count > 0 ? count : 132;
  }
  return counts[device];
}

// Blocks for a kernel whose blocks stride over `rows` rows: blocks_per_sm per SM, but no more than one per
// row (and at least one).
inline int64_t num_row_blocks(int64_t rows, int blocks_per_sm) {
  const int64_t blocks = static_cast<int64_t>(current_device_sm_count()) * blocks_per_sm;
  return rows < blocks ? (rows > 0 ? rows : 1) : blocks;
}

// Whether rows of `elem_size`-byte elements at p (null: absent, always fine), `row_stride` elements apart,
// can be read in packs of `vec` elements.
inline bool rows_aligned(const void* p, int64_t row_stride, int vec, int elem_size) {
  return p == nullptr || (is_aligned(p, vec * elem_size < 16 ? vec * elem_size : 16) && row_stride % vec == 0);
}

}  // namespace tigon::cuda

// ---- Runtime dtype -> template type (one switch per launcher) ------------------------------------------
namespace tigon::cuda {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<float | __nv_bfloat16 | __half>{}) for `dtype`.
template <typename F>
inline cudaError_t dispatch_float_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(TypeTag<float>{});
    case DType::kBFloat16: return f(TypeTag<__nv_bfloat16>{});
    case DType::kFloat16: return f(TypeTag<__half>{});
  }
  return cudaErrorInvalidValue;
}

// Threads for a block that covers `units` work items with about `per_thread` each: a multiple of 32 in
// [32, max_threads].
inline int threads_for(int64_t units, int per_thread, int max_threads) {
  int64_t threads = (units + per_thread - 1) / per_thread;
  threads = (threads + 31) / 32 * 32;
  if (threads < 32) threads = 32;
  if (threads > max_threads) threads = max_threads;
  return static_cast<int>(threads);
}

}  // namespace tigon::cuda
