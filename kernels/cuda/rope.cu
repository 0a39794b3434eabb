// RoPE: one kernel for both directions and for q and k together; launcher (contract in rope.h).
//
// One block per (batch, position): the block stages that position's cos and sin rows in shared memory
// (fp32), then its threads walk every (head, pack of the first half) of q and then k, rotating the pair of
// 16-byte packs at i and i + D/2. Each element is read once and written once.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope.h"

namespace tigon::cuda {
namespace {

constexpr int kMaxThreads = 256;

template <typename T, int kVec>
__global__ void __launch_bounds__(kMaxThreads) rope_kernel(const RopeParams p) {
  extern __shared__ float table[];  // cos[0, D), sin[D, 2D)
  const int64_t position = static_cast<int64_t>(blockIdx.x) % p.seq_len;
  const int64_t batch = static_cast<int64_t>(blockIdx.x) / p.seq_len;
  const int64_t dim = p.head_dim, half = p.head_dim / 2;
  const T* cos = static_cast<const T*>(p.cos) + batch * p.cos_strides[0] + position * p.cos_strides[1];
  const T* sin = static_cast<const T*>(p.sin) + batch * p.sin_strides[0] + position * p.sin_strides[1];
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    table[d] = to_float(cos[d]);
    table[dim + d] = to_float(sin[d]);
  }
  __syncthreads();

  const int64_t packs_per_head = half / kVec;
  const int64_t units = (p.q.heads + p.k.heads) * packs_per_head;
  for (int64_t unit = threadIdx.x; unit < units; unit += blockDim.x) {
    int64_t head = unit / packs_per_head;
    const int64_t i0 = (unit - head * packs_per_head) * kVec;
    const bool is_q = head < p.q.heads;
    const RopeTensor& t = is_q ? p.q : p.k;
    if (!is_q) head -= p.q.heads;
    const T* in =
        static_cast<const T*>(t.in) + batch * t.in_strides[0] + head * t.in_strides[1] + position * t.in_strides[2];
    T* out = static_cast<T*>(t.out) + batch * t.out_strides[0] + head * t.out_strides[1] + position * t.out_strides[2];
    float x1[kVec], x2[kVec], y1[kVec], y2[kVec];
    load_floats<T, kVec>(in + i0, x1);
    load_floats<T, kVec>(in + half + i0, x2);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const int64_t i = i0 + e;
      const float c1 = table[i], c2 = table[half + i], s1 = table[dim + i], s2 = table[dim + half + i];
      if (!p.backward) {
        y1[e] = x1[e] * c1 - x2[e] * s1;
        y2[e] = x2[e] * c2 + x1[e] * s2;
      } else {  // transpose of the rotation
        y1[e] = x1[e] * c1 + x2[e] * s2;
        y2[e] = x2[e] * c2 - x1[e] * s1;
      }
    }
    store_floats<T, kVec>(out + i0, y1);
    store_floats<T, kVec>(out + half + i0, y2);
  }
}

bool tensor_aligned(const RopeTensor& t, int vec, int elem_size) {
  if (t.heads == 0) return true;
  const int bytes = vec * elem_size < 16 ? vec * elem_size : 16;
  bool ok = is_aligned(t.in, bytes) && is_aligned(t.out, bytes);
  for (int d = 0; d < 3; ++d) ok = ok && t.in_strides[d] % vec == 0 && t.out_strides[d] % vec == 0;
  return ok;
}

template <typename T>
cudaError_t launch(const RopeParams& p, cudaStream_t stream) {
  constexpr int kVec = kElemsPer16Bytes<T>;
  const int64_t half = p.head_dim / 2;
  const bool vectorize =
      half % kVec == 0 && tensor_aligned(p.q, kVec, sizeof(T)) && tensor_aligned(p.k, kVec, sizeof(T));
  const dim3 grid(static_cast<unsigned>(p.batch * p.seq_len));
  const size_t shared = 2 * static_cast<size_t>(p.head_dim) * sizeof(float);
  const int64_t heads = p.q.heads + p.k.heads;
  if (vectorize) {
    rope_kernel<T, kVec><<<grid, threads_for(heads * half / kVec, 2, kMaxThreads), shared, stream>>>(p);
  } else {
    rope_kernel<T, 1><<<grid, threads_for(heads * half, 2, kMaxThreads), shared, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

LaunchStatus rope_apply(const RopeParams& p, void* stream_ptr) {
  if (p.batch == 0 || p.seq_len == 0 || p.head_dim == 0 || p.q.heads + p.k.heads == 0) return cudaSuccess;
  if (p.head_dim % 2 != 0) return cudaErrorInvalidValue;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  return dispatch_float_type(p.dtype, [&](auto tag) { return launch<typename decltype(tag)::type>(p, stream); });
}

}  // namespace tigon::cuda
