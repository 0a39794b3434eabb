// Strings that come from clients (session and request ids, checkpoint paths, model names, any field of a
// request) are put into log lines and error messages only through ClientText: it escapes what could forge
// a log line or hide text from a reader, and cuts what is long, so that one call adds a bounded amount to
// the log and to the status a client receives.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tigon::server {

// The most bytes of one client string that go into a log line or a message.
inline constexpr size_t kClientTextLimit = 200;
// The most bytes of a whole status message (logged and returned; it may hold several client strings).
inline constexpr size_t kStatusMessageLimit = 4096;

// `text` with control characters escaped (\n, \r, \t, \xNN for the other C0 bytes and DEL, \u00NN for C1
// controls), the Unicode line and paragraph separators and the bidirectional overrides escaped as \uNNNN,
// and each byte that is not part of valid UTF-8 as \xNN. Longer results are cut at a character boundary
// to at most `limit` bytes plus a note " ...[N bytes]" giving the original length. Text that is already
// safe and short comes back unchanged, so applying it twice changes nothing.
std::string ClientText(std::string_view text, size_t limit = kClientTextLimit);

}  // namespace tigon::server
