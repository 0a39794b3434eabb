// The gated activations: one set of kernels and launchers templated on the activation (Act: value(a),
// value_and_grad(a, value, grad)), and the entry points of SwiGLU and GeGLU (contract in glu.h).
//
// Elementwise over [rows, cols] with 16-byte packs. Rows that lie back to back (row stride == cols for
// every operand) are treated as one long row, so the usual contiguous case is a flat grid-stride loop;
// otherwise blocks stride over rows (gridDim.y) and over packs within a row (gridDim.x).
#include "kernels/cuda/glu.h"

#include "kernels/cuda/common.cuh"

namespace tigon::cuda::glu {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 16;

struct Geometry {
  int64_t rows, cols;  // after folding back-to-back rows into one
};

template <typename T, int kVec, typename Act>
__global__ void __launch_bounds__(kThreads) forward_kernel(const GluForwardParams p, const Geometry g) {
  const int64_t packs = g.cols / kVec;
  for (int64_t row = blockIdx.y; row < g.rows; row += gridDim.y) {
    const T* a = static_cast<const T*>(p.a.data) + row * p.a.row_stride;
    const T* b = static_cast<const T*>(p.b.data) + row * p.b.row_stride;
    T* y = static_cast<T*>(p.y.data) + row * p.y.row_stride;
    for (int64_t pack = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; pack < packs;
         pack += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float av[kVec], bv[kVec], yv[kVec];
      load_floats<T, kVec>(a + pack * kVec, av);
      load_floats<T, kVec>(b + pack * kVec, bv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) yv[e] = Act::value(av[e]) * bv[e];
      store_floats<T, kVec>(y + pack * kVec, yv);
    }
  }
}

// Each pack's loads (dy, a, b) come before its stores (da, db and, with kStoreH, h), and no pointer is
// __restrict__: an output may be one of the inputs (in place, same layout). h is Act::value(a) * b, the
// forward kernel's expression, so it equals the forward's output bit for bit.
template <typename T, int kVec, typename Act, bool kStoreH>
__global__ void __launch_bounds__(kThreads) backward_kernel(const GluBackwardParams p, const Geometry g) {
  const int64_t packs = g.cols / kVec;
  for (int64_t row = blockIdx.y; row < g.rows; row += gridDim.y) {
    const T* dy = static_cast<const T*>(p.dy.data) + row * p.dy.row_stride;
    const T* a = static_cast<const T*>(p.a.data) + row * p.a.row_stride;
    const T* b = static_cast<const T*>(p.b.data) + row * p.b.row_stride;
    T* da = static_cast<T*>(p.da.data) + row * p.da.row_stride;
    T* db = static_cast<T*>(p.db.data) + row * p.db.row_stride;
    T* h = kStoreH ? static_cast<T*>(p.h.data) + row * p.h.row_stride : nullptr;
    for (int64_t pack = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; pack < packs;
         pack += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float dyv[kVec], av[kVec], bv[kVec], dav[kVec], dbv[kVec], hv[kVec];
      load_floats<T, kVec>(dy + pack * kVec, dyv);
      load_floats<T, kVec>(a + pack * kVec, av);
      load_floats<T, kVec>(b + pack * kVec, bv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float act, act_grad;
        Act::value_and_grad(av[e], act, act_grad);
        dav[e] = dyv[e] * bv[e] * act_grad;
        dbv[e] = dyv[e] * act;
        if (kStoreH) hv[e] = Act::value(av[e]) * bv[e];
      }
      store_floats<T, kVec>(da + pack * kVec, dav);
      store_floats<T, kVec>(db + pack * kVec, dbv);
      if (kStoreH) store_floats<T, kVec>(h + pack * kVec, hv);
    }
  }
}

// Operand pointers and row strides, for the layout checks.
struct Layout {
  const void* ptrs[6];
  int64_t strides[6];
  int count;
};

inline Geometry fold(const Layout& l, int64_t rows, int64_t cols) {
  bool back_to_back = true;
  for (int i = 0; i < l.count; ++i) back_to_back = back_to_back && (rows == 1 || l.strides[i] == cols);
  return back_to_back ? Geometry{1, rows * cols} : Geometry{rows, cols};
}

inline bool vectorizable(const Layout& l, const Geometry& g, int vec, int elem_size) {
  if (g.cols % vec != 0) return false;
  for (int i = 0; i < l.count; ++i) {
    if (!is_aligned(l.ptrs[i], vec * elem_size) || (g.rows > 1 && l.strides[i] % vec != 0)) return false;
  }
  return true;
}

inline dim3 grid_for(const Geometry& g, int64_t packs_per_row) {
  const int64_t target = static_cast<int64_t>(current_device_sm_count()) * kBlocksPerSm;
  const int64_t grid_y = g.rows < 65535 ? g.rows : 65535;
  int64_t grid_x = (packs_per_row + kThreads - 1) / kThreads;
  const int64_t x_cap = (target + grid_y - 1) / grid_y;
  if (grid_x > x_cap) grid_x = x_cap;
  if (grid_x < 1) grid_x = 1;
  return dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
}

template <typename T, typename Act>
cudaError_t launch_forward(const GluForwardParams& p, cudaStream_t stream) {
  constexpr int kVec = kElemsPer16Bytes<T>;
  const Layout l{{p.a.data, p.b.data, p.y.data}, {p.a.row_stride, p.b.row_stride, p.y.row_stride}, 3};
  const Geometry g = fold(l, p.rows, p.cols);
  if (vectorizable(l, g, kVec, sizeof(T))) {
    forward_kernel<T, kVec, Act><<<grid_for(g, g.cols / kVec), kThreads, 0, stream>>>(p, g);
  } else {
    forward_kernel<T, 1, Act><<<grid_for(g, g.cols), kThreads, 0, stream>>>(p, g);
  }
  return cudaGetLastError();
}

template <typename T, typename Act, bool kStoreH>
void launch_backward_as(const GluBackwardParams& p, const Layout& l, cudaStream_t stream) {
  constexpr int kVec = kElemsPer16Bytes<T>;
  const Geometry g = fold(l, p.rows, p.cols);
  if (vectorizable(l, g, kVec, sizeof(T))) {
    backward_kernel<T, kVec, Act, kStoreH><<<grid_for(g, g.cols / kVec), kThreads, 0, stream>>>(p, g);
  } else {
    backward_kernel<T, 1, Act, kStoreH><<<grid_for(g, g.cols), kThreads, 0, stream>>>(p, g);
  }
}

template <typename T, typename Act>
cudaError_t launch_backward(const GluBackwardParams& p, cudaStream_t stream) {
  const bool store_h = p.h.data != nullptr;
  const Layout l{{p.dy.data, p.a.data, p.b.data, p.da.data, p.db.data, p.h.data},
                 {p.dy.row_stride, p.a.row_stride, p.b.row_stride, p.da.row_stride, p.db.row_stride, p.h.row_stride},
                 store_h ? 6 : 5};
  if (store_h) {
    launch_backward_as<T, Act, true>(p, l, stream);
  } else {
    launch_backward_as<T, Act, false>(p, l, stream);
  }
  return cudaGetLastError();
}

}  // namespace tigon::cuda::glu

namespace tigon::cuda {
namespace {

// silu(a) = a * sigmoid(a); silu'(a) = s (1 + a (1 - s)). expf keeps fp32 within 1e-6 relative.
struct SiLU {
  __device__ __forceinline__ static float value(float a) { return a / (1.f + expf(-a)); }
  __device__ __forceinline__ static void value_and_grad(float a, float& value, float& grad) {
    const float s = 1.f / (1.f + expf(-a));
    value = a * s;
    grad = s * (1.f + a * (1.f - s));
  }
};

// gelu_tanh(a) = 0.5 a (1 + tanh(u)) = a * sigmoid(2u), u = sqrt(2/pi) (a + 0.044715 a^3): the sigmoid form
// has no cancellation for large negative a (1 + tanh(u) underflows gracefully), so fp32 stays within 1e-6.
// gelu'(a) = s + 2 a s (1 - s) u'(a), s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3 * 0.044715 a^2).
struct GeluTanh {
  static constexpr float kSqrt2OverPi = 0.7978845608028654f;
  static constexpr float kCubic = 0.044715f;
  __device__ __forceinline__ static float value(float a) {
    const float u = kSqrt2OverPi * (a + kCubic * a * a * a);
    return a / (1.f + expf(-2.f * u));
  }
  __device__ __forceinline__ static void value_and_grad(float a, float& value, float& grad) {
    const float u = kSqrt2OverPi * (a + kCubic * a * a * a);
    const float s = 1.f / (1.f + expf(-2.f * u));
    value = a * s;
    grad = s + 2.f * a * s * (1.f - s) * kSqrt2OverPi * (1.f + 3.f * kCubic * a * a);
  }
};

template <typename Act>
LaunchStatus forward(const GluForwardParams& p, void* stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  return dispatch_float_type(p.dtype, [&](auto tag) {
    return glu::launch_forward<typename decltype(tag)::type, Act>(p, static_cast<cudaStream_t>(stream));
  });
}

template <typename Act>
LaunchStatus backward(const GluBackwardParams& p, void* stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  return dispatch_float_type(p.dtype, [&](auto tag) {
    return glu::launch_backward<typename decltype(tag)::type, Act>(p, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace

LaunchStatus swiglu_forward(const GluForwardParams& p, void* stream) { return forward<SiLU>(p, stream); }
LaunchStatus swiglu_backward(const GluBackwardParams& p, void* stream) { return backward<SiLU>(p, stream); }
LaunchStatus geglu_forward(const GluForwardParams& p, void* stream) { return forward<GeluTanh>(p, stream); }
LaunchStatus geglu_backward(const GluBackwardParams& p, void* stream) { return backward<GeluTanh>(p, stream); }

}  // namespace tigon::cuda
