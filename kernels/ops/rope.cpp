// Rotary position embedding on q and k together as an autograd function (RopeFunction). CUDA tensors go to
// kernels/cuda/rope.cu (one launch for q and k); CPU tensors run the same rotation here with ATen ops in fp32
// (float64 for float64 inputs).
// Saved: cos and sin only. Backward applies the transposed rotation (by -sin) to the incoming gradients.
// cos/sin are cast to q's dtype first, as Hugging Face's rotary embedding module returns them; outputs have
// q's (and k's) dtype. No gradient flows to cos/sin (they are buffers of the rotary module).
#include "kernels/cuda/rope.h"

#include <c10/core/DeviceGuard.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "kernels/ops/cuda_glue.h"
#include "kernels/ops/op_helpers.h"
#include "kernels/ops/ops.h"

namespace tigon::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

void CheckInputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos, const torch::Tensor& sin) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4, "tigon::rope: q and k must be [B, H, T, D], got ", q.sizes(), " and ",
              k.sizes());
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(2) == k.size(2) && q.size(3) == k.size(3), "tigon::rope: q ", q.sizes(),
              " and k ", k.sizes(), " differ outside the head dim");
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), "tigon::rope: q is ", q.scalar_type(), ", k is ", k.scalar_type());
  TORCH_CHECK(q.size(3) % 2 == 0, "tigon::rope: head dim must be even, got ", q.size(3));
  TORCH_CHECK(cos.sizes() == sin.sizes(), "tigon::rope: cos ", cos.sizes(), " and sin ", sin.sizes(), " differ");
  TORCH_CHECK(cos.dim() == 2 || cos.dim() == 3, "tigon::rope: cos/sin must be [T, D] or [B, T, D], got ", cos.sizes());
  TORCH_CHECK(cos.size(-1) == q.size(3) && cos.size(-2) == q.size(2), "tigon::rope: cos/sin ", cos.sizes(),
              " do not match T = ", q.size(2), ", D = ", q.size(3));
  TORCH_CHECK(cos.dim() == 2 || cos.size(0) == 1 || cos.size(0) == q.size(0), "tigon::rope: cos/sin batch ",
              cos.size(0), " vs q batch ", q.size(0));
  TORCH_CHECK(k.device() == q.device() && cos.device() == q.device() && sin.device() == q.device(),
              "tigon::rope: q, k, cos and sin must be on one device");
}

// cos/sin as [B or 1, 1, T, D] in `dtype`, broadcasting over heads.
torch::Tensor Table(const torch::Tensor& t, torch::ScalarType dtype) {
  auto table = t.dim() == 2 ? t.unsqueeze(0) : t;
  return table.to(dtype).unsqueeze(1);
}

// ---- CPU fused path -------------------------------------------------------------------------------------

// The rotation (forward) or its transpose (backward), in the accumulate type, rounded once.
torch::Tensor RotateCpu(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, bool backward) {
  const auto acc = AccumulateType(x.scalar_type());
  const int64_t half = x.size(3) / 2;
  auto xf = x.to(acc);
  auto c = Table(cos, x.scalar_type()).to(acc);
  auto s = Table(sin, x.scalar_type()).to(acc);
  auto x1 = xf.slice(3, 0, half), x2 = xf.slice(3, half);
  auto c1 = c.slice(3, 0, half), c2 = c.slice(3, half);
  auto s1 = s.slice(3, 0, half), s2 = s.slice(3, half);
  torch::Tensor y1, y2;
  if (!backward) {
    y1 = x1 * c1 - x2 * s1;
    y2 = x2 * c2 + x1 * s2;
  } else {
    y1 = x1 * c1 + x2 * s2;
    y2 = x2 * c2 - x1 * s1;
  }
  return torch::cat({y1, y2}, 3).to(x.scalar_type());
}

// ---- CUDA path ------------------------------------------------------------------------------------------

#ifdef TIGON_CUDA_KERNELS
torch::Tensor UnitLastStride(const torch::Tensor& t) {
  return t.stride(-1) == 1 ? t : t.contiguous();
}

void FillRopeTensor(cuda::RopeTensor& dst, const torch::Tensor& in, const torch::Tensor& out) {
  dst.in = in.data_ptr();
  dst.out = out.data_ptr();
  dst.heads = in.size(1);
  for (int dim = 0; dim < 3; ++dim) {  // batch, head, position
    dst.in_strides[dim] = in.stride(dim);
    dst.out_strides[dim] = out.stride(dim);
  }
}

std::pair<torch::Tensor, torch::Tensor> RotateCuda(const torch::Tensor& q_in, const torch::Tensor& k_in,
                                                   const torch::Tensor& cos_in, const torch::Tensor& sin_in,
                                                   bool backward) {
  auto q = UnitLastStride(q_in), k = UnitLastStride(k_in);
  // [B or 1, T, D] with a unit stride over D; a batch of one broadcasts through a zero stride.
  auto cos = UnitLastStride(Table(cos_in, q.scalar_type()).squeeze(1));
  auto sin = UnitLastStride(Table(sin_in, q.scalar_type()).squeeze(1));
  auto q_out = torch::empty_like(q), k_out = torch::empty_like(k);
  if (q.numel() == 0 && k.numel() == 0) return {q_out, k_out};
  cuda::RopeParams p;
  FillRopeTensor(p.q, q, q_out);
  FillRopeTensor(p.k, k, k_out);
  p.cos = cos.data_ptr();
  p.sin = sin.data_ptr();
  p.cos_strides[0] = cos.size(0) == 1 ? 0 : cos.stride(0);
  p.cos_strides[1] = cos.stride(1);
  p.sin_strides[0] = sin.size(0) == 1 ? 0 : sin.stride(0);
  p.sin_strides[1] = sin.stride(1);
  p.batch = q.size(0);
  p.seq_len = q.size(2);
  p.head_dim = q.size(3);
  p.dtype = CudaDType(q);
  p.backward = backward;
  CheckLaunch(cuda::rope_apply(p, CurrentCudaStream(q.device())), backward ? "rope_backward" : "rope_forward");
  return {q_out, k_out};
}
#endif  // TIGON_CUDA_KERNELS

std::pair<torch::Tensor, torch::Tensor> Rotate(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                                               const torch::Tensor& sin, bool backward) {
#ifdef TIGON_CUDA_KERNELS
  if (q.is_cuda()) return RotateCuda(q, k, cos, sin, backward);
#endif
  return {RotateCpu(q, cos, sin, backward), RotateCpu(k, cos, sin, backward)};
}

// ---- autograd function ----------------------------------------------------------------------------------

class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& cos, const torch::Tensor& sin) {
    CheckInputs(q, k, cos, sin);
    c10::OptionalDeviceGuard guard(q.device());
    auto [q_out, k_out] = Rotate(q, k, cos, sin, /*backward=*/false);
    ctx->save_for_backward({cos, sin});
    return {q_out, k_out};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    c10::OptionalDeviceGuard guard(grad_outputs[0].device());
    // Gradients from SDPA arrive non-contiguous; the kernels take any strides with a unit last stride.
    auto [dq, dk] = Rotate(grad_outputs[0], grad_outputs[1], saved[0], saved[1], /*backward=*/true);
    return {dq, dk, torch::Tensor(), torch::Tensor()};
  }
};

std::tuple<torch::Tensor, torch::Tensor> RopeOp(const torch::Tensor& q, const torch::Tensor& k,
                                                const torch::Tensor& cos, const torch::Tensor& sin) {
  auto outputs = RopeFunction::apply(q, k, cos, sin);
  return {outputs[0], outputs[1]};
}

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> rope(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                                              const torch::Tensor& sin) {
  return RopeOp(q, k, cos, sin);
}

}  // namespace tigon::ops

TORCH_LIBRARY_FRAGMENT(tigon, m) {
  m.def("rope(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tigon, CompositeImplicitAutograd, m) {
  m.impl("rope", &tigon::ops::RopeOp);
}
