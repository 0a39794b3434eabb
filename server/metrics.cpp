#include "server/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace tigon::server {
namespace {

// Label values escaped as the exposition format requires: backslash, double quote and newline.
std::string Escape(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string Number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // The shortest form that reads back as the same double ("0.0025", not "0.0025000000000000001").
  char buffer[32];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  return buffer;
}

class Writer {
 public:
  void Header(const char* name, const char* type, const char* help) {
    out_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  void Sample(const std::string& name, const std::vector<std::pair<std::string, std::string>>& labels, double value) {
    out_ << name;
    if (!labels.empty()) {
      out_ << "{";
      for (size_t i = 0; i < labels.size(); ++i) {
        out_ << (i ? "," : "") << labels[i].first << "=\"" << Escape(labels[i].second) << "\"";
      }
      out_ << "}";
    }
    out_ << " " << Number(value) << "\n";
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

}  // namespace

Metrics::Metrics() = default;

void Metrics::Histogram::Observe(double value) {
  for (size_t i = 0; i < kStepBuckets.size(); ++i) {
    if (value <= kStepBuckets[i]) {
      ++buckets[i];
      break;
    }
  }
  ++count;
  sum += value;
}

void Metrics::SetDeviceSource(std::function<std::vector<tigon::DeviceInfo>()> source) {
  std::lock_guard<std::mutex> lock(mu_);
  device_source_ = std::move(source);
}

void Metrics::RecordRpc(const std::string& method, const std::string& code) {
  std::lock_guard<std::mutex> lock(mu_);
  ++rpcs_[{method, code}];
}

void Metrics::RecordStep(const std::string& session_id, const std::string& model_family, const std::string& method,
                         const tigon::StepStats& stats) {
  std::lock_guard<std::mutex> lock(mu_);
  step_seconds_[{method, model_family}].Observe(stats.wall_seconds);
  if (method != "OptimStep") tokens_total_[model_family] += static_cast<uint64_t>(stats.tokens);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  SessionSeries& s = it->second;
  if (method != "OptimStep") {
    s.loss = stats.loss;
    s.tokens_per_second = stats.tokens_per_second;
  }
  if (method != "ForwardBackward") s.grad_norm = stats.grad_norm;
  s.peak_allocated_bytes = stats.peak_allocated_bytes;
  s.peak_reserved_bytes = stats.peak_reserved_bytes;
  s.step = stats.step;
  s.has_step = true;
}

void Metrics::RecordForward(const std::string&, const std::string& model_family, int64_t tokens, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  step_seconds_[{"Forward", model_family}].Observe(seconds);
  tokens_total_[model_family] += static_cast<uint64_t>(tokens);
}

void Metrics::RecordOutOfMemory(const std::string& model_family) {
  std::lock_guard<std::mutex> lock(mu_);
  ++oom_total_[model_family];
}

void Metrics::SessionOpened(const std::string& session_id, const tigon::SessionInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  SessionSeries& s = sessions_[session_id];
  s.model_family = info.model_family;
  s.precision = info.precision;
  s.ops = info.ops;
}

void Metrics::SessionClosed(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  sessions_.erase(session_id);
}

void Metrics::RecordSavings(const std::string& session_id, const std::string&, const std::string& kernels,
                            int64_t peak_allocated_bytes, double step_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it != sessions_.end()) it->second.savings[kernels] = {peak_allocated_bytes, step_seconds};
}

std::string Metrics::Render() const {
  std::vector<tigon::DeviceInfo> devices;
  std::function<std::vector<tigon::DeviceInfo>()> source;
  {
    std::lock_guard<std::mutex> lock(mu_);
    source = device_source_;
  }
  if (source) devices = source();  // outside the lock: it may query the driver

  std::lock_guard<std::mutex> lock(mu_);
  Writer w;
  w.Header("tigon_rpcs_total", "counter", "Trainer calls by method and gRPC status code.");
  for (const auto& [key, count] : rpcs_) {
    w.Sample("tigon_rpcs_total", {{"method", key.first}, {"code", key.second}}, static_cast<double>(count));
  }

  w.Header("tigon_step_duration_seconds", "histogram", "Time inside the engine per call, by method and model family.");
  for (const auto& [key, h] : step_seconds_) {
    uint64_t cumulative = 0;
    for (size_t i = 0; i < kStepBuckets.size(); ++i) {
      cumulative += h.buckets[i];
      w.Sample("tigon_step_duration_seconds_bucket",
               {{"method", key.first}, {"model_family", key.second}, {"le", Number(kStepBuckets[i])}},
               static_cast<double>(cumulative));
    }
    w.Sample("tigon_step_duration_seconds_bucket",
             {{"method", key.first}, {"model_family", key.second}, {"le", "+Inf"}}, static_cast<double>(h.count));
    w.Sample("tigon_step_duration_seconds_sum", {{"method", key.first}, {"model_family", key.second}}, h.sum);
    w.Sample("tigon_step_duration_seconds_count", {{"method", key.first}, {"model_family", key.second}},
             static_cast<double>(h.count));
  }

  w.Header("tigon_tokens_processed_total", "counter", "Target tokens in processed batches, by model family.");
  for (const auto& [family, tokens] : tokens_total_) {
    w.Sample("tigon_tokens_processed_total", {{"model_family", family}}, static_cast<double>(tokens));
  }

  w.Header("tigon_out_of_memory_total", "counter", "Calls that failed on device out-of-memory.");
  for (const auto& [family, count] : oom_total_) {
    w.Sample("tigon_out_of_memory_total", {{"model_family", family}}, static_cast<double>(count));
  }

  w.Header("tigon_active_sessions", "gauge", "Open sessions.");
  w.Sample("tigon_active_sessions", {}, static_cast<double>(sessions_.size()));

  w.Header("tigon_session_info", "gauge", "One series per open session (value 1) with its model and precision.");
  for (const auto& [id, s] : sessions_) {
    w.Sample("tigon_session_info", {{"session", id}, {"model_family", s.model_family}, {"precision", s.precision}}, 1);
  }

  w.Header("tigon_session_op_fused", "gauge", "1 when the session runs the op fused, 0 for the reference.");
  for (const auto& [id, s] : sessions_) {
    for (const auto& op : s.ops) {
      w.Sample("tigon_session_op_fused", {{"session", id}, {"op", op.op}}, op.choice == "fused" ? 1 : 0);
    }
  }

  struct Gauge {
    const char* name;
    const char* help;
    double (*value)(const SessionSeries&);
  };
  const Gauge gauges[] = {
      {"tigon_session_loss", "Loss of the session's latest batch.", [](const SessionSeries& s) { return s.loss; }},
      {"tigon_session_grad_norm", "Gradient norm of the session's latest optimizer step.",
       [](const SessionSeries& s) { return s.grad_norm; }},
      {"tigon_session_tokens_per_second", "Target tokens per second of the session's latest batch.",
       [](const SessionSeries& s) { return s.tokens_per_second; }},
      {"tigon_session_peak_allocated_bytes", "Peak allocated device memory during the session's latest call.",
       [](const SessionSeries& s) { return static_cast<double>(s.peak_allocated_bytes); }},
      {"tigon_session_peak_reserved_bytes", "Peak reserved device memory during the session's latest call.",
       [](const SessionSeries& s) { return static_cast<double>(s.peak_reserved_bytes); }},
      {"tigon_session_step", "Optimizer steps the session has taken.",
       [](const SessionSeries& s) { return static_cast<double>(s.step); }},
  };
  for (const Gauge& g : gauges) {
    w.Header(g.name, "gauge", g.help);
    for (const auto& [id, s] : sessions_) {
      if (s.has_step) w.Sample(g.name, {{"session", id}, {"model_family", s.model_family}}, g.value(s));
    }
  }

  w.Header("tigon_savings_peak_allocated_bytes", "gauge",
           "Peak allocated device memory of one measured step, by kernel choice (MeasureSavings).");
  for (const auto& [id, s] : sessions_) {
    for (const auto& [kernels, m] : s.savings) {
      w.Sample("tigon_savings_peak_allocated_bytes",
               {{"session", id}, {"model_family", s.model_family}, {"kernels", kernels}}, static_cast<double>(m.first));
    }
  }
  w.Header("tigon_savings_step_seconds", "gauge", "Time of one measured step, by kernel choice (MeasureSavings).");
  for (const auto& [id, s] : sessions_) {
    for (const auto& [kernels, m] : s.savings) {
      w.Sample("tigon_savings_step_seconds", {{"session", id}, {"model_family", s.model_family}, {"kernels", kernels}},
               m.second);
    }
  }

  w.Header("tigon_device_memory_total_bytes", "gauge", "Device memory, total.");
  for (const auto& d : devices) {
    w.Sample("tigon_device_memory_total_bytes", {{"device", std::to_string(d.index)}},
             static_cast<double>(d.total_bytes));
  }
  w.Header("tigon_device_memory_used_bytes", "gauge", "Device memory in use (total - free).");
  for (const auto& d : devices) {
    w.Sample("tigon_device_memory_used_bytes", {{"device", std::to_string(d.index)}},
             static_cast<double>(d.total_bytes - d.free_bytes));
  }
  return w.str();
}

}  // namespace tigon::server
