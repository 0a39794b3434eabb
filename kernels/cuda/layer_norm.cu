// LayerNorm: forward kernel, backward kernel, launchers (contract in layer_norm.h).
//
// Forward: one block per row, the row kept in registers (up to kForwardPacksPerThread 16-byte packs per
// thread) for the exact two-pass mean/variance; longer rows are re-read. Backward: a fixed number of blocks
// striding over rows, dweight/dbias partial sums kept in registers (kBackwardPacksPerThread packs, as
// four row-sized arrays must fit), one partial row per block, then column_sum_kernel (no atomics).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/layer_norm.h"

namespace tigon::cuda {
namespace {

constexpr int kForwardPacksPerThread = 4;
constexpr int kBackwardPacksPerThread = 2;
constexpr int kMaxThreads = 512;  // __launch_bounds__: leaves 128 registers per thread for the row
// Partials are [blocks, hidden] fp32: 2 blocks per SM is 4 MiB at hidden 4096 (8 for LayerNorm's two),
// which keeps one forward + backward of 8192 x 4096 bf16 near TARGETS' 130 MiB; each block runs up to 512
// threads with one pack each, so two blocks still keep 32 KiB of loads in flight per SM.
constexpr int kBackwardBlocksPerSm = 2;

template <typename T, typename W, int kVec>
__global__ void __launch_bounds__(kMaxThreads) layer_norm_forward_kernel(const LayerNormForwardParams p) {
  constexpr int kPacks = kForwardPacksPerThread;
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + row * p.x_row_stride;
  T* y = static_cast<T*>(p.y) + row * p.y_row_stride;
  const W* weight = static_cast<const W*>(p.weight);
  const W* bias = static_cast<const W*>(p.bias);
  const int64_t num_packs = p.hidden / kVec;
  const int64_t chunk = static_cast<int64_t>(blockDim.x) * kPacks;
  const bool fits = num_packs <= chunk;
  const float inv_hidden = 1.f / static_cast<float>(p.hidden);

  float h[kPacks][kVec];
  float sum = 0.f;
  for (int64_t base = 0; base < num_packs; base += chunk) {
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int64_t pack = base + i * blockDim.x + threadIdx.x;
      if (pack < num_packs) {
        load_floats<T, kVec>(x + pack * kVec, h[i]);
#pragma unroll
        for (int j = 0; j < kVec; ++j) sum += h[i][j];
      }
    }
  }
  const float mean = block_reduce_sum(sum, scratch) * inv_hidden;

  // Variance from the centred values (two passes, as torch does), not E[x^2] - mean^2.
  float sum_sq = 0.f;
  for (int64_t base = 0; base < num_packs; base += chunk) {
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int64_t pack = base + i * blockDim.x + threadIdx.x;
      if (pack < num_packs) {
        if (!fits) load_floats<T, kVec>(x + pack * kVec, h[i]);
#pragma unroll
        for (int j = 0; j < kVec; ++j) sum_sq += (h[i][j] - mean) * (h[i][j] - mean);
      }
    }
  }
  const float rstd = rsqrtf(block_reduce_sum(sum_sq, scratch) * inv_hidden + p.eps);
  if (threadIdx.x == 0) {
    p.mean[row] = mean;
    p.rstd[row] = rstd;
  }

  for (int64_t base = 0; base < num_packs; base += chunk) {
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int64_t pack = base + i * blockDim.x + threadIdx.x;
      if (pack < num_packs) {
        if (!fits) load_floats<T, kVec>(x + pack * kVec, h[i]);
        float w[kVec], b[kVec], out[kVec];
        load_floats<W, kVec>(weight + pack * kVec, w);
        if (bias) {
          load_floats<W, kVec>(bias + pack * kVec, b);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j) b[j] = 0.f;
        }
#pragma unroll
        for (int j = 0; j < kVec; ++j) out[j] = (h[i][j] - mean) * rstd * w[j] + b[j];
        store_floats<T, kVec>(y + pack * kVec, out);
      }
    }
  }
}

template <typename T, typename W, int kVec>
__global__ void __launch_bounds__(kMaxThreads) layer_norm_backward_kernel(const LayerNormBackwardParams p) {
  constexpr int kPacks = kBackwardPacksPerThread;
  __shared__ float scratch[32];
  const W* weight = static_cast<const W*>(p.weight);
  const bool has_bias = p.dbias_partials != nullptr;
  const int64_t num_packs = p.hidden / kVec;
  const int64_t chunk = static_cast<int64_t>(blockDim.x) * kPacks;
  const bool fits = num_packs <= chunk;
  const float inv_hidden = 1.f / static_cast<float>(p.hidden);
  float* dw_partial = p.dweight_partials + static_cast<int64_t>(blockIdx.x) * p.hidden;
  float* db_partial = has_bias ? p.dbias_partials + static_cast<int64_t>(blockIdx.x) * p.hidden : nullptr;

  float dw[kPacks][kVec], db[kPacks][kVec];
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) dw[i][j] = db[i][j] = 0.f;
  }
  if (!fits) {
    for (int64_t c = threadIdx.x; c < p.hidden; c += blockDim.x) {
      dw_partial[c] = 0.f;
      if (has_bias) db_partial[c] = 0.f;
    }
    __syncthreads();
  }

  float h[kPacks][kVec], dy[kPacks][kVec];
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x_row = static_cast<const T*>(p.x) + row * p.x_row_stride;
    const T* dy_row = static_cast<const T*>(p.dy) + row * p.dy_row_stride;
    T* dx_row = static_cast<T*>(p.dx) + row * p.dx_row_stride;
    const float mean = p.mean[row], rstd = p.rstd[row];

    // Pass 1: sum(g * x_hat) and sum(g), g = dy * w.
    float sum_g_xhat = 0.f, sum_g = 0.f;
    for (int64_t base = 0; base < num_packs; base += chunk) {
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        const int64_t pack = base + i * blockDim.x + threadIdx.x;
        if (pack < num_packs) {
          float w[kVec];
          load_floats<T, kVec>(x_row + pack * kVec, h[i]);
          load_floats<T, kVec>(dy_row + pack * kVec, dy[i]);
          load_floats<W, kVec>(weight + pack * kVec, w);
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const float g = dy[i][j] * w[j];
            sum_g_xhat += g * (h[i][j] - mean) * rstd;
            sum_g += g;
          }
        }
      }
    }
    const float mean_g_xhat = block_reduce_sum(sum_g_xhat, scratch) * inv_hidden;
    const float mean_g = block_reduce_sum(sum_g, scratch) * inv_hidden;

    // Pass 2: dx = rstd * (g - x_hat * mean(g x_hat) - mean(g)); dweight += dy * x_hat; dbias += dy.
    for (int64_t base = 0; base < num_packs; base += chunk) {
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        const int64_t pack = base + i * blockDim.x + threadIdx.x;
        if (pack < num_packs) {
          if (!fits) {
            load_floats<T, kVec>(x_row + pack * kVec, h[i]);
            load_floats<T, kVec>(dy_row + pack * kVec, dy[i]);
          }
          float w[kVec], dx[kVec];
          load_floats<W, kVec>(weight + pack * kVec, w);
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const float x_hat = (h[i][j] - mean) * rstd;
            dx[j] = rstd * (dy[i][j] * w[j] - x_hat * mean_g_xhat - mean_g);
            if (fits) {
              dw[i][j] += dy[i][j] * x_hat;
              db[i][j] += dy[i][j];
            } else {
              dw_partial[pack * kVec + j] += dy[i][j] * x_hat;
              if (has_bias) db_partial[pack * kVec + j] += dy[i][j];
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
        for (int j = 0; j < kVec; ++j) {
          dw_partial[pack * kVec + j] = dw[i][j];
          if (has_bias) db_partial[pack * kVec + j] = db[i][j];
        }
      }
    }
  }
}

template <typename T, typename W>
cudaError_t launch_forward(const LayerNormForwardParams& p, cudaStream_t stream) {
  constexpr int kVec = kElemsPer16Bytes<T>;
  const bool vectorize = p.hidden % kVec == 0 && rows_aligned(p.x, p.x_row_stride, kVec, sizeof(T)) &&
                         rows_aligned(p.y, p.y_row_stride, kVec, sizeof(T)) &&
                         rows_aligned(p.weight, 0, kVec, sizeof(W)) && rows_aligned(p.bias, 0, kVec, sizeof(W));
  const dim3 grid(static_cast<unsigned>(p.rows));
  if (vectorize) {
    layer_norm_forward_kernel<T, W, kVec>
        <<<grid, threads_for(p.hidden / kVec, kForwardPacksPerThread, kMaxThreads), 0, stream>>>(p);
  } else {
    layer_norm_forward_kernel<T, W, 1>
        <<<grid, threads_for(p.hidden, kForwardPacksPerThread, kMaxThreads), 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <typename T, typename W>
cudaError_t launch_backward(const LayerNormBackwardParams& p, cudaStream_t stream) {
  constexpr int kVec = kElemsPer16Bytes<T>;
  const bool vectorize = p.hidden % kVec == 0 && rows_aligned(p.x, p.x_row_stride, kVec, sizeof(T)) &&
                         rows_aligned(p.dy, p.dy_row_stride, kVec, sizeof(T)) &&
                         rows_aligned(p.dx, p.dx_row_stride, kVec, sizeof(T)) &&
                         rows_aligned(p.weight, 0, kVec, sizeof(W));
  const int64_t num_partials = layer_norm_backward_num_partials(p.rows);
  const dim3 grid(static_cast<unsigned>(num_partials));
  if (vectorize) {
    layer_norm_backward_kernel<T, W, kVec><<<grid, threads_for(p.hidden / kVec, 1, kMaxThreads), 0, stream>>>(p);
  } else {
    layer_norm_backward_kernel<T, W, 1><<<grid, threads_for(p.hidden, 1, kMaxThreads), 0, stream>>>(p);
  }
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  status = launch_column_sum<W>(p.dweight_partials, num_partials, p.hidden, static_cast<W*>(p.dweight), stream);
  if (status != cudaSuccess || p.dbias == nullptr) return status;
  return launch_column_sum<W>(p.dbias_partials, num_partials, p.hidden, static_cast<W*>(p.dbias), stream);
}

}  // namespace

int64_t layer_norm_backward_num_partials(int64_t rows) { return num_row_blocks(rows, kBackwardBlocksPerSm); }

LaunchStatus layer_norm_forward(const LayerNormForwardParams& p, void* stream_ptr) {
  if (p.rows == 0 || p.hidden == 0) return cudaSuccess;
  if (p.weight_dtype != p.x_dtype && p.weight_dtype != DType::kFloat32) return cudaErrorInvalidValue;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  return dispatch_float_type(p.x_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.weight_dtype == DType::kFloat32) return launch_forward<T, float>(p, stream);
    return launch_forward<T, T>(p, stream);
  });
}

LaunchStatus layer_norm_backward(const LayerNormBackwardParams& p, void* stream_ptr) {
  if (p.rows == 0 || p.hidden == 0) return cudaSuccess;
  if (p.weight_dtype != p.x_dtype && p.weight_dtype != DType::kFloat32) return cudaErrorInvalidValue;
  if ((p.dbias == nullptr) != (p.dbias_partials == nullptr)) return cudaErrorInvalidValue;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  return dispatch_float_type(p.x_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.weight_dtype == DType::kFloat32) return launch_backward<T, float>(p, stream);
    return launch_backward<T, T>(p, stream);
  });
}

}  // namespace tigon::cuda
