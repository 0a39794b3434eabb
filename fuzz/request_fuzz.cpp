// Fuzzes request decoding and validation as the server runs them (server/validation.h), on serialized
// CreateSessionRequest and TrainStepRequest messages. The first byte picks the message and the server
// settings (device count, --max-batch-tokens up to the largest value the flag accepts); the rest is
// the message. Contract: validation never crashes or overflows, and what it accepts is what the engine
// may rely on (shapes match, ids inside the vocabulary, devices exist and are distinct).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>

#include <google/protobuf/stubs/logging.h>

#include "fuzz/fuzz_check.h"
#include "models/model.h"
#include "server/validation.h"

namespace {

const std::vector<std::string> kFamilies = tigon::models::SupportedFamilies();

void CheckCreateSession(const uint8_t* data, size_t size, int device_count) {
  tigon::v1::CreateSessionRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  tigon::SessionOptions options;
  const grpc::Status status = tigon::server::ValidateCreateSession(request, kFamilies, device_count, &options);
  if (!status.ok()) {
    FUZZ_CHECK(!status.error_message().empty(), "a refusal without a message");
    return;
  }
  FUZZ_CHECK(options.config_json.empty() != options.model_path.empty(), "exactly one model source");
  FUZZ_CHECK(options.precision == "fp32" || options.precision == "bf16" || options.precision == "bf16_mixed",
             "precision '%s'", options.precision.c_str());
  FUZZ_CHECK(options.kernels == "fused" || options.kernels == "reference", "kernels '%s'", options.kernels.c_str());
  std::set<int> seen;
  for (int device : options.devices) {
    FUZZ_CHECK(device >= 0 && device < device_count, "device %d of %d", device, device_count);
    FUZZ_CHECK(seen.insert(device).second, "device %d twice", device);
  }
  const auto& o = options.optimizer;
  FUZZ_CHECK(std::isfinite(o.lr) && o.lr >= 0 && o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1 &&
                 std::isfinite(o.eps) && o.eps > 0 && std::isfinite(o.weight_decay) && o.weight_decay >= 0 &&
                 std::isfinite(o.max_grad_norm) && o.max_grad_norm >= 0,
             "accepted optimizer settings out of range");
}

void CheckTrainStep(const uint8_t* data, size_t size, int64_t max_batch_tokens) {
  tigon::v1::TrainStepRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  tigon::server::BatchLimits limits;
  limits.vocab_size = 256;
  limits.max_position_embeddings = 64;
  limits.max_batch_tokens = max_batch_tokens;
  (void)tigon::server::ValidateOptimizerSettings(request.optimizer());
  if (!tigon::server::ValidateBatch(request.batch(), limits).ok()) return;
  const tigon::Batch batch = tigon::server::ToEngineBatch(request.batch());
  FUZZ_CHECK(batch.batch > 0 && batch.seq_len > 0 && batch.seq_len <= limits.max_position_embeddings,
             "accepted shape %lld x %lld", static_cast<long long>(batch.batch), static_cast<long long>(batch.seq_len));
  FUZZ_CHECK(batch.batch <= max_batch_tokens / batch.seq_len, "accepted %lld x %lld tokens over the %lld limit",
             static_cast<long long>(batch.batch), static_cast<long long>(batch.seq_len),
             static_cast<long long>(max_batch_tokens));
  const size_t tokens = static_cast<size_t>(batch.batch * batch.seq_len);
  FUZZ_CHECK(batch.input_ids.size() == tokens, "input_ids size");
  FUZZ_CHECK(batch.labels.empty() || batch.labels.size() == tokens, "labels size");
  FUZZ_CHECK(batch.loss_weights.empty() || batch.loss_weights.size() == tokens, "loss_weights size");
  for (int32_t id : batch.input_ids) FUZZ_CHECK(id >= 0 && id < limits.vocab_size, "id %d", id);
  for (int32_t label : batch.labels) {
    FUZZ_CHECK(label == tigon::kIgnoreIndex || (label >= 0 && label < limits.vocab_size), "label %d", label);
  }
  for (float w : batch.loss_weights) FUZZ_CHECK(std::isfinite(w) && w >= 0, "weight %f", w);
}

}  // namespace

// Invalid UTF-8 in string fields is an ordinary parse failure here; protobuf's log line for each one
// would drown the fuzzer's output.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t selector = data[0];
  // The server's default limit, a small one, and the largest --max-batch-tokens accepts.
  static const int64_t kLimits[] = {262144, 16, std::numeric_limits<int64_t>::max()};
  const int64_t max_batch_tokens = kLimits[(selector >> 1) % 3];
  const int device_count = (selector >> 3) % 3;
  if (selector & 1) {
    CheckTrainStep(data + 1, size - 1, max_batch_tokens);
  } else {
    CheckCreateSession(data + 1, size - 1, device_count);
  }
  return 0;
}
