// Prometheus metrics of the service, rendered in the text exposition format (version 0.0.4).
// Per-session series are labelled by session id and removed when the session closes, so label values
// stay bounded by --max-sessions; everything else is labelled by method, status code, model family or
// device index.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "tigon/engine.h"

namespace tigon::server {

class Metrics {
 public:
  Metrics();

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

  std::string Render() const;

  static constexpr std::array<double, 14> kStepBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                          0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};

 private:
  struct Histogram {
    std::array<uint64_t, kStepBuckets.size()> buckets{};  // non-cumulative counts
    uint64_t count = 0;
    double sum = 0.0;
    void Observe(double value);
  };
  struct SessionSeries {
    std::string model_family;
    std::string precision;
    double loss = 0.0;
    double grad_norm = 0.0;
    double tokens_per_second = 0.0;
    int64_t peak_allocated_bytes = 0;
    int64_t peak_reserved_bytes = 0;
    int64_t step = 0;
    bool has_step = false;
    std::vector<tigon::OpSelection> ops;
    // kernels ("fused" | "reference") -> {peak bytes, seconds} from MeasureSavings
    std::map<std::string, std::pair<int64_t, double>> savings;
  };

  mutable std::mutex mu_;
  std::function<std::vector<tigon::DeviceInfo>()> device_source_;
  std::map<std::pair<std::string, std::string>, uint64_t> rpcs_;           // method, code
  std::map<std::pair<std::string, std::string>, Histogram> step_seconds_;  // method, family
  std::map<std::string, uint64_t> tokens_total_;                           // family
  std::map<std::string, uint64_t> oom_total_;                              // family
  std::map<std::string, SessionSeries> sessions_;                          // session id
};

}  // namespace tigon::server
