// Crash-safe publication of a directory: the caller fills a temporary sibling directory, then
// PublishDirectory fsyncs it and swaps it in, so the final name always holds either the previous complete
// directory or the new complete one (never a half-written one).
#pragma once

#include <string>

namespace tigon::engine {

// A fresh empty directory next to `final_dir` (same filesystem), named "<final_dir>.tmp-<pid>-<n>".
std::string MakeTempSiblingDir(const std::string& final_dir);

// fsyncs every file in `temp_dir` and the directory itself, then atomically exchanges it with
// `final_dir` (renameat2 RENAME_EXCHANGE) or renames it when `final_dir` does not exist; the previous
// contents are then removed. Throws std::runtime_error with errno text on failure (temp_dir is removed).
void PublishDirectory(const std::string& temp_dir, const std::string& final_dir);

// Removes a leftover temporary directory (best effort).
void RemoveTree(const std::string& path);

}  // namespace tigon::engine
