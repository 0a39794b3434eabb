// --resume-sessions: what the server notes about each session so that a restarted server can bring it
// back at its last checkpoint. One JSON file per session under <checkpoint-root>/+sessions/ (a name no
// principal can have, so no caller reaches it): its id, owner, the CreateSession request it was made
// from, and the root-relative folder of the checkpoint it was last saved to or loaded from. Written
// when the session is created and after every save or load, removed when it is closed by its client or
// for idleness; kept when the server stops, and after a crash. A session never saved is not resumable.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/checkpoint_paths.h"
#include "tigon/v1/trainer.pb.h"

namespace tigon::server {

struct JournalRecord {
  std::string session_id;
  std::string owner;
  bool owner_admin = false;
  v1::CreateSessionRequest request;
  std::string checkpoint;  // root-relative; empty: never saved
  int64_t step = 0;        // the step the checkpoint holds
};

class SessionJournal {
 public:
  static constexpr const char* kFolderName = kSessionJournalFolder;

  SessionJournal() = default;  // disabled
  SessionJournal(const SessionJournal&) = delete;
  SessionJournal& operator=(const SessionJournal&) = delete;
  // Creates <checkpoint_root>/+sessions (mode 0700) when missing.
  static std::shared_ptr<const SessionJournal> Open(const std::string& checkpoint_root, std::string* error);
  bool enabled() const { return !folder_.empty(); }

  void Created(const JournalRecord& record) const;
  void Checkpointed(const std::string& session_id, const std::string& checkpoint, int64_t step) const;
  void Closed(const std::string& session_id) const;

  // Every record; a file that does not read back is skipped and named in `problems`.
  std::vector<JournalRecord> Records(std::vector<std::string>* problems) const;

 private:
  bool Write(const JournalRecord& record) const;  // under mu_
  bool Read(const std::string& session_id, JournalRecord* record) const;

  std::string folder_;
  mutable std::mutex mu_;
};

}  // namespace tigon::server
