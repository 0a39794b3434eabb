// Fuzzes checkpoint path resolution (server/checkpoint_paths.h) over a real folder tree: a checkpoint
// root holding the namespaces "bob" and "alice", links that stay inside a namespace, lead into another
// one and lead out of the root, and a folder outside the root. The first byte picks the caller (bob, or
// an admin) and the call (Locate, OpenForLoad, OpenForSave, LocateFolder); the rest is the path.
// Contract: no crash; what is accepted lies inside the caller's namespace, as a lexical path and as the
// folder the returned descriptor leads to; nothing is ever created outside the root; every message is
// one line of bounded length.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "fuzz/fuzz_check.h"
#include "server/checkpoint_paths.h"
#include "server/client_text.h"

namespace {

namespace fs = std::filesystem;
using tigon::server::Caller;
using tigon::server::CheckpointRoot;

struct Fixture {
  fs::path base, root, outside;
  CheckpointRoot checkpoints;
  int saves = 0;

  Fixture() {
    char pattern[] = "/tmp/tigon-fuzz-ckpt-XXXXXX";
    base = fs::canonical(::mkdtemp(pattern));
    root = base / "root";
    outside = base / "outside";
    Reset();
  }

  // The tree as it started (saves create folders; they are dropped every few hundred inputs).
  void Reset() {
    fs::remove_all(root);
    fs::remove_all(outside);
    fs::create_directories(root / "bob" / "run" / "step-1");
    fs::create_directories(root / "alice" / "private");
    fs::create_directories(outside / "secret");
    fs::create_directory_symlink("run/step-1", root / "bob" / "latest");
    fs::create_directory_symlink("../alice", root / "bob" / "up");
    fs::create_directory_symlink(root / "alice" / "private", root / "bob" / "abs");
    fs::create_directory_symlink(outside, root / "bob" / "out");
    fs::create_directory_symlink(outside, root / "escape");
    fs::create_directory_symlink(root / "alice", root / "mallory");
    std::string error;
    FUZZ_CHECK(CheckpointRoot::Open(root.string(), &checkpoints, &error), "%s", error.c_str());
  }
};

Fixture& TheFixture() {
  static Fixture fixture;
  return fixture;
}

std::string FolderOf(int fd) { return fs::read_symlink("/proc/self/fd/" + std::to_string(fd)).string(); }

bool Inside(const std::string& path, const fs::path& folder) {
  const std::string prefix = folder.string() + "/";
  return path.compare(0, prefix.size(), prefix) == 0;
}

void CheckMessage(const grpc::Status& status) {
  if (status.ok()) return;
  const std::string& message = status.error_message();
  FUZZ_CHECK(!message.empty(), "a refusal without a message");
  FUZZ_CHECK(message.size() <= tigon::server::kStatusMessageLimit, "a message of %zu bytes", message.size());
  FUZZ_CHECK(tigon::server::ClientText(message, message.size() + 64) == message, "unescaped text in '%s'",
             message.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Fixture& f = TheFixture();
  const uint8_t selector = data[0];
  const std::string path(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Caller caller = (selector & 1) ? Caller{"", true} : Caller{"bob", false};
  const fs::path base = caller.admin ? f.root : f.root / "bob";

  tigon::server::CheckpointLocation location;
  grpc::Status status;
  switch ((selector >> 1) % 4) {
    case 0: {
      status = f.checkpoints.Locate(path, caller, &location);
      if (status.ok()) {
        FUZZ_CHECK(location.components.size() > location.namespace_depth, "no folder inside the namespace");
        if (!caller.admin) FUZZ_CHECK(location.components[0] == "bob", "namespace '%s'", location.components[0].c_str());
        std::string joined;
        for (size_t i = 0; i < location.components.size(); ++i) {
          const std::string& part = location.components[i];
          FUZZ_CHECK(!part.empty() && part != "." && part != ".." && part.find('/') == std::string::npos &&
                         part.size() <= 255 && !CheckpointRoot::IsTemporaryName(part),
                     "component '%s'", part.c_str());
          if (i >= location.namespace_depth) joined += (joined.empty() ? "" : "/") + part;
        }
        FUZZ_CHECK(joined == location.relative, "relative '%s' for '%s'", location.relative.c_str(), joined.c_str());
      }
      break;
    }
    case 1: {
      tigon::server::CheckpointLoadTarget target;
      status = f.checkpoints.OpenForLoad(path, caller, &target);
      if (status.ok()) {
        const std::string folder = FolderOf(target.folder.get());
        FUZZ_CHECK(Inside(folder, base), "loads '%s', outside '%s'", folder.c_str(), base.c_str());
      }
      break;
    }
    case 2: {
      tigon::server::CheckpointSaveTarget target;
      status = f.checkpoints.OpenForSave(path, caller, &target);
      if (status.ok()) {
        const std::string parent = FolderOf(target.parent.get());
        FUZZ_CHECK(parent == base.string() || Inside(parent, base), "saves into '%s', outside '%s'", parent.c_str(),
                   base.c_str());
        FUZZ_CHECK(CheckpointRoot::IsTemporaryName(target.name) == false && target.name.find('/') == std::string::npos,
                   "name '%s'", target.name.c_str());
        FUZZ_CHECK(f.checkpoints.CheckStillInPlace(target).ok(), "moved without anyone moving it");
      }
      FUZZ_CHECK(fs::is_empty(f.outside / "secret") && std::distance(fs::directory_iterator(f.outside),
                                                                      fs::directory_iterator()) == 1,
                 "something was created outside the root");
      if (++f.saves % 512 == 0) f.Reset();
      break;
    }
    case 3: {
      std::string folder, space;
      status = f.checkpoints.LocateFolder(path, caller, &folder, &space);
      if (status.ok()) {
        FUZZ_CHECK(space == base.string(), "namespace '%s'", space.c_str());
        FUZZ_CHECK(Inside(folder, base), "model folder '%s' outside '%s'", folder.c_str(), base.c_str());
      }
      break;
    }
  }
  CheckMessage(status);
  return 0;
}
