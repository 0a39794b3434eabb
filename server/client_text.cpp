#include "server/client_text.h"

#include <cstdint>
#include <cstdio>

namespace tigon::server {
namespace {

// The length of the valid UTF-8 sequence starting at text[i] and its code point, or 0 when invalid
// (overlong forms, surrogates and values past U+10FFFF are invalid).
size_t Utf8Sequence(std::string_view text, size_t i, uint32_t* code_point) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  size_t length = 0;
  uint32_t value = 0, minimum = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, value = lead & 0x1F, minimum = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, value = lead & 0x0F, minimum = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, value = lead & 0x07, minimum = 0x10000;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    value = (value << 6) | (byte(i + k) & 0x3F);
  }
  if (value < minimum || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return 0;
  *code_point = value;
  return length;
}

bool HiddenOrBreaking(uint32_t c) {
  return (c >= 0x80 && c <= 0x9F) || c == 0x2028 || c == 0x2029 || (c >= 0x202A && c <= 0x202E) ||
         (c >= 0x2066 && c <= 0x2069);
}

}  // namespace

std::string ClientText(std::string_view text, size_t limit) {
  std::string out;
  out.reserve(text.size() < limit ? text.size() : limit);
  size_t i = 0;
  char escape[16];
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    std::string_view piece;
    size_t consumed = 1;
    if (c == '\n') {
      piece = "\\n";
    } else if (c == '\r') {
      piece = "\\r";
    } else if (c == '\t') {
      piece = "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(escape, sizeof escape, "\\x%02X", c);
      piece = escape;
    } else if (c < 0x80) {
      piece = text.substr(i, 1);
    } else {
      uint32_t code_point = 0;
      const size_t length = Utf8Sequence(text, i, &code_point);
      if (length == 0) {
        std::snprintf(escape, sizeof escape, "\\x%02X", c);
        piece = escape;
      } else {
        consumed = length;
        if (HiddenOrBreaking(code_point)) {
          std::snprintf(escape, sizeof escape, "\\u%04X", static_cast<unsigned>(code_point));
          piece = escape;
        } else {
          piece = text.substr(i, length);
        }
      }
    }
    if (out.size() + piece.size() > limit) {
      out += " ...[" + std::to_string(text.size()) + " bytes]";
      return out;
    }
    out.append(piece);
    i += consumed;
  }
  return out;
}

}  // namespace tigon::server
