// safetensors: header validation, mmap-backed reading, sharded index lookup, atomic writing.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "config/input_error.h"

namespace deepen {

static_assert(std::endian::native == std::endian::little,
              "safetensors bytes are little-endian; deepen hands them out as stored");

namespace {

// The reference implementation's limit (safetensors' MAX_HEADER_SIZE): a header larger than this is
// a corrupt length field, not a real checkpoint, and must not make us parse gigabytes of JSON.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeName {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeName kDTypes[] = {
    {DType::F32, "F32", 4}, {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2}, {DType::F64, "F64", 8},
    {DType::I64, "I64", 8}, {DType::I32, "I32", 4}, {DType::I16, "I16", 2},   {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},   {DType::BOOL, "BOOL", 1},
};

const DTypeName& dtype_entry(DType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype) return e;
  throw std::logic_error("dtype_entry: unhandled DType");
}

std::string errno_text() { return std::strerror(errno); }

// numel x element size, or nullopt on overflow or a negative dimension.
std::optional<uint64_t> byte_count(const std::vector<int64_t>& shape, DType dtype) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

std::string offsets_string(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// A non-negative JSON integer; otherwise InputError "<where>: expected a non-negative integer, got ..".
uint64_t json_u64(const nlohmann::json& v, const std::string& where) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  throw InputError(where + ": expected a non-negative integer, got " + v.dump());
}

}  // namespace

size_t dtype_size(DType dtype) { return dtype_entry(dtype).size; }
std::string dtype_name(DType dtype) { return dtype_entry(dtype).name; }

DType parse_dtype(const std::string& name) {
  for (const auto& e : kDTypes)
    if (name == e.name) return e.dtype;
  throw InputError("unknown dtype \"" + name + "\" (deepen reads F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL)");
}

bool is_floating(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16 || dtype == DType::F64;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

struct SafetensorsFile::State {
  std::string path;
  const std::byte* base = nullptr;  // whole file, read-only private mapping
  uint64_t size = 0;
  std::vector<TensorInfo> tensors;                  // ascending offset
  std::unordered_map<std::string, size_t> by_name;  // index into tensors
  std::map<std::string, std::string> metadata;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (base) munmap(const_cast<std::byte*>(base), size);
  }
};

SafetensorsFile::SafetensorsFile(std::shared_ptr<const State> state) : state_(std::move(state)) {}

namespace {

// Parses and validates the JSON header against a data section of `data_size` bytes that starts at
// absolute offset `data_start`. Fills tensors (sorted by offset), by_name and metadata.
void parse_header(const std::string& path, std::string_view header, uint64_t data_start, uint64_t data_size,
                  std::vector<TensorInfo>& tensors, std::unordered_map<std::string, size_t>& by_name,
                  std::map<std::string, std::string>& metadata) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(path + ": malformed JSON header: " + e.what());
  }
  if (!j.is_object()) throw InputError(path + ": malformed header: expected a JSON object, got " + j.type_name());

  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Range> ranges;
  for (const auto& [name, entry] : j.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw InputError(path + ": __metadata__: expected an object of strings");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) throw InputError(path + ": __metadata__." + k + ": expected a string, got " + v.dump());
        metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor " + name;
    if (!entry.is_object()) throw InputError(where + ": expected an object with dtype, shape, data_offsets");
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!entry.contains(key)) throw InputError(where + ": " + key + ": missing");
    const auto& jd = entry["dtype"];
    if (!jd.is_string()) throw InputError(where + ": dtype: expected a string, got " + jd.dump());
    TensorInfo info;
    info.name = name;
    try {
      info.dtype = parse_dtype(jd.get<std::string>());
    } catch (const InputError& e) {
      throw InputError(where + ": " + e.what());
    }
    const auto& js = entry["shape"];
    if (!js.is_array()) throw InputError(where + ": shape: expected an array, got " + js.dump());
    for (const auto& d : js) {
      const uint64_t v = json_u64(d, where + ": shape");
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw InputError(where + ": shape: dimension " + d.dump() + " is too large");
      info.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& jo = entry["data_offsets"];
    if (!jo.is_array() || jo.size() != 2)
      throw InputError(where + ": data_offsets: expected [begin, end], got " + jo.dump());
    const uint64_t begin = json_u64(jo[0], where + ": data_offsets");
    const uint64_t end = json_u64(jo[1], where + ": data_offsets");
    if (end < begin) throw InputError(where + ": data_offsets " + offsets_string(begin, end) + ": end before begin");
    if (end > data_size)
      throw InputError(where + ": data_offsets " + offsets_string(begin, end) + " out of range: the data section is " +
                       std::to_string(data_size) + " bytes (truncated file or corrupt header)");
    const auto need = byte_count(info.shape, info.dtype);
    if (!need || *need != end - begin)
      throw InputError(where + ": data_offsets " + offsets_string(begin, end) + " hold " + std::to_string(end - begin) +
                       " bytes, but shape " + shape_string(info.shape) + " x " + dtype_name(info.dtype) + " needs " +
                       (need ? std::to_string(*need) : std::string("more than 2^64")));
    info.offset = data_start + begin;
    info.nbytes = end - begin;
    ranges.push_back({begin, end, tensors.size()});
    tensors.push_back(std::move(info));
  }

  // The spec forbids holes and overlaps: sorted by offset, each tensor starts where the previous
  // ended, the first at 0 and the last ending at the end of the file. Zero-byte tensors sort first
  // at their offset, so they never look like an overlap.
  std::sort(ranges.begin(), ranges.end(), [&](const Range& a, const Range& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return tensors[a.index].name < tensors[b.index].name;
  });
  uint64_t covered = 0;
  const Range* prev = nullptr;
  for (const auto& r : ranges) {
    const std::string& name = tensors[r.index].name;
    if (r.begin < covered)
      throw InputError(path + ": tensors " + tensors[prev->index].name + " " + offsets_string(prev->begin, prev->end) +
                       " and " + name + " " + offsets_string(r.begin, r.end) + " overlap");
    if (r.begin > covered)
      throw InputError(path + ": hole of " + std::to_string(r.begin - covered) + " bytes in the data section before tensor " +
                       name + " " + offsets_string(r.begin, r.end) + " (the format requires tensors to cover it without gaps)");
    covered = r.end;
    prev = &r;
  }
  if (covered != data_size)
    throw InputError(path + ": file size inconsistent with the header: tensors cover " + std::to_string(covered) +
                     " bytes of a " + std::to_string(data_size) + "-byte data section");

  std::vector<TensorInfo> sorted;
  sorted.reserve(tensors.size());
  for (const auto& r : ranges) sorted.push_back(std::move(tensors[r.index]));
  tensors = std::move(sorted);
  for (size_t i = 0; i < tensors.size(); ++i) by_name.emplace(tensors[i].name, i);
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto state = std::make_shared<State>();
  state->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path + ": cannot open: " + errno_text());
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) throw InputError(path + ": cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) throw InputError(path + ": not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8)
    throw InputError(path + ": truncated: " + std::to_string(size) +
                     " bytes, too short for the 8-byte header length that starts a safetensors file");

  void* base = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (base == MAP_FAILED) throw InputError(path + ": cannot mmap: " + errno_text());
  state->base = static_cast<const std::byte*>(base);
  state->size = size;

  uint64_t header_len = 0;
  std::memcpy(&header_len, state->base, 8);  // little-endian on disk and (static_assert) in memory
  if (header_len > kMaxHeaderBytes)
    throw InputError(path + ": header length " + std::to_string(header_len) + " exceeds the 100 MB limit (" +
                     std::to_string(kMaxHeaderBytes) + " bytes); the file is corrupt or not safetensors");
  if (header_len > size - 8)
    throw InputError(path + ": truncated or corrupt: header length " + std::to_string(header_len) +
                     " runs past the end of the file (" + std::to_string(size) + " bytes)");
  const std::string_view header(reinterpret_cast<const char*>(state->base) + 8, header_len);
  const uint64_t data_start = 8 + header_len;
  parse_header(path, header, data_start, size - data_start, state->tensors, state->by_name, state->metadata);
  return SafetensorsFile(std::move(state));
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = state_->by_name.find(name);
  return it == state_->by_name.end() ? nullptr : &state_->tensors[it->second];
}

const TensorInfo& SafetensorsFile::at(const std::string& name) const {
  if (const TensorInfo* info = find(name)) return *info;
  throw InputError(state_->path + ": tensor " + name + ": missing");
}

std::span<const std::byte> SafetensorsFile::data(const TensorInfo& info) const {
  // Infos are validated on open; this guards against one from another file being passed in.
  if (info.offset > state_->size || info.nbytes > state_->size - info.offset)
    throw std::logic_error(state_->path + ": tensor " + info.name + ": info does not belong to this file");
  return {state_->base + info.offset, static_cast<size_t>(info.nbytes)};
}

std::shared_ptr<const std::byte> SafetensorsFile::shared_data(const TensorInfo& info) const {
  return std::shared_ptr<const std::byte>(state_, data(info).data());
}

const std::vector<TensorInfo>& SafetensorsFile::tensors() const { return state_->tensors; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return state_->metadata; }
const std::string& SafetensorsFile::path() const { return state_->path; }

// ---------------------------------------------------------------------------------------------
// SafetensorsCheckpoint

struct SafetensorsCheckpoint::State {
  std::string dir;
  std::string index_path;                        // "" for a single-file checkpoint
  std::map<std::string, std::string> weight_map;  // tensor name -> shard path
  std::mutex mutex;                              // guards shards
  std::map<std::string, SafetensorsFile> shards;  // shard path -> opened file
};

SafetensorsCheckpoint::SafetensorsCheckpoint(std::shared_ptr<State> state) : state_(std::move(state)) {}

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

}  // namespace

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  auto state = std::make_shared<State>();
  state->dir = dir;
  std::error_code ec;
  auto add_single = [&](const std::string& file) {
    SafetensorsFile f = SafetensorsFile::open(file);
    for (const auto& t : f.tensors()) state->weight_map.emplace(t.name, file);
    state->shards.emplace(file, std::move(f));
  };

  if (fs::is_regular_file(dir, ec)) {  // a lone .safetensors file is a one-shard checkpoint
    add_single(dir);
    return SafetensorsCheckpoint(std::move(state));
  }
  if (!fs::is_directory(dir, ec)) throw InputError(dir + ": no such checkpoint folder or file");
  const std::string index_path = (fs::path(dir) / kIndexFile).string();
  const std::string single_path = (fs::path(dir) / kSingleFile).string();
  if (!fs::exists(index_path, ec)) {
    if (!fs::exists(single_path, ec))
      throw InputError(dir + ": not a safetensors checkpoint: neither " + kSingleFile + " nor " + kIndexFile + " is there");
    add_single(single_path);
    return SafetensorsCheckpoint(std::move(state));
  }

  state->index_path = index_path;
  nlohmann::json j;
  {
    std::ifstream in(index_path, std::ios::binary);
    if (!in) throw InputError(index_path + ": cannot open: " + errno_text());
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::parse_error& e) {
      throw InputError(index_path + ": malformed JSON: " + e.what());
    }
  }
  if (!j.is_object() || !j.contains("weight_map")) throw InputError(index_path + ": weight_map: missing");
  const auto& wm = j["weight_map"];
  if (!wm.is_object()) throw InputError(index_path + ": weight_map: expected an object {tensor: shard file}");
  std::map<std::string, std::string> checked;  // shard file name -> first tensor naming it
  for (const auto& [name, shard] : wm.items()) {
    if (!shard.is_string())
      throw InputError(index_path + ": weight_map." + name + ": expected a shard file name, got " + shard.dump());
    const std::string file = shard.get<std::string>();
    // Shards live next to the index; a path that leaves the folder is not a HF checkpoint.
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      throw InputError(index_path + ": weight_map." + name + ": \"" + file + "\" is not a file name in the folder");
    const std::string shard_path = (fs::path(dir) / file).string();
    if (checked.emplace(file, name).second && !fs::is_regular_file(shard_path, ec))
      throw InputError(index_path + ": shard " + file + " (holding " + name + ") does not exist");
    state->weight_map.emplace(name, shard_path);
  }
  return SafetensorsCheckpoint(std::move(state));
}

bool SafetensorsCheckpoint::contains(const std::string& name) const { return state_->weight_map.count(name) > 0; }

const TensorInfo& SafetensorsCheckpoint::info(const std::string& name) const {
  const auto it = state_->weight_map.find(name);
  if (it == state_->weight_map.end()) throw InputError(state_->dir + ": tensor " + name + ": missing");
  const std::string& shard_path = it->second;
  SafetensorsFile file = [&] {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto s = state_->shards.find(shard_path);
    if (s == state_->shards.end()) s = state_->shards.emplace(shard_path, SafetensorsFile::open(shard_path)).first;
    return s->second;
  }();
  // The reference stays valid: the State of `file` is also held by state_->shards.
  if (const TensorInfo* info = file.find(name)) return *info;
  throw InputError(shard_path + ": tensor " + name + ": missing (listed in " + state_->index_path + ")");
}

std::span<const std::byte> SafetensorsCheckpoint::data(const std::string& name) const {
  const TensorInfo& i = info(name);
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->shards.at(state_->weight_map.at(name)).data(i);
}

std::shared_ptr<const std::byte> SafetensorsCheckpoint::shared_data(const std::string& name) const {
  const TensorInfo& i = info(name);
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->shards.at(state_->weight_map.at(name)).shared_data(i);
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(state_->weight_map.size());
  for (const auto& [name, _] : state_->weight_map) out.push_back(name);
  return out;
}

std::string SafetensorsCheckpoint::file_of(const std::string& name) const {
  const auto it = state_->weight_map.find(name);
  if (it == state_->weight_map.end()) throw InputError(state_->dir + ": tensor " + name + ": missing");
  return it->second;
}

const std::string& SafetensorsCheckpoint::dir() const { return state_->dir; }

std::vector<std::string> SafetensorsCheckpoint::opened_files() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  std::vector<std::string> out;
  for (const auto& [path, _] : state_->shards) out.push_back(path);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writing

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Header: __metadata__ first, then tensors in the caller's order with consecutive offsets.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const std::string where = path + ": tensor " + t.name;
    if (t.name.empty() || t.name == "__metadata__") throw InputError(path + ": invalid tensor name \"" + t.name + "\"");
    if (header.contains(t.name)) throw InputError(where + ": written twice");
    const auto need = byte_count(t.shape, t.dtype);
    if (!need) throw InputError(where + ": invalid shape " + shape_string(t.shape));
    if (*need != t.bytes.size())
      throw InputError(where + ": " + std::to_string(t.bytes.size()) + " bytes given, shape " + shape_string(t.shape) +
                       " x " + dtype_name(t.dtype) + " needs " + std::to_string(*need));
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + *need}}};
    offset += *need;
  }
  std::string text = header.dump();
  // Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned, as the
  // Python package does.
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(path + ": cannot create " + tmp + ": " + errno_text());
  auto fail = [&](const std::string& what) {
    const std::string reason = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    throw std::runtime_error(path + ": " + what + ": " + reason);
  };
  auto write_all = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd, c, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        fail("cannot write " + tmp);
      }
      c += w;
      n -= static_cast<size_t>(w);
    }
  };
  write_all(&header_len, 8);
  write_all(text.data(), text.size());
  for (const auto& t : tensors) write_all(t.bytes.data(), t.bytes.size());
  // fsync before rename: after a crash the name points at either the old or the complete new file.
  if (::fsync(fd) != 0) fail("cannot fsync " + tmp);
  if (::close(fd) != 0) {
    const std::string reason = errno_text();
    ::unlink(tmp.c_str());
    throw std::runtime_error(path + ": cannot close " + tmp + ": " + reason);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = errno_text();
    ::unlink(tmp.c_str());
    throw std::runtime_error(path + ": cannot rename " + tmp + " into place: " + reason);
  }
}

}  // namespace deepen
