// RMSNorm and residual-add + RMSNorm: forward kernel, backward kernel, launchers (contract in rms_norm.h).
//
// Forward: one block per row. Each thread keeps up to kMaxPacksPerThread 16-byte packs of the row in
// registers, so x is read once; rows longer than the block can hold are re-read for the second pass.
// Backward: a fixed number of blocks (kBackwardBlocksPerSm per SM), each striding over rows and keeping
// x, dy and its dweight partial sums in registers (rows too long for that re-read x and dy, and accumulate
// in the block's partial row in memory); one partial row per block, then column_sum_kernel (no atomics).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rms_norm.h"

namespace tigon::cuda {
namespace {

constexpr int kMaxPacksPerThread = 4;       // forward: one row-sized array in registers
constexpr int kBackwardPacksPerThread = 2;  // backward: three (x, dy, dweight partials)
constexpr int kMaxThreads = 512;            // __launch_bounds__: leaves 128 registers per thread for the row
// Partials are [blocks, hidden] fp32: 2 blocks per SM is 4 MiB at hidden 4096 (8 for LayerNorm's two),
// which keeps one forward + backward of 8192 x 4096 bf16 near TARGETS' 130 MiB; each block runs up to 512
// threads with one pack each, so two blocks still keep 32 KiB of loads in flight per SM.
constexpr int kBackwardBlocksPerSm = 2;

// y for one element: x_hat = h * rstd, w as stored.
template <typename T, typename W>
__device__ __forceinline__ float rms_norm_output(float x_hat, float w, float offset, RMSNormCasting casting) {
  switch (casting) {
    case RMSNormCasting::kLlama: return round_to<W>(w + offset) * round_to<T>(x_hat);
    case RMSNormCasting::kGemma: return x_hat * (w + offset);
    default: return x_hat * round_to<W>(w + offset);
  }
}

// The factor dy is multiplied by on the way to dx.
template <typename W>
__device__ __forceinline__ float effective_weight(float w, float offset, RMSNormCasting casting) {
  return casting == RMSNormCasting::kGemma ? w + offset : round_to<W>(w + offset);
}

template <typename T, typename W, typename O, int kVec, bool kResidual>
__global__ void __launch_bounds__(kMaxThreads) rms_norm_forward_kernel(const RMSNormForwardParams p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + row * p.x_row_stride;
  const T* residual = kResidual ? static_cast<const T*>(p.residual) + row * p.residual_row_stride : nullptr;
  T* residual_out = kResidual ? static_cast<T*>(p.residual_out) + row * p.residual_out_row_stride : nullptr;
  const W* weight = static_cast<const W*>(p.weight);
  O* y = static_cast<O*>(p.y) + row * p.y_row_stride;
  const int64_t num_packs = p.hidden / kVec;
  const int64_t chunk = static_cast<int64_t>(blockDim.x) * kMaxPacksPerThread;
  const bool fits = num_packs <= chunk;

  float h[kMaxPacksPerThread][kVec];
  float sum_sq = 0.f;
  for (int64_t base = 0; base < num_packs; base += chunk) {
#pragma unroll
    for (int i = 0; i < kMaxPacksPerThread; ++i) {
      const int64_t pack = base + i * blockDim.x + threadIdx.x;
      if (pack < num_packs) {
        load_floats<T, kVec>(x + pack * kVec, h[i]);
        if constexpr (kResidual) {
          // Hugging Face stores x + residual in T and normalises that rounded sum.
          float r[kVec];
          load_floats<T, kVec>(residual + pack * kVec, r);
#pragma unroll
          for (int j = 0; j < kVec; ++j) h[i][j] = round_to<T>(h[i][j] + r[j]);
          store_floats<T, kVec>(residual_out + pack * kVec, h[i]);
        }
#pragma unroll
        for (int j = 0; j < kVec; ++j) sum_sq += h[i][j] * h[i][j];
      }
    }
  }
  const float rstd = rsqrtf(block_reduce_sum(sum_sq, scratch) / static_cast<float>(p.hidden) + p.eps);
  if (threadIdx.x == 0) p.rstd[row] = rstd;

  for (int64_t base = 0; base < num_packs; base += chunk) {
#pragma unroll
    for (int i = 0; i < kMaxPacksPerThread; ++i) {
      const int64_t pack = base + i * blockDim.x + threadIdx.x;
      if (pack < num_packs) {
        // Re-read only when the row did not fit; this thread wrote residual_out itself.
        if (!fits) load_floats<T, kVec>((kResidual ? residual_out : x) + pack * kVec, h[i]);
        float w[kVec], out[kVec];
        load_floats<W, kVec>(weight + pack * kVec, w);
#pragma unroll
        for (int j = 0; j < kVec; ++j) out[j] = rms_norm_output<T, W>(h[i][j] * rstd, w[j], p.offset, p.casting);
        store_floats<O, kVec>(y + pack * kVec, out);
      }
    }
  }
}

template <typename T, typename W, typename O, int kVec>
__global__ void __launch_bounds__(kMaxThreads) rms_norm_backward_kernel(const RMSNormBackwardParams p) {
  constexpr int kPacks = kBackwardPacksPerThread;
  __shared__ float scratch[32];
  const W* weight = static_cast<const W*>(p.weight);
  const int64_t num_packs = p.hidden / kVec;
  const int64_t chunk = static_cast<int64_t>(blockDim.x) * kPacks;
  const bool fits = num_packs <= chunk;
  const float inv_hidden = 1.f / static_cast<float>(p.hidden);
  float* partial = p.dweight_partials + static_cast<int64_t>(blockIdx.x) * p.hidden;

  // dweight partial sums: in registers when the row fits, else in this block's own partial row.
  float dw[kPacks][kVec];
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) dw[i][j] = 0.f;
  }
  if (!fits) {
    for (int64_t c = threadIdx.x; c < p.hidden; c += blockDim.x) partial[c] = 0.f;
    __syncthreads();
  }

  float h[kPacks][kVec], dy[kPacks][kVec];
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x_row = static_cast<const T*>(p.x) + row * p.x_row_stride;
    const O* dy_row = static_cast<const O*>(p.dy) + row * p.dy_row_stride;
    T* dx_row = static_cast<T*>(p.dx) + row * p.dx_row_stride;
    const T* dres_row =
        p.d_residual_out ? static_cast<const T*>(p.d_residual_out) + row * p.d_residual_out_row_stride : nullptr;
    const float rstd = p.rstd[row];

    // Pass 1: dot = sum(g * x_hat), g = dy * w_eff.
    float dot = 0.f;
    for (int64_t base = 0; base < num_packs; base += chunk) {
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        const int64_t pack = base + i * blockDim.x + threadIdx.x;
        if (pack < num_packs) {
          float w[kVec];
          load_floats<T, kVec>(x_row + pack * kVec, h[i]);
          load_floats<O, kVec>(dy_row + pack * kVec, dy[i]);
          load_floats<W, kVec>(weight + pack * kVec, w);
#pragma unroll
          for (int j = 0; j < kVec; ++j) dot += dy[i][j] * effective_weight<W>(w[j], p.offset, p.casting) * h[i][j];
        }
      }
    }
    dot = block_reduce_sum(dot, scratch) * rstd * inv_hidden;  // mean(g * x_hat)

    // Pass 2: dx = rstd * (g - x_hat * dot) (+ d_residual_out); dweight += dy * x_hat.
    for (int64_t base = 0; base < num_packs; base += chunk) {
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        const int64_t pack = base + i * blockDim.x + threadIdx.x;
        if (pack < num_packs) {
          if (!fits) {
            load_floats<T, kVec>(x_row + pack * kVec, h[i]);
            load_floats<O, kVec>(dy_row + pack * kVec, dy[i]);
          }
          float w[kVec], dx[kVec], dres[kVec];
          load_floats<W, kVec>(weight + pack * kVec, w);
          if (dres_row) {
            load_floats<T, kVec>(dres_row + pack * kVec, dres);
          } else {
#pragma unroll
            for (int j = 0; j < kVec; ++j) dres[j] = 0.f;
          }
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const float x_hat = h[i][j] * rstd;
            const float g = dy[i][j] * effective_weight<W>(w[j], p.offset, p.casting);
            dx[j] = rstd * (g - x_hat * dot) + dres[j];
            // Llama's weight multiplies x_hat rounded to T; its gradient sees the same rounding.
            const float x_hat_w = p.casting == RMSNormCasting::kLlama ? round_to<T>(x_hat) : x_hat;
            if (fits) {
              dw[i][j] += dy[i][j] * x_hat_w;
            } else {
              partial[pack * kVec + j] += dy[i][j] * x_hat_w;
            }
          }
          store_floats<T, kVec>(dx_row + pack * kVec, dx);
        }
      }
    }
  }

  if (fits) {
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int64_t pack = i * blockDim.x + threadIdx.x;
      if (pack < num_packs) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) partial[pack * kVec + j] = dw[i][j];
      }
    }
  }
}

bool rows_aligned(const void* p, int64_t row_stride, int vec, int elem_size) {
  return p == nullptr || (is_aligned(p, vec * elem_size < 16 ? vec * elem_size : 16) && row_stride % vec == 0);
}

template <typename T, typename W, typename O>
cudaError_t launch_forward(const RMSNormForwardParams& p, cudaStream_t stream) {
  constexpr int kVec = kElemsPer16Bytes<T>;
  const bool vectorize = p.hidden % kVec == 0 && rows_aligned(p.x, p.x_row_stride, kVec, sizeof(T)) &&
                         rows_aligned(p.residual, p.residual_row_stride, kVec, sizeof(T)) &&
                         rows_aligned(p.residual_out, p.residual_out_row_stride, kVec, sizeof(T)) &&
                         rows_aligned(p.y, p.y_row_stride, kVec, sizeof(O)) &&
                         rows_aligned(p.weight, 0, kVec, sizeof(W));
  const dim3 grid(static_cast<unsigned>(p.rows));
  const bool residual = p.residual != nullptr;
  if (vectorize) {
    const int threads = threads_for(p.hidden / kVec, kMaxPacksPerThread, kMaxThreads);
    if (residual) {
      rms_norm_forward_kernel<T, W, O, kVec, true><<<grid, threads, 0, stream>>>(p);
    } else {
      rms_norm_forward_kernel<T, W, O, kVec, false><<<grid, threads, 0, stream>>>(p);
    }
  } else {
    const int threads = threads_for(p.hidden, kMaxPacksPerThread, kMaxThreads);
    if (residual) {
      rms_norm_forward_kernel<T, W, O, 1, true><<<grid, threads, 0, stream>>>(p);
    } else {
      rms_norm_forward_kernel<T, W, O, 1, false><<<grid, threads, 0, stream>>>(p);
    }
  }
  return cudaGetLastError();
}

template <typename T, typename W, typename O>
cudaError_t launch_backward(const RMSNormBackwardParams& p, cudaStream_t stream) {
  constexpr int kVec = kElemsPer16Bytes<T>;
  const bool vectorize = p.hidden % kVec == 0 && rows_aligned(p.x, p.x_row_stride, kVec, sizeof(T)) &&
                         rows_aligned(p.dy, p.dy_row_stride, kVec, sizeof(O)) &&
                         rows_aligned(p.dx, p.dx_row_stride, kVec, sizeof(T)) &&
                         rows_aligned(p.d_residual_out, p.d_residual_out_row_stride, kVec, sizeof(T)) &&
                         rows_aligned(p.weight, 0, kVec, sizeof(W));
  const int64_t num_partials = rms_norm_backward_num_partials(p.rows);
  const dim3 grid(static_cast<unsigned>(num_partials));
  // One pack per thread (up to 512 threads): as many threads per row as possible, since few blocks run.
  if (vectorize) {
    rms_norm_backward_kernel<T, W, O, kVec><<<grid, threads_for(p.hidden / kVec, 1, kMaxThreads), 0, stream>>>(p);
  } else {
    rms_norm_backward_kernel<T, W, O, 1><<<grid, threads_for(p.hidden, 1, kMaxThreads), 0, stream>>>(p);
  }
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  return launch_column_sum<W>(p.dweight_partials, num_partials, p.hidden, static_cast<W*>(p.dweight), stream);
}

bool valid_types(DType x, DType weight, DType out) {
  return (weight == x || weight == DType::kFloat32) && (out == x || out == DType::kFloat32);
}

}  // namespace

int64_t rms_norm_backward_num_partials(int64_t rows) {
  const int64_t blocks = static_cast<int64_t>(current_device_sm_count()) * kBackwardBlocksPerSm;
  return rows < blocks ? (rows > 0 ? rows : 1) : blocks;
}

LaunchStatus rms_norm_forward(const RMSNormForwardParams& p, void* stream_ptr) {
  if (p.rows == 0 || p.hidden == 0) return cudaSuccess;
  if (!valid_types(p.x_dtype, p.weight_dtype, p.y_dtype) || (p.residual && !p.residual_out)) {
    return cudaErrorInvalidValue;
  }
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  return dispatch_float_type(p.x_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool w_float = p.weight_dtype == DType::kFloat32, y_float = p.y_dtype == DType::kFloat32;
    if (w_float && y_float) return launch_forward<T, float, float>(p, stream);
    if (w_float) return launch_forward<T, float, T>(p, stream);
    return launch_forward<T, T, T>(p, stream);
  });
}

LaunchStatus rms_norm_backward(const RMSNormBackwardParams& p, void* stream_ptr) {
  if (p.rows == 0 || p.hidden == 0) return cudaSuccess;
  if (!valid_types(p.x_dtype, p.weight_dtype, p.dy_dtype)) return cudaErrorInvalidValue;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  return dispatch_float_type(p.x_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool w_float = p.weight_dtype == DType::kFloat32, dy_float = p.dy_dtype == DType::kFloat32;
    if (w_float && dy_float) return launch_backward<T, float, float>(p, stream);
    if (w_float) return launch_backward<T, float, T>(p, stream);
    return launch_backward<T, T, T>(p, stream);
  });
}

}  // namespace tigon::cuda
