// JSON parsing with a bound on nesting depth, for every JSON text that comes from outside the process (a
// request's config_json, a model folder's config.json and shard index, a checkpoint's state, a safetensors
// header). nlohmann's parser is iterative, but copying, comparing or dumping a value recurses once per
// level: a 200 KB text nested 100,000 deep overflows the stack there. Refusing depth at parse time keeps
// every later use safe. Header-only and torch-free: the server, the engine and the models all include it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tigon {

// Hugging Face configs nest four levels at most (rope_parameters per layer type); 64 leaves room for any
// honest file while keeping a recursive walk far from the stack's end.
inline constexpr int kMaxJsonDepth = 64;

// Thrown by ParseBoundedJson: a syntax error (nlohmann's message) or nesting deeper than the bound.
class JsonInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses `text`; throws JsonInputError when it is not JSON or nests arrays/objects more than `max_depth`
// deep.
inline nlohmann::json ParseBoundedJson(std::string_view text, int max_depth = kMaxJsonDepth) {
  // The callback sees each array or object open with the number of containers around it.
  const nlohmann::json::parser_callback_t bound = [max_depth](int depth, nlohmann::json::parse_event_t event,
                                                              nlohmann::json&) {
    if ((event == nlohmann::json::parse_event_t::object_start ||
         event == nlohmann::json::parse_event_t::array_start) &&
        depth >= max_depth) {
      throw JsonInputError("JSON nests deeper than " + std::to_string(max_depth) + " levels");
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), bound);
  } catch (const nlohmann::json::exception& e) {
    throw JsonInputError(e.what());
  }
}

// The same without exceptions: a discarded value on failure, with the reason in *error when it is given.
inline nlohmann::json ParseBoundedJsonOrDiscard(std::string_view text, std::string* error = nullptr,
                                                int max_depth = kMaxJsonDepth) {
  try {
    return ParseBoundedJson(text, max_depth);
  } catch (const JsonInputError& e) {
    if (error != nullptr) *error = e.what();
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
}

// Reads and parses the file at `path`: JsonInputError (naming the path) when it cannot be opened, is larger
// than `max_bytes` (a sparse 20 GiB config.json would otherwise be read whole), or is not bounded JSON.
inline nlohmann::json ReadBoundedJsonFile(const std::string& path, std::uintmax_t max_bytes = 64u << 20) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) throw JsonInputError(path + ": cannot open for reading");
  const std::streamoff size = file.tellg();
  if (size < 0) throw JsonInputError(path + ": cannot read its size");
  if (static_cast<std::uintmax_t>(size) > max_bytes) {
    throw JsonInputError(path + ": " + std::to_string(size) + " bytes, more than the " + std::to_string(max_bytes) +
                         " a JSON file of a model may have");
  }
  std::string text(static_cast<size_t>(size), '\0');
  file.seekg(0);
  if (!file.read(text.data(), size)) throw JsonInputError(path + ": read failed");
  try {
    return ParseBoundedJson(text);
  } catch (const JsonInputError& e) {
    throw JsonInputError(path + ": malformed JSON: " + e.what());
  }
}

}  // namespace tigon
