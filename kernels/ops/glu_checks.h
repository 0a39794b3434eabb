// Operand checks shared by the gated activations (swiglu.cpp, geglu.cpp); `op` names the op in messages.
#pragma once

#include <ATen/MemoryOverlap.h>
#include <torch/types.h>

namespace tigon::ops::detail {

inline void CheckGluInputs(const char* op, const torch::Tensor& a, const torch::Tensor& b) {
  TORCH_CHECK(a.dim() >= 1, "tigon::", op, ": a needs at least one dim");
  TORCH_CHECK(a.sizes() == b.sizes(), "tigon::", op, ": a ", a.sizes(), " and b ", b.sizes(), " differ");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "tigon::", op, ": a is ", a.scalar_type(), ", b is ",
              b.scalar_type());
  TORCH_CHECK(a.device() == b.device(), "tigon::", op, ": a and b on different devices");
}

// dy like a; da, db and h (optional: undefined for none) contiguous like a, apart from each other, and
// each either exactly one of dy, a, b (same elements, same strides) or apart from all three.
inline void CheckGluBackwardOperands(const char* op, const torch::Tensor& dy, const torch::Tensor& a,
                                     const torch::Tensor& b, const torch::Tensor& da, const torch::Tensor& db,
                                     const torch::Tensor& h) {
  CheckGluInputs(op, a, b);
  TORCH_CHECK(dy.sizes() == a.sizes() && dy.scalar_type() == a.scalar_type() && dy.device() == a.device(),
              "tigon::", op, "_backward_out: dy must match a (", a.sizes(), ", ", a.scalar_type(), "), got ",
              dy.sizes(), ", ", dy.scalar_type());
  for (const auto* out : {&da, &db, &h}) {
    if (!out->defined()) continue;  // h only
    TORCH_CHECK(out->sizes() == a.sizes() && out->scalar_type() == a.scalar_type() && out->device() == a.device() &&
                    out->is_contiguous(),
                "tigon::", op, "_backward_out: da, db and h must be contiguous with a's shape, dtype and device");
    for (const auto* in : {&dy, &a, &b}) at::assert_no_partial_overlap(*out, *in);
  }
  at::assert_no_overlap(da, db);
  if (h.defined()) {
    at::assert_no_overlap(h, da);
    at::assert_no_overlap(h, db);
  }
}

}  // namespace tigon::ops::detail
