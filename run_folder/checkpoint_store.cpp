// Atomic, verified checkpoint folders with keep-last-K and fallback to the previous good one.
#include "run_folder/checkpoint_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "config/hash.h"
#include "config/text_file.h"

namespace deepen {
namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "MANIFEST.json";
constexpr const char* kPrefix = "step_";


// A finished checkpoint folder is "step_" + digits only (temp folders carry a suffix).
bool is_checkpoint_name(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0 || name.size() == std::strlen(kPrefix)) return false;
  return std::all_of(name.begin() + std::strlen(kPrefix), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open for fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw std::runtime_error(path + ": fsync failed: " + std::strerror(err));
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::string checkpoint_folder_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%08lld", kPrefix, static_cast<long long>(step));
  return buf;
}

uint64_t file_checksum(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  const size_t size = static_cast<size_t>(st.st_size);
  uint64_t h = hash64(nullptr, 0);
  if (size > 0) {
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      ::close(fd);
      throw std::runtime_error(path + ": cannot map: " + std::strerror(errno));
    }
    // The data hash (several GB/s): cheap on a multi-GB optimizer state; it detects truncation and
    // bit flips, it is not cryptographic.
    h = hash64(map, size);
    ::munmap(map, size);
  }
  ::close(fd);
  return h;
}

CheckpointStore::CheckpointStore(std::string run_dir, int64_t keep)
    : root_((fs::path(run_dir) / "checkpoints").string()), keep_(std::max<int64_t>(1, keep)) {}

std::vector<std::string> CheckpointStore::list() const {
  std::vector<std::string> dirs;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return dirs;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && is_checkpoint_name(name)) dirs.push_back(entry.path().string());
  }
  std::sort(dirs.begin(), dirs.end());  // zero-padded step numbers sort by step
  return dirs;
}

std::string CheckpointStore::save(int64_t step, uint64_t config_hash,
                                  const std::function<void(const std::string&)>& write_payload) {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) throw std::runtime_error(root_ + ": cannot create checkpoint folder: " + ec.message());
  const std::string final_dir = (fs::path(root_) / checkpoint_folder_name(step)).string();
  const std::string tmp_dir = final_dir + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp_dir, ec);
  try {
    if (!fs::create_directory(tmp_dir, ec) || ec)
      throw std::runtime_error(tmp_dir + ": cannot create: " + (ec ? ec.message() : "exists"));
    write_payload(tmp_dir);

    nlohmann::json manifest;
    manifest["step"] = step;
    manifest["config_hash"] = hex64(config_hash);
    nlohmann::json files = nlohmann::json::object();
    for (const auto& entry : fs::directory_iterator(tmp_dir)) {
      if (!entry.is_regular_file()) continue;
      const std::string path = entry.path().string();
      fsync_path(path, false);
      files[entry.path().filename().string()] = {{"bytes", fs::file_size(entry.path())},
                                                 {"hash64", hex64(file_checksum(path))}};
    }
    manifest["files"] = files;
    const std::string manifest_path = (fs::path(tmp_dir) / kManifest).string();
    write_file_text(manifest_path, manifest.dump(2) + "\n", "the checkpoint's manifest");
    fsync_path(manifest_path, false);
    fsync_path(tmp_dir, true);
    if (fs::exists(final_dir)) fs::remove_all(final_dir);  // an older, superseded attempt at this step
    fs::rename(tmp_dir, final_dir, ec);
    if (ec) throw std::runtime_error(final_dir + ": rename failed: " + ec.message());
    fsync_path(root_, true);
  } catch (...) {
    std::error_code ignore;
    fs::remove_all(tmp_dir, ignore);
    throw;
  }
  prune(final_dir);
  return final_dir;
}

void CheckpointStore::prune(const std::string& just_written) const {
  std::vector<std::string> dirs = list();
  // Keep the newest `keep` that look whole; anything older goes, and so do broken ones newer than
  // the kept set, since a resume would skip them anyway. "Whole" is the manifest against the files'
  // sizes, not their hashes: re-reading every kept checkpoint at each save would cost tens of GB at
  // the paper's size, and a transient read error must not delete a good one. The checkpoint just
  // written (hashed as it was written) is always kept.
  int64_t kept = 0;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (*it == just_written || (kept < keep_ && !verify_sizes(*it))) {
      ++kept;
      continue;
    }
    std::error_code ec;
    fs::remove_all(*it, ec);
  }
}

std::optional<std::string> CheckpointStore::verify_sizes(const std::string& dir) {
  return check_manifest(dir, false);
}

std::vector<std::string> CheckpointStore::remove_stale_temporaries() const {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t tmp = name.find(".tmp-");
    if (!entry.is_directory() || tmp == std::string::npos || !is_checkpoint_name(name.substr(0, tmp))) continue;
    const std::string digits = name.substr(tmp + 5);
    if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    // kill(pid, 0) sends nothing: ESRCH says no such process. Any other answer (it runs, or it is
    // another user's) keeps the folder: only a writer known to be gone loses its work.
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code remove_ec;
    fs::remove_all(entry.path(), remove_ec);
    if (remove_ec) throw std::runtime_error(entry.path().string() + ": cannot remove the temporary folder of process " +
                                            digits + ", which no longer runs: " + remove_ec.message());
    removed.push_back(entry.path().string());
  }
  return removed;
}

std::optional<std::string> CheckpointStore::verify(const std::string& dir) { return check_manifest(dir, true); }

std::optional<std::string> CheckpointStore::check_manifest(const std::string& dir, bool hashes) {
  const fs::path manifest_path = fs::path(dir) / kManifest;
  nlohmann::json manifest;
  try {
    std::ifstream in(manifest_path);
    if (!in) return std::string("no ") + kManifest;
    manifest = nlohmann::json::parse(in);
    for (const auto& [name, info] : manifest.at("files").items()) {
      const fs::path file = fs::path(dir) / name;
      std::error_code ec;
      const uint64_t size = fs::file_size(file, ec);
      if (ec) return name + ": missing";
      if (size != info.at("bytes").get<uint64_t>())
        return name + ": " + std::to_string(size) + " bytes, manifest says " +
               std::to_string(info.at("bytes").get<uint64_t>());
      if (hashes && hex64(file_checksum(file.string())) != info.at("hash64").get<std::string>())
        return name + ": checksum mismatch";
    }
  } catch (const std::exception& e) {
    return std::string(kManifest) + ": " + e.what();
  }
  return std::nullopt;
}

std::optional<CheckpointStore::Found> CheckpointStore::latest_valid() const {
  std::vector<std::string> dirs = list();
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (auto why = verify(*it)) {
      std::cerr << "deepen: WARNING: checkpoint " << *it << " is corrupt (" << *why
                << "); falling back to the previous one\n";
      continue;
    }
    return read(*it);
  }
  return std::nullopt;
}

CheckpointStore::Found CheckpointStore::read(const std::string& dir) {
  std::ifstream in(fs::path(dir) / kManifest);
  const nlohmann::json manifest = nlohmann::json::parse(in);
  Found found;
  found.dir = dir;
  found.step = manifest.at("step").get<int64_t>();
  found.config_hash = std::stoull(manifest.at("config_hash").get<std::string>(), nullptr, 16);
  return found;
}

}  // namespace deepen
