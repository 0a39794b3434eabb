// GeGLU, gelu_tanh(a) * b: the fused CPU path (tigon::ops) against Hugging Face's gelu_pytorch_tanh(gate) * up
// (tigon::reference), forward and gradients, on odd shapes and on the strided halves of one fused
// gate_up projection (as in fused gate_up checkpoints).
// geglu_backward_out (the same backward outside autograd, da written over dy) against the autograd backward
// bit for bit and against the float64 reference, in fp32, float64, bf16 and fp16.
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "kernels/ops/ops.h"
#include "kernels/reference/reference.h"
#include "tests/kernels/glu_backward_out_checks.h"

namespace {

using glu_backward_out_checks::ExpectClose;

const std::vector<std::vector<int64_t>> kShapes = {{5, 4095}, {1, 14}, {2, 3, 37}, {1}};

TEST(GeGLUCpu, ForwardMatchesReference) {
  torch::manual_seed(501);
  for (const auto& shape : kShapes) {
    // Wide range of gate values: gelu saturates on both sides.
    auto a = torch::randn(shape) * 4.0;
    auto b = torch::randn(shape);
    ExpectClose(tigon::ops::geglu(a, b), tigon::reference::geglu(a.to(torch::kDouble), b.to(torch::kDouble)),
                // fp32: tanh, a few products, a few ulps (1e-5 relative); atol for gelu(a) ~ 0.
                1e-6, 1e-5, "fp32 " + c10::str(c10::IntArrayRef(shape)));
    auto a16 = a.to(torch::kBFloat16), b16 = b.to(torch::kBFloat16);
    auto fused16 = tigon::ops::geglu(a16, b16);
    EXPECT_EQ(fused16.scalar_type(), torch::kBFloat16);
    // bf16: computed in fp32 from the bf16 inputs and rounded once (2^-8 relative).
    ExpectClose(fused16, tigon::reference::geglu(a16.to(torch::kDouble), b16.to(torch::kDouble)), 1e-3, 1e-2,
                "bf16 " + c10::str(c10::IntArrayRef(shape)));
  }
}

TEST(GeGLUCpu, GradientsMatchReferenceAutogradFloat64) {
  torch::manual_seed(502);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  for (const auto& shape : kShapes) {
    auto a = (torch::randn(shape, opts) * 4.0).requires_grad_(true);
    auto b = torch::randn(shape, opts).requires_grad_(true);
    auto dy = torch::randn(shape, opts);
    auto fused = tigon::ops::geglu(a, b);
    auto ref = tigon::reference::geglu(a, b);
    ExpectClose(fused, ref, 1e-13, 1e-12, "forward");
    auto g = torch::autograd::grad({fused}, {a, b}, {dy});
    auto g_ref = torch::autograd::grad({ref}, {a, b}, {dy});
    ExpectClose(g[0], g_ref[0], 1e-12, 1e-10, "da " + c10::str(c10::IntArrayRef(shape)));
    ExpectClose(g[1], g_ref[1], 1e-12, 1e-10, "db " + c10::str(c10::IntArrayRef(shape)));
  }
}

TEST(GeGLUCpu, StridedHalvesOfAFusedProjection) {
  torch::manual_seed(503);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  auto gate_up = torch::randn({6, 2 * 45}, opts).requires_grad_(true);
  auto halves = gate_up.chunk(2, -1);
  auto a = halves[0], b = halves[1];
  ASSERT_FALSE(a.is_contiguous());
  auto dy = torch::randn({45, 6}, opts).t();  // and a transposed incoming gradient
  auto fused = tigon::ops::geglu(a, b);
  auto ref = tigon::reference::geglu(a, b);
  ExpectClose(fused, ref, 1e-13, 1e-12, "strided forward");
  auto g = torch::autograd::grad({fused}, {gate_up}, {dy});
  auto g_ref = torch::autograd::grad({ref}, {gate_up}, {dy});
  ExpectClose(g[0], g_ref[0], 1e-12, 1e-10, "d gate_up");
}

TEST(GeGLUCpu, Bf16GradientsWithinTolerance) {
  torch::manual_seed(504);
  auto a = (torch::randn({17, 301}) * 3.0).to(torch::kBFloat16).requires_grad_(true);
  auto b = torch::randn({17, 301}).to(torch::kBFloat16).requires_grad_(true);
  auto dy = torch::randn({17, 301}).to(torch::kBFloat16);
  auto ar = a.detach().to(torch::kDouble).requires_grad_(true);
  auto br = b.detach().to(torch::kDouble).requires_grad_(true);
  auto g = torch::autograd::grad({tigon::ops::geglu(a, b)}, {a, b}, {dy});
  auto g_ref = torch::autograd::grad({tigon::reference::geglu(ar, br)}, {ar, br}, {dy.to(torch::kDouble)});
  // fp32 math from bf16 inputs, one rounding of each gradient (2^-8 relative).
  ExpectClose(g[0], g_ref[0], 1e-3, 1e-2, "bf16 da");
  ExpectClose(g[1], g_ref[1], 1e-3, 1e-2, "bf16 db");
}

TEST(GeGLUCpu, RegisteredTorchOpRunsWithAutograd) {
  torch::manual_seed(505);
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("tigon::geglu", "")
                .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>();
  auto a = torch::randn({3, 10}, torch::kDouble).requires_grad_(true);
  auto b = torch::randn({3, 10}, torch::kDouble).requires_grad_(true);
  auto y = op.call(a, b);
  auto y_ref = tigon::reference::geglu(a, b);
  ExpectClose(y, y_ref, 1e-13, 1e-12, "torch op forward");
  auto g = torch::autograd::grad({y.sum()}, {a, b});
  auto g_ref = torch::autograd::grad({y_ref.sum()}, {a, b});
  ExpectClose(g[0], g_ref[0], 1e-12, 1e-10, "torch op da");
  ExpectClose(g[1], g_ref[1], 1e-12, 1e-10, "torch op db");
}

TEST(GeGLUCpu, RejectsMismatchedInputs) {
  EXPECT_THROW(tigon::ops::geglu(torch::randn({2, 3}), torch::randn({2, 4})), c10::Error);
  EXPECT_THROW(tigon::ops::geglu(torch::randn({2, 3}), torch::randn({2, 3}).to(torch::kBFloat16)), c10::Error);
}

// ---- geglu_backward_out: the backward outside autograd, in place over dy (glu_backward_out_checks.h) ----

const glu_backward_out_checks::GluOp kGeGLU = {tigon::ops::geglu, tigon::ops::geglu_backward_out,
                                               tigon::reference::geglu_backward_out};

TEST(GeGLUCpu, BackwardOutInPlaceIsBitIdenticalToAutograd) {
  torch::manual_seed(506);
  glu_backward_out_checks::ExpectBackwardOutInPlaceBitIdenticalToAutograd(kGeGLU);
}

TEST(GeGLUCpu, BackwardOutMatchesReferenceInFloat64) {
  torch::manual_seed(507);
  // da = dy b gelu'(a) has a cancellation in s + 2 a s (1 - s) u'(a) for negative a, hence the absolute floor.
  glu_backward_out_checks::ExpectBackwardOutMatchesReferenceInFloat64(kGeGLU);
}

TEST(GeGLUCpu, BackwardOutWritesTheForwardOutputBitForBit) {
  torch::manual_seed(418);
  glu_backward_out_checks::ExpectBackwardOutWritesTheForwardOutput(kGeGLU);
}

TEST(GeGLUCpu, BackwardOutRejectsBadOutputs) {
  glu_backward_out_checks::ExpectBackwardOutRejectsBadOutputs(tigon::ops::geglu_backward_out);
}

}  // namespace
