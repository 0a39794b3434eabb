// --resume-sessions: at start, the sessions of the journal (session_journal.h) come back at their last
// checkpoint, under their ids and owners, so that a client retrying across a server restart finds them.
#include <spdlog/spdlog.h>

#include "server/checkpoint_paths.h"
#include "server/client_text.h"
#include "server/status_map.h"
#include "server/trainer_service.h"

namespace tigon::server {

int TrainerService::ResumeSessions() {
  std::vector<std::string> unreadable;
  int resumed = 0;
  for (const JournalRecord& record : journal_.Records(&unreadable)) {
    if (record.checkpoint.empty()) {
      spdlog::warn("session {} is not resumed: it never saved or loaded a checkpoint", record.session_id);
      journal_.Closed(record.session_id);
      continue;
    }
    const Caller owner{record.owner, record.owner_admin};
    auto entry = std::make_shared<SessionEntry>();
    entry->id = record.session_id;
    entry->sequence.BeginStreamsAtFirstCall();
    grpc::Status status = BuildSession(owner, record.request, /*ctx=*/nullptr, &entry);
    if (status.ok()) {
      // The journal holds the folder from the root: opened as the server itself (an admin).
      CheckpointLoadTarget target;
      status = checkpoints_.OpenForLoad(record.checkpoint, Caller{"", true}, &target);
      if (status.ok()) {
        std::lock_guard<std::timed_mutex> step_lock(entry->step_mu);
        const tigon::Status loaded =
            entry->session->LoadCheckpointAt(target.folder.get(), "'" + ClientText(record.checkpoint) + "'");
        status = ToGrpcStatus(loaded);
        entry->RefreshInfo();
      }
      if (!status.ok() && sessions_.Remove(entry->id)) {
        std::lock_guard<std::timed_mutex> step_lock(entry->step_mu);
        CloseEntry(*entry, " (it could not be resumed)");
      }
    }
    if (!status.ok()) {
      spdlog::warn("session {} is not resumed from checkpoint '{}': {}", record.session_id,
                   ClientText(record.checkpoint), ClientText(status.error_message()));
      journal_.Closed(record.session_id);
      continue;
    }
    ++resumed;
    spdlog::info("session {} resumed at step {} from checkpoint '{}' (owner {})", entry->id,
                 entry->InfoSnapshot().step, ClientText(record.checkpoint),
                 record.owner.empty() ? std::string("anonymous") : ClientText(record.owner));
  }
  for (const std::string& file : unreadable) {
    spdlog::warn("--resume-sessions: {} under {} does not read as a session record; left as it is", file,
                 SessionJournal::kFolderName);
  }
  return resumed;
}

}  // namespace tigon::server
