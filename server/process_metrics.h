// The process metrics Prometheus clients conventionally export (process_cpu_seconds_total,
// process_resident_memory_bytes, process_virtual_memory_bytes, process_start_time_seconds,
// process_open_fds, process_max_fds), read from /proc/self at each scrape. Linux only; elsewhere the
// collector exports nothing.
#pragma once

#include <prometheus/collectable.h>

#include <memory>

namespace tigon::server {

std::shared_ptr<prometheus::Collectable> MakeProcessCollector();

}  // namespace tigon::server
