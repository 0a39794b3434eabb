// Shared option types of the fused ops and their reference compositions.
// The same signatures exist in namespace tigon::ops (fused) and tigon::reference (unfused Hugging Face
// composition), so that models/ can pick either per op.
#pragma once

#include <cstdint>

namespace tigon {

// Where RMSNorm casts, following Hugging Face:
//  kLlama: normalise in fp32, cast back to the input dtype, then multiply by the weight (Llama, Mistral,
//          Qwen2, Phi3).
//  kGemma: everything in fp32 including the `(offset + weight)` multiply, cast at the end (Gemma).
//  kNone:  compute in the input dtype.
enum class RMSNormCasting { kLlama, kGemma, kNone };

enum class Reduction { kMean, kSum, kNone };

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::kMean;  // kMean divides by the number of non-ignored targets
  double label_smoothing = 0.0;
  double z_loss_scale = 0.0;  // adds z_loss_scale * logsumexp^2 per token (PaLM's z-loss)
  double softcap = 0.0;       // > 0: logits <- softcap * tanh(logits / softcap) first (Gemma 2)
};

// torch.optim.AdamW semantics: decoupled weight decay, bias correction with `step` (1-based, the count
// including this update).
struct AdamWOptions {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 1;
  double grad_scale = 1.0;  // gradients are multiplied by this before use (normalisation, clipping)
};

}  // namespace tigon
