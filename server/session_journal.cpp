#include "server/session_journal.h"

#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/bounded_json.h"
#include "server/client_text.h"

namespace tigon::server {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSuffix = ".json";

}  // namespace

std::shared_ptr<const SessionJournal> SessionJournal::Open(const std::string& checkpoint_root, std::string* error) {
  const std::string folder = checkpoint_root + "/" + kFolderName;
  if (::mkdir(folder.c_str(), 0700) != 0 && errno != EEXIST) {
    *error = "--resume-sessions: cannot create " + folder + ": " + std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  if (::lstat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *error = "--resume-sessions: " + folder + " is not a folder";
    return nullptr;
  }
  auto journal = std::make_shared<SessionJournal>();
  journal->folder_ = folder;
  return journal;
}

bool SessionJournal::Write(const JournalRecord& record) const {
  std::string request_json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(record.request, &request_json, options).ok()) return false;
  nlohmann::json json = {{"session_id", record.session_id}, {"owner", record.owner},
                         {"owner_admin", record.owner_admin}, {"checkpoint", record.checkpoint},
                         {"step", record.step}, {"create_session_request", nlohmann::json::parse(request_json)}};
  const std::string path = folder_ + "/" + record.session_id + kSuffix;
  const std::string temp = path + ".tmp";
  {
    std::ofstream file(temp, std::ios::trunc);
    file << json.dump(1) << "\n";
    if (!file.flush()) return false;
  }
  return std::rename(temp.c_str(), path.c_str()) == 0;  // a reader sees the old record or the new one
}

bool SessionJournal::Read(const std::string& session_id, JournalRecord* record) const {
  try {
    const nlohmann::json json = ReadBoundedJsonFile(folder_ + "/" + session_id + kSuffix, 256u << 20);
    record->session_id = json.at("session_id").get<std::string>();
    record->owner = json.at("owner").get<std::string>();
    record->owner_admin = json.at("owner_admin").get<bool>();
    record->checkpoint = json.at("checkpoint").get<std::string>();
    record->step = json.at("step").get<int64_t>();
    return record->session_id == session_id &&
           google::protobuf::util::JsonStringToMessage(json.at("create_session_request").dump(), &record->request)
               .ok();
  } catch (const std::exception&) {
    return false;
  }
}

void SessionJournal::Created(const JournalRecord& record) const {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!Write(record)) spdlog::warn("--resume-sessions: could not note session {} in {}", record.session_id, folder_);
}

void SessionJournal::Checkpointed(const std::string& session_id, const std::string& checkpoint, int64_t step) const {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  JournalRecord record;
  if (!Read(session_id, &record)) return;  // a world rank, or a session from before the flag
  record.checkpoint = checkpoint;
  record.step = step;
  if (!Write(record)) spdlog::warn("--resume-sessions: could not note the checkpoint of session {}", session_id);
}

void SessionJournal::Closed(const std::string& session_id) const {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  std::error_code ignored;
  fs::remove(folder_ + "/" + session_id + kSuffix, ignored);
}

std::vector<JournalRecord> SessionJournal::Records(std::vector<std::string>* problems) const {
  std::vector<JournalRecord> out;
  if (!enabled()) return out;
  std::lock_guard<std::mutex> lock(mu_);
  std::error_code error;
  for (const auto& file : fs::directory_iterator(folder_, error)) {
    const std::string name = file.path().filename().string();
    if (name.size() <= std::string(kSuffix).size() || name.compare(name.size() - 5, 5, kSuffix) != 0) continue;
    const std::string id = name.substr(0, name.size() - 5);
    JournalRecord record;
    if (Read(id, &record)) {
      out.push_back(std::move(record));
    } else if (problems != nullptr) {
      problems->push_back(ClientText(name));
    }
  }
  return out;
}

}  // namespace tigon::server
