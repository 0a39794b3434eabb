// Fused AdamW step over flat buffers (no autograd): CUDA tensors go to cuda::adamw_step (one vectorised
// grid-stride kernel, every buffer read and written once), CPU tensors to the same per-element update in
// an at::parallel_for loop. The math is torch.optim.AdamW's single-tensor update, op for op, in fp32
// (fp64 for fp64 buffers), with ATen's roundings, so the CPU path is bit-identical to the reference
// composition; see kernels/cuda/adamw.h.
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Optional.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <cmath>
#include <type_traits>

#include "kernels/ops/ops.h"

#ifdef TIGON_CUDA_KERNELS
#include "kernels/cuda/adamw.h"
#include "kernels/ops/cuda_glue.h"

static_assert(tigon::ops::kAdamWGradSquarePartials == tigon::cuda::kAdamWGradSquarePartials,
              "the op and the kernel agree on the partials' count");
#endif

namespace tigon::ops {
namespace {

// The scalars of one step, each computed in double and rounded once to the math type, the way torch
// passes Python floats to its tensor ops.
template <typename acc_t>
struct StepScalars {
  acc_t decay_factor, one_minus_beta1, beta2, one_minus_beta2, step_size, bias_correction2_sqrt, eps, grad_scale;

  explicit StepScalars(const AdamWOptions& o) {
    const double step = static_cast<double>(o.step);
    decay_factor = static_cast<acc_t>(1 - o.lr * o.weight_decay);
    one_minus_beta1 = static_cast<acc_t>(1 - o.beta1);
    beta2 = static_cast<acc_t>(o.beta2);
    one_minus_beta2 = static_cast<acc_t>(1 - o.beta2);
    step_size = static_cast<acc_t>(o.lr / (1 - std::pow(o.beta1, step)));
    bias_correction2_sqrt = static_cast<acc_t>(std::sqrt(1 - std::pow(o.beta2, step)));
    eps = static_cast<acc_t>(o.eps);
    grad_scale = static_cast<acc_t>(o.grad_scale);
  }
};

struct NoCopy {};

template <typename P, typename G, typename S, typename C>
void AdamWCpu(P* param, const G* grad, S* exp_avg, S* exp_avg_sq, C* copy, int64_t n, const AdamWOptions& options) {
  using acc_t = std::conditional_t<std::is_same<P, double>::value, double, float>;
  const StepScalars<acc_t> a(options);
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      acc_t p = static_cast<acc_t>(param[i]);
      const acc_t g = static_cast<acc_t>(grad[i]) * a.grad_scale;
      acc_t m = static_cast<acc_t>(exp_avg[i]);
      acc_t v = static_cast<acc_t>(exp_avg_sq[i]);
      // ATen's op order and roundings: lerp and addcmul are single FMAs in its kernels, addcdiv is
      // self + (value * t1) / t2.
      p = p * a.decay_factor;
      const acc_t w = a.one_minus_beta1;
      m = w < acc_t(0.5) ? std::fma(w, g - m, m) : std::fma(w - acc_t(1), g - m, g);
      v = std::fma(a.one_minus_beta2 * g, g, v * a.beta2);
      const acc_t denom = std::sqrt(v) / a.bias_correction2_sqrt + a.eps;
      p = p + (-a.step_size * m) / denom;
      param[i] = static_cast<P>(p);
      exp_avg[i] = static_cast<S>(m);
      exp_avg_sq[i] = static_cast<S>(v);
      if constexpr (!std::is_same<C, NoCopy>::value) copy[i] = static_cast<C>(p);
    }
  });
}

// Runtime dtypes to template types, one level at a time.
template <typename F>
void WithFloatType(torch::ScalarType t, F&& f) {
  switch (t) {
    case torch::kDouble:
      f(double{});
      break;
    case torch::kFloat:
      f(float{});
      break;
    case torch::kBFloat16:
      f(at::BFloat16{});
      break;
    case torch::kHalf:
      f(at::Half{});
      break;
    default:
      TORCH_CHECK(false, "adamw_step: unsupported dtype ", t);
  }
}

template <typename P>
void AdamWCpuForParam(torch::Tensor& param, const torch::Tensor& grad, torch::Tensor& exp_avg,
                      torch::Tensor& exp_avg_sq, const AdamWOptions& options, const torch::Tensor& param_copy) {
  const int64_t n = param.numel();
  auto with_copy = [&](auto g_tag, auto s_tag) {
    using G = decltype(g_tag);
    using S = decltype(s_tag);
    P* p = param.data_ptr<P>();
    const G* g = grad.data_ptr<G>();
    S* m = exp_avg.data_ptr<S>();
    S* v = exp_avg_sq.data_ptr<S>();
    if (!param_copy.defined()) {
      AdamWCpu<P, G, S, NoCopy>(p, g, m, v, nullptr, n, options);
    } else {
      WithFloatType(param_copy.scalar_type(), [&](auto c_tag) {
        using C = decltype(c_tag);
        AdamWCpu<P, G, S, C>(p, g, m, v, param_copy.data_ptr<C>(), n, options);
      });
    }
  };
  WithFloatType(grad.scalar_type(), [&](auto g_tag) {
    if (exp_avg.scalar_type() == param.scalar_type()) {
      with_copy(g_tag, P{});
    } else {
      with_copy(g_tag, float{});
    }
  });
}

void CheckBuffers(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
                  const torch::Tensor& exp_avg_sq, const torch::Tensor& param_copy,
                  const torch::Tensor& grad_square_partials) {
  const int64_t n = param.numel();
  for (const torch::Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq}) {
    TORCH_CHECK(t->numel() == n, "adamw_step: param, grad, exp_avg and exp_avg_sq must have the same length");
    TORCH_CHECK(t->is_contiguous(), "adamw_step: buffers must be contiguous");
    TORCH_CHECK(t->device() == param.device(), "adamw_step: buffers on different devices");
  }
  const auto p = param.scalar_type();
  TORCH_CHECK(
      p == torch::kFloat || p == torch::kBFloat16 || p == torch::kHalf || (p == torch::kDouble && param.is_cpu()),
      "adamw_step: param must be float32, bfloat16 or float16, got ", p);
  // Any float gradient: bf16 gradients of fp32 master weights are the bf16_mixed policy's case.
  const auto g = grad.scalar_type();
  TORCH_CHECK(
      g == torch::kFloat || g == torch::kBFloat16 || g == torch::kHalf || (g == torch::kDouble && grad.is_cpu()),
      "adamw_step: grad must be float32, bfloat16 or float16, got ", g);
  TORCH_CHECK(exp_avg.scalar_type() == exp_avg_sq.scalar_type(), "adamw_step: exp_avg and exp_avg_sq dtypes differ");
  TORCH_CHECK(exp_avg.scalar_type() == p || exp_avg.scalar_type() == torch::kFloat,
              "adamw_step: optimizer state must be param's dtype or float32, got ", exp_avg.scalar_type());
  if (param_copy.defined()) {
    TORCH_CHECK(param_copy.numel() == n && param_copy.is_contiguous() && param_copy.device() == param.device(),
                "adamw_step: param_copy must be a contiguous buffer of param's length on its device");
  }
  if (grad_square_partials.defined()) {
    TORCH_CHECK(grad_square_partials.scalar_type() == torch::kDouble &&
                    grad_square_partials.numel() == kAdamWGradSquarePartials && grad_square_partials.is_contiguous() &&
                    grad_square_partials.device() == param.device(),
                "adamw_step: grad_square_partials must be a contiguous float64 buffer of ", kAdamWGradSquarePartials,
                " values on param's device");
  }
}

void AdamWStepOp(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
                 const torch::Tensor& exp_avg_sq, double lr, double beta1, double beta2, double eps,
                 double weight_decay, int64_t step, double grad_scale, const c10::optional<torch::Tensor>& param_copy,
                 const c10::optional<torch::Tensor>& grad_square_partials) {
  AdamWOptions options;
  options.lr = lr;
  options.beta1 = beta1;
  options.beta2 = beta2;
  options.eps = eps;
  options.weight_decay = weight_decay;
  options.step = step;
  options.grad_scale = grad_scale;
  torch::Tensor p = param, m = exp_avg, v = exp_avg_sq;
  adamw_step(p, grad, m, v, options, param_copy.has_value() ? *param_copy : torch::Tensor(),
             grad_square_partials.has_value() ? *grad_square_partials : torch::Tensor());
}

}  // namespace

void adamw_step(torch::Tensor& param, const torch::Tensor& grad, torch::Tensor& exp_avg, torch::Tensor& exp_avg_sq,
                const AdamWOptions& options, torch::Tensor param_copy, torch::Tensor grad_square_partials) {
  CheckBuffers(param, grad, exp_avg, exp_avg_sq, param_copy, grad_square_partials);
  TORCH_CHECK(options.step >= 1, "adamw_step: step is 1-based, got ", options.step);
  torch::NoGradGuard no_grad;
  if (param.numel() == 0) {
    if (grad_square_partials.defined()) grad_square_partials.zero_();
    return;
  }
#ifdef TIGON_CUDA_KERNELS
  if (param.is_cuda()) {
    c10::DeviceGuard guard(param.device());
    const StepScalars<double> s(options);
    cuda::AdamWParams a;
    a.param = param.data_ptr();
    a.param_dtype = CudaDType(param);
    a.grad = grad.data_ptr();
    a.grad_dtype = CudaDType(grad);
    a.exp_avg = exp_avg.data_ptr();
    a.exp_avg_sq = exp_avg_sq.data_ptr();
    a.state_dtype = CudaDType(exp_avg);
    if (param_copy.defined()) {
      a.param_copy = param_copy.data_ptr();
      a.param_copy_dtype = CudaDType(param_copy);
    }
    a.n = param.numel();
    a.decay_factor = static_cast<float>(s.decay_factor);
    a.one_minus_beta1 = static_cast<float>(s.one_minus_beta1);
    a.beta2 = static_cast<float>(s.beta2);
    a.one_minus_beta2 = static_cast<float>(s.one_minus_beta2);
    a.step_size = static_cast<float>(s.step_size);
    a.bias_correction2_sqrt = static_cast<float>(s.bias_correction2_sqrt);
    a.eps = static_cast<float>(s.eps);
    a.grad_scale = static_cast<float>(s.grad_scale);
    if (grad_square_partials.defined()) a.grad_square_partials = grad_square_partials.data_ptr<double>();
    CheckLaunch(cuda::adamw_step(a, CurrentCudaStream(param.device())), "adamw_step");
    return;
  }
#endif
  TORCH_CHECK(param.is_cpu(), "adamw_step: this build has no CUDA kernels for ", param.device());
  WithFloatType(param.scalar_type(), [&](auto p_tag) {
    using P = decltype(p_tag);
    if constexpr (std::is_same<P, double>::value) {
      TORCH_CHECK(grad.scalar_type() == torch::kDouble && exp_avg.scalar_type() == torch::kDouble,
                  "adamw_step: float64 param needs float64 grad and state");
    }
    AdamWCpuForParam<P>(param, grad, exp_avg, exp_avg_sq, options, param_copy);
  });
  if (grad_square_partials.defined()) {
    // The CPU path reads the gradient a second time: what matters here is the same sum, not the traffic.
    grad_square_partials.zero_();
    grad_square_partials.narrow(0, 0, 1).copy_(squared_norm(grad).reshape({1}));
  }
}

}  // namespace tigon::ops

TORCH_LIBRARY_FRAGMENT(tigon, m) {
  m.def(
      "adamw_step(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, float lr, "
      "float beta1=0.9, float beta2=0.999, float eps=1e-08, float weight_decay=0.0, int step=1, "
      "float grad_scale=1.0, Tensor(d!)? param_copy=None, Tensor(e!)? grad_square_partials=None) -> ()");
}

TORCH_LIBRARY_IMPL(tigon, CompositeImplicitAutograd, m) { m.impl("adamw_step", &tigon::ops::AdamWStepOp); }
