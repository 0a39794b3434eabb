// The gated activations, each test run for both: SwiGLU, silu(a) * b, and GeGLU, gelu_tanh(a) * b. The
// fused CPU path (tigon::ops) against Hugging Face's act_fn(gate) * up (tigon::reference), forward and
// gradients, on odd shapes and on the strided halves of one fused gate_up projection (Phi3's layout).
// swiglu_backward_out / geglu_backward_out (the same backward outside autograd, da written over dy) against
// the autograd backward bit for bit and against the float64 reference, in fp32, float64, bf16 and fp16.
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

// One gated activation: its fused and reference functions, its torch op, and the seed of each test below.
struct Glu {
  std::string name;  // the torch op: tigon::<name>
  glu_backward_out_checks::GluOp op;
  glu_backward_out_checks::GluForward reference;
  int seeds[8];
};

const Glu kSwiGLU = {"swiglu",
                     {tigon::ops::swiglu, tigon::ops::swiglu_backward_out, tigon::reference::swiglu_backward_out},
                     tigon::reference::swiglu,
                     {401, 402, 403, 404, 405, 406, 407, 408}};
const Glu kGeGLU = {"geglu",
                    {tigon::ops::geglu, tigon::ops::geglu_backward_out, tigon::reference::geglu_backward_out},
                    tigon::reference::geglu,
                    {501, 502, 503, 504, 505, 506, 507, 418}};

class GluCpu : public testing::TestWithParam<Glu> {};

INSTANTIATE_TEST_SUITE_P(Activations, GluCpu, testing::Values(kSwiGLU, kGeGLU),
                         [](const testing::TestParamInfo<Glu>& info) { return info.param.name; });

TEST_P(GluCpu, ForwardMatchesReference) {
  const Glu& glu = GetParam();
  torch::manual_seed(glu.seeds[0]);
  for (const auto& shape : kShapes) {
    // Wide range of gate values: silu and gelu saturate on both sides.
    auto a = torch::randn(shape) * 4.0;
    auto b = torch::randn(shape);
    ExpectClose(glu.op.fused(a, b), glu.reference(a.to(torch::kDouble), b.to(torch::kDouble)),
                // fp32: exp, a divide and a few products, a few ulps (1e-5 relative); atol for act(a) ~ 0.
                1e-6, 1e-5, "fp32 " + c10::str(c10::IntArrayRef(shape)));
    auto a16 = a.to(torch::kBFloat16), b16 = b.to(torch::kBFloat16);
    auto fused16 = glu.op.fused(a16, b16);
    EXPECT_EQ(fused16.scalar_type(), torch::kBFloat16);
    // bf16: computed in fp32 from the bf16 inputs and rounded once (2^-8 relative).
    ExpectClose(fused16, glu.reference(a16.to(torch::kDouble), b16.to(torch::kDouble)), 1e-3, 1e-2,
                "bf16 " + c10::str(c10::IntArrayRef(shape)));
  }
}

TEST_P(GluCpu, GradientsMatchReferenceAutogradFloat64) {
  const Glu& glu = GetParam();
  torch::manual_seed(glu.seeds[1]);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  for (const auto& shape : kShapes) {
    auto a = (torch::randn(shape, opts) * 4.0).requires_grad_(true);
    auto b = torch::randn(shape, opts).requires_grad_(true);
    auto dy = torch::randn(shape, opts);
    auto fused = glu.op.fused(a, b);
    auto ref = glu.reference(a, b);
    ExpectClose(fused, ref, 1e-13, 1e-12, "forward");
    auto g = torch::autograd::grad({fused}, {a, b}, {dy});
    auto g_ref = torch::autograd::grad({ref}, {a, b}, {dy});
    ExpectClose(g[0], g_ref[0], 1e-12, 1e-10, "da " + c10::str(c10::IntArrayRef(shape)));
    ExpectClose(g[1], g_ref[1], 1e-12, 1e-10, "db " + c10::str(c10::IntArrayRef(shape)));
  }
}

TEST_P(GluCpu, StridedHalvesOfAFusedProjection) {
  const Glu& glu = GetParam();
  torch::manual_seed(glu.seeds[2]);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  auto gate_up = torch::randn({6, 2 * 45}, opts).requires_grad_(true);
  auto halves = gate_up.chunk(2, -1);
  auto a = halves[0], b = halves[1];
  ASSERT_FALSE(a.is_contiguous());
  auto dy = torch::randn({45, 6}, opts).t();  // and a transposed incoming gradient
  auto fused = glu.op.fused(a, b);
  auto ref = glu.reference(a, b);
  ExpectClose(fused, ref, 1e-13, 1e-12, "strided forward");
  auto g = torch::autograd::grad({fused}, {gate_up}, {dy});
  auto g_ref = torch::autograd::grad({ref}, {gate_up}, {dy});
  ExpectClose(g[0], g_ref[0], 1e-12, 1e-10, "d gate_up");
}

TEST_P(GluCpu, Bf16GradientsWithinTolerance) {
  const Glu& glu = GetParam();
  torch::manual_seed(glu.seeds[3]);
  auto a = (torch::randn({17, 301}) * 3.0).to(torch::kBFloat16).requires_grad_(true);
  auto b = torch::randn({17, 301}).to(torch::kBFloat16).requires_grad_(true);
  auto dy = torch::randn({17, 301}).to(torch::kBFloat16);
  auto ar = a.detach().to(torch::kDouble).requires_grad_(true);
  auto br = b.detach().to(torch::kDouble).requires_grad_(true);
  auto g = torch::autograd::grad({glu.op.fused(a, b)}, {a, b}, {dy});
  auto g_ref = torch::autograd::grad({glu.reference(ar, br)}, {ar, br}, {dy.to(torch::kDouble)});
  // fp32 math from bf16 inputs, one rounding of each gradient (2^-8 relative).
  ExpectClose(g[0], g_ref[0], 1e-3, 1e-2, "bf16 da");
  ExpectClose(g[1], g_ref[1], 1e-3, 1e-2, "bf16 db");
}

TEST_P(GluCpu, RegisteredTorchOpRunsWithAutograd) {
  const Glu& glu = GetParam();
  torch::manual_seed(glu.seeds[4]);
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow(("tigon::" + glu.name).c_str(), "")
                .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>();
  auto a = torch::randn({3, 10}, torch::kDouble).requires_grad_(true);
  auto b = torch::randn({3, 10}, torch::kDouble).requires_grad_(true);
  auto y = op.call(a, b);
  auto y_ref = glu.reference(a, b);
  ExpectClose(y, y_ref, 1e-13, 1e-12, "torch op forward");
  auto g = torch::autograd::grad({y.sum()}, {a, b});
  auto g_ref = torch::autograd::grad({y_ref.sum()}, {a, b});
  ExpectClose(g[0], g_ref[0], 1e-12, 1e-10, "torch op da");
  ExpectClose(g[1], g_ref[1], 1e-12, 1e-10, "torch op db");
}

TEST_P(GluCpu, RejectsMismatchedInputs) {
  const auto fused = GetParam().op.fused;
  EXPECT_THROW(fused(torch::randn({2, 3}), torch::randn({2, 4})), c10::Error);
  EXPECT_THROW(fused(torch::randn({2, 3}), torch::randn({2, 3}).to(torch::kBFloat16)), c10::Error);
}

// ---- backward_out: the backward outside autograd, in place over dy (glu_backward_out_checks.h) ----

TEST_P(GluCpu, BackwardOutInPlaceIsBitIdenticalToAutograd) {
  torch::manual_seed(GetParam().seeds[5]);
  glu_backward_out_checks::ExpectBackwardOutInPlaceBitIdenticalToAutograd(GetParam().op);
}

TEST_P(GluCpu, BackwardOutMatchesReferenceInFloat64) {
  torch::manual_seed(GetParam().seeds[6]);
  // da = dy b act'(a) has a cancellation (silu: in 1 + a (1 - s) near a ~ -1.28; gelu: in
  // s + 2 a s (1 - s) u'(a) for negative a), hence the absolute floor.
  glu_backward_out_checks::ExpectBackwardOutMatchesReferenceInFloat64(GetParam().op);
}

TEST_P(GluCpu, BackwardOutWritesTheForwardOutputBitForBit) {
  torch::manual_seed(GetParam().seeds[7]);
  glu_backward_out_checks::ExpectBackwardOutWritesTheForwardOutput(GetParam().op);
}

TEST_P(GluCpu, BackwardOutRejectsBadOutputs) {
  glu_backward_out_checks::ExpectBackwardOutRejectsBadOutputs(GetParam().op.fused_backward_out);
}

}  // namespace
