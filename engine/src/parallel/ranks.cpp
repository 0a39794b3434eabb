// data_parallel.h's helpers for ranks in separate processes: each rank's rows of a batch, and the NCCL
// unique id as text for handing it to the other processes.
#include <string>

#include "parallel/replica_threads.h"
#include "tigon/data_parallel.h"
#include "tigon/engine.h"

namespace tigon {

Batch RowsOfRank(const Batch& batch, int rank, int world_size) {
  const auto counts = engine::SplitRows(batch.batch, world_size);
  int64_t first = 0;
  for (int r = 0; r < rank; ++r) first += counts[r];
  return engine::SliceRows(batch, first, counts[rank]);
}

std::string UniqueIdToHex(const std::string& unique_id) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : unique_id) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

bool UniqueIdFromHex(const std::string& hex, std::string* unique_id) {
  if (hex.size() % 2 != 0) return false;
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int value = 0;
    for (char c : hex.substr(i, 2)) {
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (digit < 0) return false;
      value = value * 16 + digit;
    }
    out += static_cast<char>(value);
  }
  *unique_id = std::move(out);
  return true;
}

}  // namespace tigon
