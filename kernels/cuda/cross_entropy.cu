// Cross entropy, one block per row: pass 1 reads the row once for the online softmax (running max and
// rescaled sum together, plus the plain sum for label smoothing); pass 2 re-reads it (mostly from L2: the
// ~2 rows per SM in flight are 250 KiB each at V = 128256 bf16) and overwrites it with the gradient.
// Floor at 8192 x 128256 bf16: two reads and one write of 2.1 GB = 1.47 ms at 4.3 TB/s.
#include <cfloat>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cross_entropy.h"

namespace tigon::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread: 512 threads x 4 x 16 B = 32 KiB per block
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;


template <typename T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  const int4 raw = *reinterpret_cast<const int4*>(p);
  return *reinterpret_cast<const Pack<T>*>(&raw);
}
// Last use of the row: evict-first load, streaming store, so the rows still to be re-read stay in L2.
template <typename T>
__device__ __forceinline__ Pack<T> load_pack_last(const T* p) {
  const int4 raw = __ldcs(reinterpret_cast<const int4*>(p));
  return *reinterpret_cast<const Pack<T>*>(&raw);
}
template <typename T>
__device__ __forceinline__ void store_pack_streaming(T* p, const Pack<T>& v) {
  __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(&v));
}

// Online softmax state in base 2: the running max m of x*log2(e) and s = sum 2^(x*log2(e) - m).
struct SoftmaxState {
  float m = -FLT_MAX;  // finite, so that rows of -inf logits give 2^(-inf) = 0 instead of NaN
  float s = 0.f;
  float sum_x = 0.f;  // plain sum of the (softcapped) logits, for label smoothing
};

__device__ __forceinline__ void merge(SoftmaxState& a, float m, float s, float sum_x) {
  const float new_m = fmaxf(a.m, m);
  a.s = a.s * exp2f(a.m - new_m) + s * exp2f(m - new_m);
  a.m = new_m;
  a.sum_x += sum_x;
}

template <bool kSoftcap>
__device__ __forceinline__ float softcapped(float x, float cap, float inv_cap) {
  return kSoftcap ? cap * tanhf(x * inv_cap) : x;
}

template <typename T, bool kSoftcap, int kN>
__device__ __forceinline__ void accumulate(SoftmaxState& st, const T (&v)[kN], float cap, float inv_cap) {
  float xs[kN];
  float local_max = -FLT_MAX;
#pragma unroll
  for (int k = 0; k < kN; ++k) {
    const float x = softcapped<kSoftcap>(to_float(v[k]), cap, inv_cap);
    st.sum_x += x;
    xs[k] = x * kLog2e;
    local_max = fmaxf(local_max, xs[k]);
  }
  if (local_max > st.m) {  // one rescale per pack, not per element
    st.s *= exp2f(st.m - local_max);
    st.m = local_max;
  }
#pragma unroll
  for (int k = 0; k < kN; ++k) st.s += exp2f(xs[k] - st.m);
}

// Gradient coefficients of one row (see cross_entropy.h).
struct RowGrad {
  float lse_log2;    // lse * log2(e)
  float coef_p;      // scale * w * (1 + 2 z lse)
  float coef_const;  // scale * w * eps / V
  float coef_t;      // scale * w * (1 - eps)
  int64_t target;
};

template <typename T, bool kSoftcap>
__device__ __forceinline__ T grad_element(float raw, int64_t j, const RowGrad& g, float cap, float inv_cap) {
  const float x = softcapped<kSoftcap>(raw, cap, inv_cap);
  float d = g.coef_p * exp2f(fmaf(x, kLog2e, -g.lse_log2)) - g.coef_const - (j == g.target ? g.coef_t : 0.f);
  if (kSoftcap) {
    const float t = x * inv_cap;
    d *= 1.f - t * t;
  }
  return from_float<T>(d);
}

// Each row is split into a scalar head up to the first 16-byte boundary, a body of 16-byte packs and a
// scalar tail, so that any row stride and vocabulary size (50257, odd strided views) keeps vector loads.
struct RowSplit {
  int64_t head;        // elements before the first aligned pack
  int64_t n_packs;     // packs in the body
  int64_t tail_start;  // first element after the body
};

template <typename T>
__device__ __forceinline__ RowSplit split_row(const T* row, int64_t vocab) {
  constexpr int kN = Pack<T>::kN;
  RowSplit r;
  const int64_t misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(row) % 16);
  r.head = misalign == 0 ? 0 : (16 - misalign) / static_cast<int64_t>(sizeof(T));
  if (r.head > vocab) r.head = vocab;
  r.n_packs = (vocab - r.head) / kN;
  r.tail_start = r.head + r.n_packs * kN;
  return r;
}

template <typename T, bool kSoftcap>
__global__ void __launch_bounds__(kThreads, 2) cross_entropy_forward_kernel(const CrossEntropyParams p) {
  constexpr int kN = Pack<T>::kN;
  const int64_t row = blockIdx.x;
  T* x_row = static_cast<T*>(p.logits) + row * p.logits_row_stride;
  const int64_t V = p.vocab;
  const int64_t target = p.target[row];
  const int tid = threadIdx.x;
  const RowSplit split = split_row(x_row, V);
  T* body = x_row + split.head;
  // Scalar elements: [0, head) and [tail_start, V), at most 2 * (kN - 1) of them.
  const int64_t n_scalar = split.head + (V - split.tail_start);
  auto scalar_index = [&](int64_t k) { return k < split.head ? k : split.tail_start + (k - split.head); };

  if (target == p.ignore_index) {
    if (p.write_grad) {
      Pack<T> zero;
#pragma unroll
      for (int k = 0; k < kN; ++k) zero.v[k] = from_float<T>(0.f);
      for (int64_t i = tid; i < split.n_packs; i += kThreads) store_pack_streaming(body + i * kN, zero);
      for (int64_t k = tid; k < n_scalar; k += kThreads) x_row[scalar_index(k)] = from_float<T>(0.f);
    }
    if (tid == 0) p.loss[row] = 0.f;
    return;
  }

  const float cap = p.softcap;
  const float inv_cap = kSoftcap ? 1.f / cap : 0.f;
  const bool target_in_range = target >= 0 && target < V;
  // Read before pass 2 overwrites the row.
  float x_target = 0.f;
  if (tid == 0) x_target = target_in_range ? softcapped<kSoftcap>(to_float(x_row[target]), cap, inv_cap) : NAN;

  // Pass 1: online softmax.
  SoftmaxState st;
  const int64_t n_packs = split.n_packs;
  for (int64_t i0 = tid; i0 < n_packs; i0 += static_cast<int64_t>(kThreads) * kUnroll) {
    Pack<T> buf[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + static_cast<int64_t>(u) * kThreads;
      if (i < n_packs) buf[u] = load_pack(body + i * kN);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i0 + static_cast<int64_t>(u) * kThreads < n_packs) accumulate<T, kSoftcap>(st, buf[u].v, cap, inv_cap);
    }
  }
  for (int64_t k = tid; k < n_scalar; k += kThreads) {
    const T one[1] = {x_row[scalar_index(k)]};
    accumulate<T, kSoftcap>(st, one, cap, inv_cap);
  }

  // Block reduction of (m, s, sum_x): warps by shuffle, then warp 0 over the warps.
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float m = __shfl_xor_sync(0xffffffffu, st.m, offset);
    const float s = __shfl_xor_sync(0xffffffffu, st.s, offset);
    const float sx = __shfl_xor_sync(0xffffffffu, st.sum_x, offset);
    merge(st, m, s, sx);
  }
  __shared__ float shared_m[kThreads / 32], shared_s[kThreads / 32], shared_sum[kThreads / 32];
  __shared__ float shared_lse, shared_sum_x;
  const int warp = tid / 32, lane = tid % 32;
  if (lane == 0) {
    shared_m[warp] = st.m;
    shared_s[warp] = st.s;
    shared_sum[warp] = st.sum_x;
  }
  __syncthreads();
  if (warp == 0) {
    SoftmaxState w;
    if (lane < kThreads / 32) {
      w.m = shared_m[lane];
      w.s = shared_s[lane];
      w.sum_x = shared_sum[lane];
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float m = __shfl_xor_sync(0xffffffffu, w.m, offset);
      const float s = __shfl_xor_sync(0xffffffffu, w.s, offset);
      const float sx = __shfl_xor_sync(0xffffffffu, w.sum_x, offset);
      merge(w, m, s, sx);
    }
    if (lane == 0) {
      shared_lse = (w.m + log2f(w.s)) * kLn2;
      shared_sum_x = w.sum_x;
    }
  }
  __syncthreads();
  const float lse = shared_lse;
  const float eps = p.label_smoothing;
  const float z = p.z_loss_scale;
  const float w = p.token_weights ? p.token_weights[row] : 1.f;
  if (tid == 0) {
    const float mean_x = shared_sum_x / static_cast<float>(V);
    // The smoothing term only when asked for: a -inf (masked) logit makes mean_x -inf, and 0 * inf is NaN.
    const float smooth = eps != 0.f ? eps * (lse - mean_x) : 0.f;
    p.loss[row] = w * ((1.f - eps) * (lse - x_target) + smooth + z * lse * lse);
  }
  if (!p.write_grad) return;

  // Pass 2: the gradient, in place.
  float scale = p.grad_scale * w;
  if (p.n_valid) scale /= static_cast<float>(max(*p.n_valid, static_cast<int64_t>(1)));
  RowGrad g;
  g.lse_log2 = lse * kLog2e;
  g.coef_p = scale * (1.f + 2.f * z * lse);
  g.coef_const = scale * eps / static_cast<float>(V);
  g.coef_t = scale * (1.f - eps);
  g.target = target;
  for (int64_t i0 = tid; i0 < n_packs; i0 += static_cast<int64_t>(kThreads) * kUnroll) {
    Pack<T> buf[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + static_cast<int64_t>(u) * kThreads;
      if (i < n_packs) buf[u] = load_pack_last(body + i * kN);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + static_cast<int64_t>(u) * kThreads;
      if (i < n_packs) {
        Pack<T> out;
#pragma unroll
        for (int k = 0; k < kN; ++k) {
          out.v[k] = grad_element<T, kSoftcap>(to_float(buf[u].v[k]), split.head + i * kN + k, g, cap, inv_cap);
        }
        store_pack_streaming(body + i * kN, out);
      }
    }
  }
  for (int64_t k = tid; k < n_scalar; k += kThreads) {
    const int64_t j = scalar_index(k);
    x_row[j] = grad_element<T, kSoftcap>(to_float(x_row[j]), j, g, cap, inv_cap);
  }
}

template <typename T>
LaunchStatus launch_forward(const CrossEntropyParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.n_rows));
  if (p.softcap > 0.f) {
    cross_entropy_forward_kernel<T, true><<<grid, kThreads, 0, stream>>>(p);
  } else {
    cross_entropy_forward_kernel<T, false><<<grid, kThreads, 0, stream>>>(p);
  }
  return static_cast<LaunchStatus>(cudaGetLastError());
}

}  // namespace

LaunchStatus cross_entropy_forward(const CrossEntropyParams& params, void* stream) {
  if (params.n_rows == 0) return 0;
  if (params.n_rows > 0x7fffffffLL) return static_cast<LaunchStatus>(cudaErrorInvalidConfiguration);
  auto s = static_cast<cudaStream_t>(stream);
  switch (params.dtype) {
    case DType::kFloat32:
      return launch_forward<float>(params, s);
    case DType::kBFloat16:
      return launch_forward<__nv_bfloat16>(params, s);
    case DType::kFloat16:
      return launch_forward<__half>(params, s);
  }
  return static_cast<LaunchStatus>(cudaErrorInvalidValue);
}

}  // namespace tigon::cuda
