// Results of OptimStep/TrainStep calls by client request id, so that a retried call is answered with
// the first call's result instead of being applied twice. Bounded: the oldest ids are forgotten.
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <unordered_map>

#include "tigon/v1/trainer.pb.h"

namespace tigon::server {

class RequestCache {
 public:
  static constexpr size_t kDefaultCapacity = 1024;
  explicit RequestCache(size_t capacity = kDefaultCapacity) : capacity_(capacity) {}

  struct Entry {
    std::string method;  // the RPC that produced the result
    v1::StepResult result;
  };

  const Entry* Find(const std::string& request_id) const {
    auto it = entries_.find(request_id);
    return it == entries_.end() ? nullptr : &it->second;
  }

  void Insert(const std::string& request_id, const std::string& method, const v1::StepResult& result) {
    if (capacity_ == 0 || request_id.empty()) return;
    auto [it, inserted] = entries_.insert_or_assign(request_id, Entry{method, result});
    (void)it;
    if (!inserted) return;
    order_.push_back(request_id);
    while (order_.size() > capacity_) {
      entries_.erase(order_.front());
      order_.pop_front();
    }
  }

  void Clear() {
    entries_.clear();
    order_.clear();
  }
  size_t size() const { return entries_.size(); }

 private:
  size_t capacity_;
  std::unordered_map<std::string, Entry> entries_;
  std::deque<std::string> order_;  // insertion order, oldest first
};

}  // namespace tigon::server
