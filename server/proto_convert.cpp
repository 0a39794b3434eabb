#include "server/proto_convert.h"

namespace tigon::server {

void ToProto(const tigon::StepStats& stats, v1::StepResult* out) {
  out->set_step(stats.step);
  out->set_loss(stats.loss);
  out->set_tokens(stats.tokens);
  out->set_grad_norm(stats.grad_norm);
  out->set_lr(stats.lr);
  out->set_wall_seconds(stats.wall_seconds);
  out->set_tokens_per_second(stats.tokens_per_second);
  out->set_peak_allocated_bytes(stats.peak_allocated_bytes);
  out->set_peak_reserved_bytes(stats.peak_reserved_bytes);
  out->set_accumulated_batches(stats.accumulated_batches);
  for (const auto& [name, value] : stats.metrics) (*out->mutable_metrics())[name] = value;
}

void ToProto(const tigon::SessionInfo& info, const std::string& session_id, const WorldRank& world,
             v1::SessionInfo* out) {
  out->set_session_id(session_id);
  out->set_model_family(info.model_family);
  out->set_precision(info.precision);
  out->set_parameter_count(info.parameter_count);
  out->set_vocab_size(info.vocab_size);
  out->set_max_position_embeddings(info.max_position_embeddings);
  for (const auto& op : info.ops) {
    auto* selection = out->add_ops();
    selection->set_op(op.op);
    selection->set_choice(op.choice);
    if (op.choice == "fused") out->add_fused_ops(op.op);
  }
  for (int device : info.devices) out->add_devices(device);
  out->set_step(info.step);
  out->set_accumulated_batches(info.accumulated_batches);
  auto* optimizer = out->mutable_optimizer();
  optimizer->set_lr(info.optimizer.lr);
  optimizer->set_beta1(info.optimizer.beta1);
  optimizer->set_beta2(info.optimizer.beta2);
  optimizer->set_eps(info.optimizer.eps);
  optimizer->set_weight_decay(info.optimizer.weight_decay);
  optimizer->set_max_grad_norm(info.optimizer.max_grad_norm);
  out->set_seed(info.seed);
  out->set_optimizer_in_backward(info.optimizer_in_backward);
  out->set_world_size(world.world_size);
  out->set_rank(world.rank);
}

}  // namespace tigon::server
