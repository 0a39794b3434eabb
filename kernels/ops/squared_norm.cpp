// sum(x^2) accumulated in fp64, the global gradient norm's core (no autograd). CUDA tensors go to
// cuda::squared_norm (one read of the buffer); CPU tensors are summed in fixed chunks of 2^16 elements in
// parallel, then the chunk sums in order, so the result does not depend on the thread count.
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <vector>

#include "kernels/ops/ops.h"

#ifdef TIGON_CUDA_KERNELS
#include "kernels/cuda/squared_norm.h"
#include "kernels/ops/cuda_glue.h"
#endif

namespace tigon::ops {
namespace {

template <typename T>
double SquaredNormCpu(const T* x, int64_t n) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> sums(static_cast<size_t>(chunks), 0.0);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      double acc = 0.0;
      const int64_t stop = std::min(n, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < stop; ++i) {
        const double v = static_cast<double>(x[i]);
        acc += v * v;
      }
      sums[static_cast<size_t>(c)] = acc;
    }
  });
  double total = 0.0;
  for (double s : sums) total += s;
  return total;
}

}  // namespace

torch::Tensor squared_norm(const torch::Tensor& x) {
  TORCH_CHECK(x.defined(), "squared_norm: undefined tensor");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kHalf || dtype == torch::kDouble,
              "squared_norm: x must be a floating-point tensor, got ", dtype);
  torch::NoGradGuard no_grad;
  const torch::Tensor flat = x.contiguous();
  const auto out_options = torch::TensorOptions().dtype(torch::kDouble).device(x.device());
  if (flat.numel() == 0) return torch::zeros({}, out_options);
#ifdef TIGON_CUDA_KERNELS
  if (flat.is_cuda()) {
    TORCH_CHECK(dtype != torch::kDouble, "squared_norm: float64 CUDA tensors are not supported");
    c10::DeviceGuard guard(flat.device());
    torch::Tensor out = torch::empty({}, out_options);
    torch::Tensor partials = torch::empty({cuda::squared_norm_partials(flat.numel())}, out_options);
    cuda::SquaredNormParams p;
    p.x = flat.data_ptr();
    p.dtype = CudaDType(flat);
    p.n = flat.numel();
    p.partials = partials.data_ptr<double>();
    p.out = out.data_ptr<double>();
    CheckLaunch(cuda::squared_norm(p, CurrentCudaStream(flat.device())), "squared_norm");
    return out;
  }
#endif
  TORCH_CHECK(flat.is_cpu(), "squared_norm: this build has no CUDA kernels for ", flat.device());
  double total = 0.0;
  switch (dtype) {
    case torch::kDouble: total = SquaredNormCpu(flat.data_ptr<double>(), flat.numel()); break;
    case torch::kFloat: total = SquaredNormCpu(flat.data_ptr<float>(), flat.numel()); break;
    case torch::kBFloat16: total = SquaredNormCpu(flat.data_ptr<at::BFloat16>(), flat.numel()); break;
    default: total = SquaredNormCpu(flat.data_ptr<at::Half>(), flat.numel()); break;
  }
  return torch::full({}, total, out_options);
}

}  // namespace tigon::ops

TORCH_LIBRARY_FRAGMENT(tigon, m) { m.def("squared_norm(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(tigon, CompositeImplicitAutograd, m) { m.impl("squared_norm", &tigon::ops::squared_norm); }
