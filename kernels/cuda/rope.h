// Rotary position embedding, Hugging Face's half-split (rotate_half) layout, q and k in one launch
// (launchers; no CUDA or torch headers here).
//
// For each (batch b, position t, head), with half = D / 2, i < half, c = cos[b, t], s = sin[b, t]:
//   forward:  y[i] = x[i] c[i] - x[i + half] s[i];        y[i + half] = x[i + half] c[i + half] + x[i] s[i + half]
//   backward (the transposed rotation, i.e. by -sin when both halves of cos/sin are equal):
//             dx[i] = dy[i] c[i] + dy[i + half] s[i + half]; dx[i + half] = dy[i + half] c[i + half] - dy[i] s[i]
// Nothing is saved but cos and sin. The same kernel serves both directions (`backward` flag).
// q/k/outputs are [B, H, T, D] with any strides except a unit stride over D; cos/sin are [B or 1, T, D]
// with a unit stride over D (batch stride 0 broadcasts one table). Outputs may alias inputs. 64-bit offsets.
#pragma once

#include <cstdint>

#include "kernels/cuda/dtype.h"

namespace tigon::cuda {

struct RopeTensor {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t heads = 0;
  int64_t in_strides[3] = {0, 0, 0};  // batch, head, position (elements)
  int64_t out_strides[3] = {0, 0, 0};
};

struct RopeParams {
  RopeTensor q;
  RopeTensor k;  // k.heads == 0: q only
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t cos_strides[2] = {0, 0};  // batch (0 = shared), position; same for sin
  int64_t sin_strides[2] = {0, 0};
  int64_t batch = 0;
  int64_t seq_len = 0;
  int64_t head_dim = 0;           // even
  DType dtype = DType::kFloat32;  // q, k, cos, sin and outputs
  bool backward = false;
};

LaunchStatus rope_apply(const RopeParams& params, void* stream);

}  // namespace tigon::cuda
