#include "server/metrics.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <algorithm>

#include "server/process_metrics.h"

namespace tigon::server {
namespace {

const prometheus::Histogram::BucketBoundaries& StepBuckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                                  0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};
  return buckets;
}

}  // namespace

// The registry's families in the order they were declared, those without a series yet included (with
// their HELP and TYPE only), so that a scrape of a fresh server already lists every metric.
class Metrics::RegistryCollector final : public prometheus::Collectable {
 public:
  explicit RegistryCollector(std::shared_ptr<prometheus::Registry> registry) : registry_(std::move(registry)) {}

  template <typename Builder>
  auto& Declare(Builder builder, const char* name, const char* help, prometheus::MetricType type) {
    declared_.push_back(prometheus::MetricFamily{name, help, type, {}});
    return builder.Name(name).Help(help).Register(*registry_);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> collected = registry_->Collect();
    std::vector<prometheus::MetricFamily> out;
    for (const auto& declared : declared_) {
      auto it = std::find_if(collected.begin(), collected.end(),
                             [&](const prometheus::MetricFamily& f) { return f.name == declared.name; });
      out.push_back(it != collected.end() ? std::move(*it) : declared);
    }
    return out;
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::vector<prometheus::MetricFamily> declared_;
};

namespace {

prometheus::Family<prometheus::Counter>& CounterFamily(Metrics::RegistryCollector& families, const char* name,
                                                       const char* help) {
  return families.Declare(prometheus::BuildCounter(), name, help, prometheus::MetricType::Counter);
}

prometheus::Family<prometheus::Gauge>& GaugeFamily(Metrics::RegistryCollector& families, const char* name,
                                                   const char* help) {
  return families.Declare(prometheus::BuildGauge(), name, help, prometheus::MetricType::Gauge);
}

template <typename T>
void Remove(prometheus::Family<T>& family, T*& metric) {
  if (metric != nullptr) family.Remove(metric);
  metric = nullptr;
}

}  // namespace

// Device memory is read from the engine at each scrape, so it needs no updates between scrapes.
class Metrics::DeviceCollector final : public prometheus::Collectable {
 public:
  void SetSource(std::function<std::vector<tigon::DeviceInfo>()> source) {
    std::lock_guard<std::mutex> lock(mu_);
    source_ = std::move(source);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::function<std::vector<tigon::DeviceInfo>()> source;
    {
      std::lock_guard<std::mutex> lock(mu_);
      source = source_;
    }
    std::vector<tigon::DeviceInfo> devices;
    if (source) devices = source();  // outside the lock: it may query the driver
    prometheus::MetricFamily total{"tigon_device_memory_total_bytes", "Device memory, total.",
                                   prometheus::MetricType::Gauge, {}};
    prometheus::MetricFamily used{"tigon_device_memory_used_bytes", "Device memory in use (total - free).",
                                  prometheus::MetricType::Gauge, {}};
    prometheus::MetricFamily reserved{"tigon_device_memory_reserved_bytes",
                                      "Device memory this server's caching allocator holds: tensors and cached "
                                      "blocks (given back when a session closes).",
                                      prometheus::MetricType::Gauge, {}};
    for (const auto& d : devices) {
      prometheus::ClientMetric metric;
      metric.label = {{"device", std::to_string(d.index)}};
      metric.gauge.value = static_cast<double>(d.total_bytes);
      total.metric.push_back(metric);
      metric.gauge.value = static_cast<double>(d.total_bytes - d.free_bytes);
      used.metric.push_back(metric);
      metric.gauge.value = static_cast<double>(d.reserved_bytes);
      reserved.metric.push_back(metric);
    }
    return {total, used, reserved};
  }

 private:
  mutable std::mutex mu_;
  std::function<std::vector<tigon::DeviceInfo>()> source_;
};

Metrics::Metrics(const std::vector<std::string>& model_families)
    : registry_(std::make_shared<prometheus::Registry>()),
      families_(std::make_shared<RegistryCollector>(registry_)),
      devices_(std::make_shared<DeviceCollector>()),
      process_(MakeProcessCollector()),
      rpcs_(CounterFamily(*families_, "tigon_rpcs_total", "Trainer calls by method and gRPC status code.")),
      step_seconds_(families_->Declare(prometheus::BuildHistogram(), "tigon_step_duration_seconds",
                                       "Time inside the engine per call, by method and model family.",
                                       prometheus::MetricType::Histogram)),
      tokens_total_(CounterFamily(*families_, "tigon_tokens_processed_total",
                                  "Target tokens in processed batches, by model family.")),
      oom_total_(CounterFamily(*families_, "tigon_out_of_memory_total", "Calls that failed on device out-of-memory.")),
      active_sessions_(GaugeFamily(*families_, "tigon_active_sessions", "Open sessions.").Add({})),
      session_info_(GaugeFamily(*families_, "tigon_session_info",
                                "One series per open session (value 1) with its model and precision.")),
      session_op_fused_(GaugeFamily(*families_, "tigon_session_op_fused",
                                    "1 when the session runs the op fused, 0 for the reference.")),
      session_loss_(GaugeFamily(*families_, "tigon_session_loss", "Loss of the session's latest batch.")),
      session_grad_norm_(GaugeFamily(*families_, "tigon_session_grad_norm",
                                     "Gradient norm of the session's latest optimizer step.")),
      session_tokens_per_second_(GaugeFamily(*families_, "tigon_session_tokens_per_second",
                                             "Target tokens per second of the session's latest batch.")),
      session_peak_allocated_bytes_(GaugeFamily(*families_, "tigon_session_peak_allocated_bytes",
                                                "Peak allocated device memory during the session's latest call.")),
      session_peak_reserved_bytes_(GaugeFamily(*families_, "tigon_session_peak_reserved_bytes",
                                               "Peak reserved device memory during the session's latest call.")),
      session_step_(GaugeFamily(*families_, "tigon_session_step", "Optimizer steps the session has taken.")),
      savings_peak_allocated_bytes_(
          GaugeFamily(*families_, "tigon_savings_peak_allocated_bytes",
                      "Peak allocated device memory of one measured step, by kernel choice (MeasureSavings).")),
      savings_step_seconds_(GaugeFamily(*families_, "tigon_savings_step_seconds",
                                        "Time of one measured step, by kernel choice (MeasureSavings).")) {
  for (const auto& family : model_families) {
    tokens_total_.Add({{"model_family", family}});
    oom_total_.Add({{"model_family", family}});
  }
}

Metrics::~Metrics() = default;

void Metrics::SetDeviceSource(std::function<std::vector<tigon::DeviceInfo>()> source) {
  devices_->SetSource(std::move(source));
}

void Metrics::RecordRpc(const std::string& method, const std::string& code) {
  rpcs_.Add({{"method", method}, {"code", code}}).Increment();
}

prometheus::Histogram& Metrics::StepDuration(const std::string& method, const std::string& model_family) {
  return step_seconds_.Add({{"method", method}, {"model_family", model_family}}, StepBuckets());
}

void Metrics::RecordStep(const std::string& session_id, const std::string& model_family, const std::string& method,
                         const tigon::StepStats& stats) {
  StepDuration(method, model_family).Observe(stats.wall_seconds);
  if (method != "OptimStep") tokens_total_.Add({{"model_family", model_family}}).Increment(stats.tokens);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  SessionSeries& s = it->second;
  if (s.loss == nullptr) {
    const prometheus::Labels labels = {{"session", session_id}, {"model_family", s.model_family}};
    s.loss = &session_loss_.Add(labels);
    s.grad_norm = &session_grad_norm_.Add(labels);
    s.tokens_per_second = &session_tokens_per_second_.Add(labels);
    s.peak_allocated_bytes = &session_peak_allocated_bytes_.Add(labels);
    s.peak_reserved_bytes = &session_peak_reserved_bytes_.Add(labels);
    s.step = &session_step_.Add(labels);
  }
  if (method != "OptimStep") {
    s.loss->Set(stats.loss);
    s.tokens_per_second->Set(stats.tokens_per_second);
  }
  if (method != "ForwardBackward") s.grad_norm->Set(stats.grad_norm);
  s.peak_allocated_bytes->Set(static_cast<double>(stats.peak_allocated_bytes));
  s.peak_reserved_bytes->Set(static_cast<double>(stats.peak_reserved_bytes));
  s.step->Set(static_cast<double>(stats.step));
}

void Metrics::RecordForward(const std::string&, const std::string& model_family, int64_t tokens, double seconds) {
  StepDuration("Forward", model_family).Observe(seconds);
  tokens_total_.Add({{"model_family", model_family}}).Increment(static_cast<double>(tokens));
}

void Metrics::RecordOutOfMemory(const std::string& model_family) {
  oom_total_.Add({{"model_family", model_family}}).Increment();
}

void Metrics::SessionOpened(const std::string& session_id, const tigon::SessionInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  SessionSeries& s = sessions_[session_id];
  RemoveSeries(s);  // an id is never reused, but a second call must not leave series behind
  s.model_family = info.model_family;
  s.info = &session_info_.Add(
      {{"session", session_id}, {"model_family", info.model_family}, {"precision", info.precision}});
  s.info->Set(1);
  for (const auto& op : info.ops) {
    prometheus::Gauge& fused = session_op_fused_.Add({{"session", session_id}, {"op", op.op}});
    fused.Set(op.choice == "fused" ? 1 : 0);
    s.op_fused.push_back(&fused);
  }
  active_sessions_.Set(static_cast<double>(sessions_.size()));
}

void Metrics::RemoveSeries(SessionSeries& s) {
  Remove(session_info_, s.info);
  for (prometheus::Gauge*& gauge : s.op_fused) Remove(session_op_fused_, gauge);
  s.op_fused.clear();
  Remove(session_loss_, s.loss);
  Remove(session_grad_norm_, s.grad_norm);
  Remove(session_tokens_per_second_, s.tokens_per_second);
  Remove(session_peak_allocated_bytes_, s.peak_allocated_bytes);
  Remove(session_peak_reserved_bytes_, s.peak_reserved_bytes);
  Remove(session_step_, s.step);
  for (auto& [kernels, gauges] : s.savings) {
    Remove(savings_peak_allocated_bytes_, gauges.first);
    Remove(savings_step_seconds_, gauges.second);
  }
  s.savings.clear();
}

void Metrics::SessionClosed(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  RemoveSeries(it->second);
  sessions_.erase(it);
  active_sessions_.Set(static_cast<double>(sessions_.size()));
}

void Metrics::RecordSavings(const std::string& session_id, const std::string&, const std::string& kernels,
                            int64_t peak_allocated_bytes, double step_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  SessionSeries& s = it->second;
  auto& gauges = s.savings[kernels];
  if (gauges.first == nullptr) {
    const prometheus::Labels labels = {{"session", session_id}, {"model_family", s.model_family}, {"kernels", kernels}};
    gauges = {&savings_peak_allocated_bytes_.Add(labels), &savings_step_seconds_.Add(labels)};
  }
  gauges.first->Set(static_cast<double>(peak_allocated_bytes));
  gauges.second->Set(step_seconds);
}

std::vector<std::shared_ptr<prometheus::Collectable>> Metrics::Collectables() const {
  return {families_, devices_, process_};
}

std::string Metrics::Render() const {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& collectable : Collectables()) {
    for (auto& family : collectable->Collect()) families.push_back(std::move(family));
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace tigon::server
