// RoPE: one kernel for both directions and for q and k together; launcher (contract in rope.h).
//
// Each block takes a run of consecutive (batch, position) rows, enough for about 8 units per thread (a unit
// is one 16-byte pack of a head's first half and its partner pack in the second half). The block stages
// its rows' cos and sin (fp32) and their base offsets in shared memory once, then its threads walk every
// unit of those rows; consecutive threads take consecutive packs of consecutive heads, so a warp reads and
// writes contiguous bytes when heads are contiguous ([B, T, H, D] projections). Each element is read once
// and written once. (One block per row, as before, left the 1B shapes at 4.7x the memory floor: 160
// threads moving 5 KB per block behind a barrier.)
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope.h"

namespace tigon::cuda {
namespace {

constexpr int kMaxThreads = 256;
constexpr int kUnitsPerBlock = kMaxThreads * 8;

// Shared memory of a block of `rows` rows: cos and sin rows, then 4 base offsets per row.
size_t shared_bytes(int rows, int64_t head_dim) {
  return static_cast<size_t>(rows) * (2 * static_cast<size_t>(head_dim) * sizeof(float) + 4 * sizeof(int64_t));
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kMaxThreads) rope_kernel(const RopeParams p, int rows_per_block) {
  extern __shared__ float smem[];
  const int dim = static_cast<int>(p.head_dim), half = dim / 2;
  float* table = smem;  // row r: cos at [2 r dim, 2 r dim + dim), sin after it
  // 8-byte aligned: 2 * rows_per_block * dim floats is a multiple of 2 floats.
  int64_t* bases = reinterpret_cast<int64_t*>(smem + 2 * static_cast<int64_t>(rows_per_block) * dim);
  const int64_t total_rows = p.batch * p.seq_len;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int rows = static_cast<int>(min(static_cast<int64_t>(rows_per_block), total_rows - first_row));
  const T* cos = static_cast<const T*>(p.cos);
  const T* sin = static_cast<const T*>(p.sin);
  for (int idx = threadIdx.x; idx < rows * dim; idx += blockDim.x) {
    const int r = idx / dim, d = idx - r * dim;
    const int64_t row = first_row + r, b = row / p.seq_len, t = row - b * p.seq_len;
    table[2 * r * dim + d] = to_float(cos[b * p.cos_strides[0] + t * p.cos_strides[1] + d]);
    table[2 * r * dim + dim + d] = to_float(sin[b * p.sin_strides[0] + t * p.sin_strides[1] + d]);
  }
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t row = first_row + r, b = row / p.seq_len, t = row - b * p.seq_len;
    bases[4 * r + 0] = b * p.q.in_strides[0] + t * p.q.in_strides[2];
    bases[4 * r + 1] = b * p.q.out_strides[0] + t * p.q.out_strides[2];
    bases[4 * r + 2] = b * p.k.in_strides[0] + t * p.k.in_strides[2];
    bases[4 * r + 3] = b * p.k.out_strides[0] + t * p.k.out_strides[2];
  }
  __syncthreads();

  const int packs_per_head = half / kVec;
  const int q_heads = static_cast<int>(p.q.heads);
  const int units = (q_heads + static_cast<int>(p.k.heads)) * packs_per_head;
  for (int local = threadIdx.x; local < rows * units; local += blockDim.x) {
    const int r = local / units, unit = local - r * units;
    int head = unit / packs_per_head;
    const int i0 = (unit - head * packs_per_head) * kVec;
    const bool is_q = head < q_heads;
    const RopeTensor& t = is_q ? p.q : p.k;
    if (!is_q) head -= q_heads;
    const T* in = static_cast<const T*>(t.in) + bases[4 * r + (is_q ? 0 : 2)] + head * t.in_strides[1];
    T* out = static_cast<T*>(t.out) + bases[4 * r + (is_q ? 1 : 3)] + head * t.out_strides[1];
    const float* c = table + 2 * r * dim;
    const float* s = c + dim;
    float x1[kVec], x2[kVec], y1[kVec], y2[kVec];
    load_floats<T, kVec>(in + i0, x1);
    load_floats<T, kVec>(in + half + i0, x2);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const int i = i0 + e;
      const float c1 = c[i], c2 = c[half + i], s1 = s[i], s2 = s[half + i];
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
  const int vec = vectorize ? kVec : 1;
  const int64_t units_per_row = (p.q.heads + p.k.heads) * (half / vec);
  const int64_t total_rows = p.batch * p.seq_len;
  int64_t rows = kUnitsPerBlock / units_per_row;
  if (rows < 1) rows = 1;
  if (rows > total_rows) rows = total_rows;
  // Shared memory stays under the 48 KiB that needs no opt-in (rows shrink for very wide heads).
  while (rows > 1 && shared_bytes(static_cast<int>(rows), p.head_dim) > 48 * 1024) rows /= 2;
  const dim3 grid(static_cast<unsigned>((total_rows + rows - 1) / rows));
  const int threads = threads_for(rows * units_per_row, 1, kMaxThreads);
  const size_t shared = shared_bytes(static_cast<int>(rows), p.head_dim);
  if (vectorize) {
    rope_kernel<T, kVec><<<grid, threads, shared, stream>>>(p, static_cast<int>(rows));
  } else {
    rope_kernel<T, 1><<<grid, threads, shared, stream>>>(p, static_cast<int>(rows));
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
