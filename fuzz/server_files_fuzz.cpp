// Fuzzes the files a server operator or a model folder hands the server: the auth token file
// (TokenAuthenticator::Parse) and model.safetensors.index.json (ParseShardIndex). The first byte picks
// the parser, the rest is the file. Contract: no crash and no exception; an accepted token file has at
// least one token, each with a role and a name; an accepted index names only relative, non-empty files.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "fuzz/fuzz_check.h"
#include "server/auth.h"
#include "server/model_roots.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    tigon::server::TokenAuthenticator auth;
    std::string error;
    if (tigon::server::TokenAuthenticator::Parse(text, "fuzz", &auth, &error)) {
      FUZZ_CHECK(auth.enabled() && auth.size() > 0, "an accepted token file has no token");
      FUZZ_CHECK(auth.admin_count() <= auth.size(), "more admins than tokens");
    } else {
      FUZZ_CHECK(!error.empty(), "a refused token file has no message");
    }
  } else {
    std::set<std::string> shards;
    if (tigon::server::ParseShardIndex(text, &shards)) {
      for (const std::string& shard : shards) {
        FUZZ_CHECK(!shard.empty() && shard[0] != '/' && shard.find('\0') == std::string::npos,
                   "an accepted index names a shard that is not a relative file name");
      }
    }
  }
  return 0;
}
