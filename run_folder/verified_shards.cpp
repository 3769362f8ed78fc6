// Full shard verification, once per shard per run, remembered in the run folder.
#include "run_folder/verified_shards.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "config/text_file.h"
#include "data/token_shards.h"
#include "run_folder/run_folder.h"

namespace deepen {
namespace fs = std::filesystem;

namespace {

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

ShardStamp stamp_of(const std::string& path, uint64_t payload_hash) {
  ShardStamp s;
  s.path = fs::absolute(path).lexically_normal().string();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw InputError(path + ": cannot stat: " + std::strerror(errno));
  s.bytes = static_cast<uint64_t>(st.st_size);
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  s.payload_hash = payload_hash;
  return s;
}

ShardStamp stamp_of(const Shard& shard) { return stamp_of(shard.path(), shard.header().payload_hash); }

// The record's stamps; an unreadable or malformed record counts as empty (everything is verified
// again, which is only slower).
std::vector<ShardStamp> recorded(const std::string& run_dir) {
  std::vector<ShardStamp> out;
  std::ifstream in(RunFolder(run_dir).verified_shards_json());
  if (!in) return out;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const nlohmann::json& s : j.at("shards"))
      out.push_back({s.at("path").get<std::string>(), s.at("bytes").get<uint64_t>(), s.at("mtime_ns").get<int64_t>(),
                     std::stoull(s.at("payload_hash").get<std::string>(), nullptr, 16)});
  } catch (const std::exception&) {
    out.clear();
  }
  return out;
}

}  // namespace

ShardVerification verify_shards_once(const std::string& run_dir, const std::vector<std::string>& shard_files) {
  const std::vector<ShardStamp> known = recorded(run_dir);
  ShardVerification v;
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& file : shard_files) {
    const Shard shard = Shard::open(file);
    const ShardStamp stamp = stamp_of(shard);
    if (std::find(known.begin(), known.end(), stamp) == known.end()) {
      shard.verify();  // InputError "<path>: payload hash mismatch (corrupted tokens)"
      ++v.verified;
      v.verified_bytes += stamp.bytes;
    }
    v.stamps.push_back(stamp);
  }
  v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return v;
}

ShardVerification verify_files_once(const std::string& run_dir, const std::vector<FileToVerify>& files,
                                    const std::function<void(const FileToVerify&)>& verify) {
  const std::vector<ShardStamp> known = recorded(run_dir);
  ShardVerification v;
  const auto start = std::chrono::steady_clock::now();
  for (const FileToVerify& file : files) {
    const ShardStamp stamp = stamp_of(file.path, file.hash);
    if (std::find(known.begin(), known.end(), stamp) == known.end()) {
      verify(file);
      ++v.verified;
      v.verified_bytes += stamp.bytes;
    }
    v.stamps.push_back(stamp);
  }
  v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return v;
}

void record_verified_shards(const std::string& run_dir, const std::vector<ShardStamp>& stamps) {
  nlohmann::json shards = nlohmann::json::array();
  for (const ShardStamp& s : stamps)
    shards.push_back({{"path", s.path}, {"bytes", s.bytes}, {"mtime_ns", s.mtime_ns}, {"payload_hash", hex64(s.payload_hash)}});
  fs::create_directories(run_dir);
  write_file_text(RunFolder(run_dir).verified_shards_json(), nlohmann::json{{"shards", shards}}.dump(1) + "\n",
                  "the record of verified shards");
}

}  // namespace deepen
