// safetensors: validated, memory-mapped reading of single files and sharded HF checkpoints; atomic writing.
//
// Format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N, then N
// bytes of JSON {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, then the data section. Offsets are relative to the data
// section. Every check the spec asks for is made on open, so a span handed out later is always in
// bounds: header length <= 100 MB and inside the file, known dtype, non-negative shape entries,
// end - begin == numel x dtype size, tensors not overlapping and covering the data section with no
// hole, file size == 8 + N + data size. Bytes are little-endian as stored (BF16 is raw uint16).
// Tensor data is NOT guaranteed to be aligned to its element size: copy it (memcpy, or
// torch::from_blob(...).clone()) rather than reinterpret_cast it to a wider type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace deepen {

// Element types of the safetensors format that deepen reads and writes (names as in the header).
enum class DType { F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL };

size_t dtype_size(DType dtype);              // bytes per element: F32 -> 4, BF16 -> 2, BOOL -> 1
std::string dtype_name(DType dtype);         // "F32", "BF16", ...
DType parse_dtype(const std::string& name);  // "BF16" -> DType::BF16; throws InputError "unknown dtype X"
bool is_floating(DType dtype);               // F32, F16, BF16, F64

// One tensor's entry in a header. offset is absolute from the start of its file.
struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute byte offset in the file (8 + header length + data_offsets[0])
  uint64_t nbytes = 0;  // data_offsets[1] - data_offsets[0] == numel() * dtype_size(dtype)
  int64_t numel() const;  // product of shape; 1 for a scalar (shape [])
};

// "[64, 32]": how shapes appear in every error message.
std::string shape_string(const std::vector<int64_t>& shape);

// One memory-mapped .safetensors file, validated on open. Copies share the mapping; the mapping
// lives as long as any copy or any pointer returned by shared_data().
class SafetensorsFile {
 public:
  // Throws InputError "<path>: <reason>" (e.g. "<path>: header length 4096 runs past the end of
  // the file (100 bytes)").
  static SafetensorsFile open(const std::string& path);

  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  const TensorInfo& at(const std::string& name) const;    // InputError "<path>: tensor <name>: missing"
  std::span<const std::byte> data(const TensorInfo& info) const;  // info must come from this file
  // The same bytes as data(), as a pointer that keeps the mapping alive (for torch::from_blob
  // deleters or anything that outlives this object).
  std::shared_ptr<const std::byte> shared_data(const TensorInfo& info) const;

  const std::vector<TensorInfo>& tensors() const;  // in file order (ascending offset)
  const std::map<std::string, std::string>& metadata() const;  // "__metadata__", empty if absent
  const std::string& path() const;

 private:
  struct State;
  explicit SafetensorsFile(std::shared_ptr<const State> state);
  std::shared_ptr<const State> state_;
};

// A Hugging Face checkpoint folder: model.safetensors, or model.safetensors.index.json whose
// weight_map names the shard of each tensor. Shards are opened (and validated) on first use, so a
// teacher stage touches only the shards holding its tensors. Thread-safe; copies share the shards.
class SafetensorsCheckpoint {
 public:
  // Reads the index (if any) and checks every shard it references exists; with no index, opens
  // model.safetensors. Throws InputError naming the folder or file and the reason.
  static SafetensorsCheckpoint open(const std::string& dir);

  bool contains(const std::string& name) const;
  // Both throw InputError "<dir>: tensor <name>: missing" for a name not in the checkpoint, and
  // "<shard>: tensor <name>: missing (listed in <index>)" when the index points at a shard
  // that does not hold it.
  const TensorInfo& info(const std::string& name) const;
  std::span<const std::byte> data(const std::string& name) const;
  std::shared_ptr<const std::byte> shared_data(const std::string& name) const;  // keeps the shard mapped

  std::vector<std::string> names() const;                   // sorted
  std::string file_of(const std::string& name) const;       // full path of the shard holding it
  const std::string& dir() const;
  // Shard paths opened so far (sorted): lets a test show a stage read only its shards.
  std::vector<std::string> opened_files() const;

 private:
  struct State;
  explicit SafetensorsCheckpoint(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;  // numel x dtype size, little-endian
};

// Writes tensors in the given order (header padded to 8 bytes, as the Python package does, so
// readers that want aligned data get it). Writes to <path>.tmp then renames; on any failure removes
// the temp file and throws (naming the path). Bad arguments (duplicate name, byte count != numel x
// dtype size, negative dim, "__metadata__" as a name) throw InputError.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace deepen
