// RMSNorm and residual-add + RMSNorm: forward kernel, backward kernel, launchers (contract in rms_norm.h).
//
// Forward: one block per row. Each thread keeps up to kMaxPacksPerThread 16-byte packs of the row in
// registers, so x is read once; rows longer than the block can hold are re-read for the second pass.
// Backward: a fixed number of blocks (kBackwardBlocksPerSm per SM), each striding over groups of
// kBackwardRows rows and keeping x, dy and its dweight partial sums in registers (rows too long for that re-read x and dy, and accumulate
// in the block's partial row in memory); one partial row per block, then column_sum_kernel (no atomics).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rms_norm.h"

namespace tigon::cuda {
namespace {

constexpr int kMaxPacksPerThread = 4;       // forward: one row-sized array in registers
constexpr int kBackwardPacksPerThread = 2;  // backward: three (x, dy, dweight partials)
constexpr int kMaxThreads = 512;            // __launch_bounds__: leaves 128 registers per thread for the row
// Partials are [blocks, hidden] fp32: 4 blocks per SM is 8.6 MiB at hidden 4096 on 132 SMs. Blocks of 512
// threads at 128 registers fit one per SM (the others run after it); the 256-thread, 64-register blocks of
// rows of 257-512 packs fit four, so one block's loads overlap another's reduction and stores.
constexpr int kBackwardBlocksPerSm = 4;
constexpr int kBackwardRows = 2;  // rows in flight per block (registers: 2 x (x, dy) + dweight per pack)

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

// Sums each of kRows values over the block, in a fixed order (deterministic); every thread gets the sums.
// `scratch` is 32 * kRows floats of shared memory.
template <int kRows>
__device__ __forceinline__ void block_reduce_sums(float (&v)[kRows], float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
#pragma unroll
  for (int r = 0; r < kRows; ++r) v[r] = warp_reduce_sum(v[r]);
  __syncthreads();  // the previous call's readers are done with scratch
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) scratch[r * 32 + warp] = v[r];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kRows; ++r) v[r] = warp_reduce_sum(lane < num_warps ? scratch[r * 32 + lane] : 0.f);
}

// kRows rows at a time per block: their loads are in flight together and they share one reduction, so
// a block pays one memory round trip and one barrier pair per kRows rows (one row at a time left the
// kernel latency-bound, at 3x its memory floor at hidden 2048).
// kMinBlocks > 1 caps the registers so that many blocks of kMaxThreads threads share an SM.
template <typename T, typename W, typename O, int kVec, int kPacks, int kRows, int kMinBlocks = 1>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) rms_norm_backward_kernel(const RMSNormBackwardParams p) {
  __shared__ float scratch[32 * kRows];
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

  float h[kRows][kPacks][kVec], dy[kRows][kPacks][kVec];
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kRows; first < p.rows;
       first += static_cast<int64_t>(gridDim.x) * kRows) {
    const int rows = static_cast<int>(min(static_cast<int64_t>(kRows), p.rows - first));
    float rstd[kRows], dot[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      rstd[r] = r < rows ? p.rstd[first + r] : 0.f;
      dot[r] = 0.f;
    }
    auto x_row = [&](int r) { return static_cast<const T*>(p.x) + (first + r) * p.x_row_stride; };
    auto dy_row = [&](int r) { return static_cast<const O*>(p.dy) + (first + r) * p.dy_row_stride; };

    // Pass 1: dot = sum(g * x_hat), g = dy * w_eff, for every row of the group.
    for (int64_t base = 0; base < num_packs; base += chunk) {
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        const int64_t pack = base + i * blockDim.x + threadIdx.x;
        if (pack < num_packs) {
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            if (r < rows) {
              load_floats<T, kVec>(x_row(r) + pack * kVec, h[r][i]);
              load_floats<O, kVec>(dy_row(r) + pack * kVec, dy[r][i]);
            }
          }
          float w[kVec];
          load_floats<W, kVec>(weight + pack * kVec, w);
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            if (r < rows) {
#pragma unroll
              for (int j = 0; j < kVec; ++j)
                dot[r] += dy[r][i][j] * effective_weight<W>(w[j], p.offset, p.casting) * h[r][i][j];
            }
          }
        }
      }
    }
    block_reduce_sums<kRows>(dot, scratch);
#pragma unroll
    for (int r = 0; r < kRows; ++r) dot[r] *= rstd[r] * inv_hidden;  // mean(g * x_hat)

    // Pass 2: dx = rstd * (g - x_hat * dot) (+ d_residual_out); dweight += dy * x_hat, rows in order.
    for (int64_t base = 0; base < num_packs; base += chunk) {
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        const int64_t pack = base + i * blockDim.x + threadIdx.x;
        if (pack < num_packs) {
          float w[kVec];
          load_floats<W, kVec>(weight + pack * kVec, w);
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            if (r >= rows) continue;
            if (!fits) {
              load_floats<T, kVec>(x_row(r) + pack * kVec, h[r][i]);
              load_floats<O, kVec>(dy_row(r) + pack * kVec, dy[r][i]);
            }
            float dx[kVec], dres[kVec];
            if (p.d_residual_out) {
              load_floats<T, kVec>(static_cast<const T*>(p.d_residual_out) + (first + r) * p.d_residual_out_row_stride +
                                       pack * kVec,
                                   dres);
            } else {
#pragma unroll
              for (int j = 0; j < kVec; ++j) dres[j] = 0.f;
            }
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
              const float x_hat = h[r][i][j] * rstd[r];
              const float g = dy[r][i][j] * effective_weight<W>(w[j], p.offset, p.casting);
              dx[j] = rstd[r] * (g - x_hat * dot[r]) + dres[j];
              // Llama's weight multiplies x_hat rounded to T; its gradient sees the same rounding.
              const float x_hat_w = p.casting == RMSNormCasting::kLlama ? round_to<T>(x_hat) : x_hat;
              if (fits) {
                dw[i][j] += dy[r][i][j] * x_hat_w;
              } else {
                partial[pack * kVec + j] += dy[r][i][j] * x_hat_w;
              }
            }
            store_floats<T, kVec>(static_cast<T*>(p.dx) + (first + r) * p.dx_row_stride + pack * kVec, dx);
          }
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
  // Rows of 257-512 packs (hidden 4096 in bf16, Llama-3-8B's): 256 threads of two packs, one row at a
  // time, in at most 64 registers, four blocks per SM (kernel bench 0.177 -> 0.162 ms fwd+bwd at 8192 x
  // 4096; 9.5 -> 7.8 ms per Llama-3-8B training step, H200). Otherwise one pack per thread (up to 512
  // threads), as many threads per row as possible, 4 rows in flight in the registers that 2 packs x 2 rows
  // use; longer rows take two packs per thread.
  if (vectorize) {
    const int64_t packs = p.hidden / kVec;
    const int threads = threads_for(packs, 1, kMaxThreads);
    if (packs > kMaxThreads / 2 && packs <= kMaxThreads) {
      rms_norm_backward_kernel<T, W, O, kVec, 2, 1, 2><<<grid, kMaxThreads / 2, 0, stream>>>(p);
    } else if (packs <= threads) {
      rms_norm_backward_kernel<T, W, O, kVec, 1, 2 * kBackwardRows><<<grid, threads, 0, stream>>>(p);
    } else {
      rms_norm_backward_kernel<T, W, O, kVec, kBackwardPacksPerThread, kBackwardRows><<<grid, threads, 0, stream>>>(p);
    }
  } else {
    const int threads = threads_for(p.hidden, 1, kMaxThreads);
    if (p.hidden <= threads) {
      rms_norm_backward_kernel<T, W, O, 1, 1, 2 * kBackwardRows><<<grid, threads, 0, stream>>>(p);
    } else {
      rms_norm_backward_kernel<T, W, O, 1, kBackwardPacksPerThread, kBackwardRows><<<grid, threads, 0, stream>>>(p);
    }
  }
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  return launch_column_sum<W>(p.dweight_partials, num_partials, p.hidden, static_cast<W*>(p.dweight), stream);
}

bool valid_types(DType x, DType weight, DType out) {
  return (weight == x || weight == DType::kFloat32) && (out == x || out == DType::kFloat32);
}

}  // namespace

int64_t rms_norm_backward_num_partials(int64_t rows) { return num_row_blocks(rows, kBackwardBlocksPerSm); }

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
