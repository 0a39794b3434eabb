// Prometheus metrics of the service, kept in a prometheus-cpp registry. Per-session series are labelled
// by session id and removed when the session closes, so label values stay bounded by --max-sessions;
// everything else is labelled by method, status code, model family or device index. The counters of
// each model family exist from the start (at 0), so rates and increases have data before the first event.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tigon/engine.h"

namespace tigon::server {

class Metrics {
 public:
  // `model_families`: the families whose counters are exported at 0 before their first event.
  explicit Metrics(const std::vector<std::string>& model_families = {});
  ~Metrics();

  // Called at each scrape for the device memory gauges.
  void SetDeviceSource(std::function<std::vector<tigon::DeviceInfo>()> source);

  // Every Trainer call: its method and its gRPC status code name (e.g. "OK").
  void RecordRpc(const std::string& method, const std::string& code);
  // A successful engine call that ran a batch or an optimizer step.
  void RecordStep(const std::string& session_id, const std::string& model_family, const std::string& method,
                  const tigon::StepStats& stats);
  void RecordForward(const std::string& session_id, const std::string& model_family, int64_t tokens, double seconds);
  void RecordOutOfMemory(const std::string& model_family);
  void SessionOpened(const std::string& session_id, const tigon::SessionInfo& info);
  void SessionClosed(const std::string& session_id);
  // Peak memory and step time of one step with each kernel choice (MeasureSavings).
  void RecordSavings(const std::string& session_id, const std::string& model_family, const std::string& kernels,
                     int64_t peak_allocated_bytes, double step_seconds);

  // What the exposer serves: the registry, the device memory gauges and the process metrics.
  std::vector<std::shared_ptr<prometheus::Collectable>> Collectables() const;
  // The same in the text exposition format (what a scrape returns).
  std::string Render() const;

  class RegistryCollector;  // (public only for the helpers in metrics.cpp)

 private:
  // The gauges of one open session; those of its steps exist once it has taken one.
  struct SessionSeries {
    std::string model_family;
    prometheus::Gauge* info = nullptr;
    std::vector<prometheus::Gauge*> op_fused;
    prometheus::Gauge* loss = nullptr;
    prometheus::Gauge* grad_norm = nullptr;
    prometheus::Gauge* tokens_per_second = nullptr;
    prometheus::Gauge* peak_allocated_bytes = nullptr;
    prometheus::Gauge* peak_reserved_bytes = nullptr;
    prometheus::Gauge* step = nullptr;
    // kernels ("fused" | "reference") -> {peak bytes, seconds} gauges from MeasureSavings
    std::map<std::string, std::pair<prometheus::Gauge*, prometheus::Gauge*>> savings;
  };
  class DeviceCollector;

  prometheus::Histogram& StepDuration(const std::string& method, const std::string& model_family);
  void RemoveSeries(SessionSeries& series);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<RegistryCollector> families_;  // the registry, with empty families still described
  std::shared_ptr<DeviceCollector> devices_;
  std::shared_ptr<prometheus::Collectable> process_;
  prometheus::Family<prometheus::Counter>& rpcs_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Counter>& tokens_total_;
  prometheus::Family<prometheus::Counter>& oom_total_;
  prometheus::Gauge& active_sessions_;
  prometheus::Family<prometheus::Gauge>& session_info_;
  prometheus::Family<prometheus::Gauge>& session_op_fused_;
  prometheus::Family<prometheus::Gauge>& session_loss_;
  prometheus::Family<prometheus::Gauge>& session_grad_norm_;
  prometheus::Family<prometheus::Gauge>& session_tokens_per_second_;
  prometheus::Family<prometheus::Gauge>& session_peak_allocated_bytes_;
  prometheus::Family<prometheus::Gauge>& session_peak_reserved_bytes_;
  prometheus::Family<prometheus::Gauge>& session_step_;
  prometheus::Family<prometheus::Gauge>& savings_peak_allocated_bytes_;
  prometheus::Family<prometheus::Gauge>& savings_step_seconds_;

  std::mutex mu_;  // guards sessions_ (the families lock themselves)
  std::map<std::string, SessionSeries> sessions_;  // session id
};

}  // namespace tigon::server
