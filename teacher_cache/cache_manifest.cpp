// A teacher cache's manifest: JSON in and out, differences, and the teacher's identity.
#include "teacher_cache/cache_manifest.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "config/hash.h"
#include "config/input_error.h"
#include "config/text_file.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kManifestVersion = 1;

json shards_json(const std::vector<ShardIdentity>& shards) {
  json a = json::array();
  for (const ShardIdentity& s : shards) a.push_back({{"name", s.name}, {"payload_hash", hash_hex(s.payload_hash)}, {"tokens", s.tokens}});
  return a;
}

std::string shard_list(const std::vector<ShardIdentity>& shards) {
  std::string s;
  for (const ShardIdentity& x : shards) s += (s.empty() ? "" : ", ") + x.name + " (" + hash_hex(x.payload_hash) + ")";
  return "[" + s + "]";
}

// A mapped file, unmapped on scope exit.
struct Mapped {
  const unsigned char* p = nullptr;
  size_t size = 0;
  explicit Mapped(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw InputError(path + ": cannot open the teacher's weights: " + std::strerror(errno));
    struct stat st {};
    ::fstat(fd, &st);
    size = static_cast<size_t>(st.st_size);
    if (size > 0) {
      void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (m == MAP_FAILED) {
        ::close(fd);
        throw InputError(path + ": cannot map the teacher's weights: " + std::strerror(errno));
      }
      p = static_cast<const unsigned char*>(m);
    }
    ::close(fd);
  }
  ~Mapped() {
    if (p) ::munmap(const_cast<unsigned char*>(p), size);
  }
};

std::vector<std::string> safetensors_files(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path().string());
  if (ec) throw InputError(dir + ": cannot list the teacher's folder: " + ec.message());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw InputError(dir + ": no *.safetensors weights in the teacher's folder");
  return files;
}

}  // namespace

std::string cache_manifest_path(const std::string& dir) { return (fs::path(dir) / "manifest.json").string(); }
std::string cache_plan_path(const std::string& dir) { return (fs::path(dir) / "plan.json").string(); }

std::string hash_hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

uint64_t parse_hash_hex(const std::string& text, const std::string& what) {
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw InputError(what + ": expected 16 hex digits, got \"" + text + "\"");
  return std::stoull(text, nullptr, 16);
}

int64_t CacheManifest::bytes() const {
  int64_t b = 0;
  for (const CacheFileEntry& f : files) b += static_cast<int64_t>(f.bytes);
  return b;
}

std::string cache_manifest_json(const CacheManifest& m) {
  json files = json::array();
  for (const CacheFileEntry& f : m.files)
    files.push_back({{"path", f.path}, {"split", f.split}, {"first_sequence", f.first_sequence}, {"sequences", f.sequences},
                     {"records", f.records}, {"bytes", f.bytes}, {"hash", hash_hex(f.hash)}});
  const json j = {
      {"format", "deepen teacher cache"},
      {"version", kManifestVersion},
      {"teacher",
       {{"checkpoint", m.teacher_checkpoint},
        {"fingerprint", hash_hex(m.teacher_fingerprint)},
        {"weights_hash", hash_hex(m.teacher_weights_hash)},
        {"dtype", option_name(m.teacher_dtype)},
        {"vocab", m.vocab}}},
      {"tokenizer", {{"spec", m.tokenizer}, {"fingerprint", hash_hex(m.tokenizer_fingerprint)}}},
      {"data",
       {{"packing", option_name(m.packing)},
        {"seq_len", m.seq_len},
        {"max_len", m.max_len},
        {"train_shards", shards_json(m.train_shards)},
        {"valid_shards", shards_json(m.valid_shards)},
        {"train_sequences", m.train_sequences},
        {"valid_sequences", m.valid_sequences},
        {"train_records", m.train_records},
        {"valid_records", m.valid_records}}},
      {"draws",
       {{"samples", m.samples},
        {"topk", m.topk},
        {"seed", m.seed},
        {"train_temperature", m.train_temperature},
        {"valid_temperature", m.valid_temperature}}},
      {"bytes", m.bytes()},
      {"files", files}};
  return j.dump(2) + "\n";
}

CacheManifest parse_cache_manifest(const std::string& text, const std::string& path) {
  CacheManifest m;
  try {
    const json j = json::parse(text);
    if (j.value("format", std::string()) != "deepen teacher cache") throw InputError(path + ": not a teacher cache manifest");
    if (j.at("version").get<int>() != kManifestVersion)
      throw InputError(path + ": manifest version " + std::to_string(j.at("version").get<int>()) + ", this deepen reads " +
                       std::to_string(kManifestVersion));
    const json& t = j.at("teacher");
    m.teacher_checkpoint = t.at("checkpoint").get<std::string>();
    m.teacher_fingerprint = parse_hash_hex(t.at("fingerprint").get<std::string>(), path + ": teacher.fingerprint");
    m.teacher_weights_hash = parse_hash_hex(t.at("weights_hash").get<std::string>(), path + ": teacher.weights_hash");
    m.teacher_dtype = parse_option<FloatDtype>(t.at("dtype").get<std::string>(), path + ": teacher.dtype");
    m.vocab = t.at("vocab").get<int64_t>();
    m.tokenizer = j.at("tokenizer").at("spec").get<std::string>();
    m.tokenizer_fingerprint = parse_hash_hex(j.at("tokenizer").at("fingerprint").get<std::string>(), path + ": tokenizer");
    const json& d = j.at("data");
    m.packing = parse_option<Packing>(d.at("packing").get<std::string>(), path + ": data.packing");
    m.seq_len = d.at("seq_len").get<int64_t>();
    m.max_len = d.at("max_len").get<int64_t>();
    for (const char* key : {"train_shards", "valid_shards"}) {
      auto& out = std::string(key) == "train_shards" ? m.train_shards : m.valid_shards;
      for (const json& s : d.at(key))
        out.push_back({s.at("name").get<std::string>(), parse_hash_hex(s.at("payload_hash").get<std::string>(), path + ": " + key),
                       s.at("tokens").get<int64_t>()});
    }
    m.train_sequences = d.at("train_sequences").get<int64_t>();
    m.valid_sequences = d.at("valid_sequences").get<int64_t>();
    m.train_records = d.at("train_records").get<int64_t>();
    m.valid_records = d.at("valid_records").get<int64_t>();
    const json& r = j.at("draws");
    m.samples = r.at("samples").get<int64_t>();
    m.topk = r.at("topk").get<int64_t>();
    m.seed = r.at("seed").get<int64_t>();
    m.train_temperature = r.at("train_temperature").get<double>();
    m.valid_temperature = r.at("valid_temperature").get<double>();
    for (const json& f : j.at("files"))
      m.files.push_back({f.at("path").get<std::string>(), f.at("split").get<int64_t>(), f.at("first_sequence").get<int64_t>(),
                         f.at("sequences").get<int64_t>(), f.at("records").get<int64_t>(), f.at("bytes").get<uint64_t>(),
                         parse_hash_hex(f.at("hash").get<std::string>(), path + ": files")});
  } catch (const json::exception& e) {
    throw InputError(path + ": malformed teacher cache manifest: " + e.what());
  }
  return m;
}

CacheManifest read_cache_manifest(const std::string& dir) {
  const std::string path = cache_manifest_path(dir);
  if (!fs::exists(path))
    throw InputError(dir + ": not a finished teacher cache (no manifest.json; `deepen cache CONFIG --out " + dir +
                     "` writes or completes one)");
  return parse_cache_manifest(read_file_text(path, "teacher cache manifest"), path);
}

std::vector<std::string> manifest_differences(const CacheManifest& want, const CacheManifest& have) {
  std::vector<std::string> out;
  auto cmp = [&](const std::string& field, const auto& a, const auto& b) {
    if (a == b) return;
    std::ostringstream o;
    o << field << ": " << a << " vs " << b;
    out.push_back(o.str());
  };
  cmp("teacher fingerprint (teacher.checkpoint)", hash_hex(want.teacher_fingerprint), hash_hex(have.teacher_fingerprint));
  cmp("teacher dtype (teacher.dtype)", option_name(want.teacher_dtype), option_name(have.teacher_dtype));
  cmp("vocabulary", want.vocab, have.vocab);
  cmp("tokenizer (data.tokenizer)", want.tokenizer + " " + hash_hex(want.tokenizer_fingerprint),
      have.tokenizer + " " + hash_hex(have.tokenizer_fingerprint));
  cmp("packing (data.packing)", option_name(want.packing), option_name(have.packing));
  cmp("seq_len (data.seq_len)", want.seq_len, have.seq_len);
  cmp("max_len (data.max_len)", want.max_len, have.max_len);
  cmp("train shards (data.train)", shard_list(want.train_shards), shard_list(have.train_shards));
  cmp("validation shards (data.valid)", shard_list(want.valid_shards), shard_list(have.valid_shards));
  cmp("train sequences (cache.train_sequences)", want.train_sequences, have.train_sequences);
  cmp("validation sequences (cache.valid_sequences)", want.valid_sequences, have.valid_sequences);
  cmp("samples (cache.samples)", want.samples, have.samples);
  cmp("top-k (cache.topk)", want.topk, have.topk);
  cmp("seed (cache.seed)", want.seed, have.seed);
  cmp("temperature (distill.temperature)", want.train_temperature, have.train_temperature);
  return out;
}

uint64_t teacher_fingerprint(const std::string& dir) {
  const std::string config = (fs::path(dir) / "config.json").string();
  const std::string config_text = read_file_text(config, "teacher config");
  uint64_t h = hash64(config_text);
  constexpr size_t kBlocks = 64, kBlock = size_t(64) << 10;
  for (const std::string& path : safetensors_files(dir)) {
    const Mapped f(path);
    h = mix64(h ^ hash64(fs::path(path).filename().string()) ^ f.size);
    if (f.size < 8) throw InputError(path + ": not a safetensors file (shorter than its header length)");
    uint64_t header_len = 0;
    std::memcpy(&header_len, f.p, 8);
    const size_t data_begin = std::min(f.size, static_cast<size_t>(8 + std::min<uint64_t>(header_len, f.size)));
    h = mix64(h ^ hash64(f.p, data_begin, 1));
    const size_t data = f.size - data_begin;
    for (size_t b = 0; b < kBlocks && data > 0; ++b) {
      const size_t at = data_begin + (data > kBlock ? (data - kBlock) * b / (kBlocks - 1) : 0);
      h = mix64(h ^ hash64(f.p + at, std::min(kBlock, f.size - at), b + 2));
    }
  }
  return h;
}

uint64_t teacher_weights_hash(const std::string& dir) {
  uint64_t h = 0;
  for (const std::string& path : safetensors_files(dir)) {
    const Mapped f(path);
    h = mix64(h ^ hash64(f.p, f.size, h));
  }
  return h;
}

}  // namespace deepen
