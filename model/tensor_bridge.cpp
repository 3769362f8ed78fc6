// Safetensors <-> ATen: dtype table, zero-copy reads of mapped shards, writes through write_safetensors.
#include "model/tensor_bridge.h"

#include <cstdint>
#include <cstring>

#include <ATen/ATen.h>

#include "config/input_error.h"

namespace deepen {

at::ScalarType to_scalar_type(DType dtype, const std::string& what) {
  switch (dtype) {
    case DType::F32: return at::kFloat;
    case DType::F16: return at::kHalf;
    case DType::BF16: return at::kBFloat16;
    case DType::F64: return at::kDouble;
    case DType::I64: return at::kLong;
    case DType::I32: return at::kInt;
    case DType::I16: return at::kShort;
    case DType::I8: return at::kChar;
    case DType::U8: return at::kByte;
    case DType::BOOL: return at::kBool;
  }
  throw InputError(what + ": unsupported dtype");
}

DType to_safetensors_dtype(at::ScalarType type, const std::string& what) {
  switch (type) {
    case at::kFloat: return DType::F32;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    case at::kDouble: return DType::F64;
    case at::kLong: return DType::I64;
    case at::kInt: return DType::I32;
    case at::kShort: return DType::I16;
    case at::kChar: return DType::I8;
    case at::kByte: return DType::U8;
    case at::kBool: return DType::BOOL;
    default: break;
  }
  throw InputError(what + ": dtype " + std::string(c10::toString(type)) + " has no safetensors type");
}

namespace {

at::Tensor view_or_copy(const TensorInfo& info, std::shared_ptr<const std::byte> bytes,
                        const std::string& what) {
  const auto options = at::TensorOptions().dtype(to_scalar_type(info.dtype, what));
  const auto address = reinterpret_cast<uintptr_t>(bytes.get());
  if (address % dtype_size(info.dtype) == 0) {
    // The deleter owns a reference to the mapping, so the view stays valid however long it lives.
    // Take the address before the deleter's capture moves `bytes` (argument order is unspecified).
    void* data = const_cast<std::byte*>(bytes.get());
    return at::from_blob(data, info.shape, [keep = std::move(bytes)](void*) mutable { keep.reset(); }, options);
  }
  at::Tensor copy = at::empty(info.shape, options);
  if (info.nbytes > 0) std::memcpy(copy.data_ptr(), bytes.get(), info.nbytes);
  return copy;
}

}  // namespace

at::Tensor checkpoint_tensor(const SafetensorsCheckpoint& checkpoint, const std::string& name) {
  return view_or_copy(checkpoint.info(name), checkpoint.shared_data(name),
                      checkpoint.file_of(name) + ": tensor " + name);
}

at::Tensor file_tensor(const SafetensorsFile& file, const TensorInfo& info) {
  return view_or_copy(info, file.shared_data(info), file.path() + ": tensor " + info.name);
}

std::map<std::string, at::Tensor> read_tensors(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& info : file.tensors()) out[info.name] = file_tensor(file, info);
  return out;
}

void write_tensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                   const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> keep;  // the CPU copies the spans below point into
  std::vector<TensorToWrite> entries;
  keep.reserve(tensors.size());
  entries.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    keep.push_back(tensor.detach().to(at::kCPU).contiguous());
    const at::Tensor& t = keep.back();
    TensorToWrite entry;
    entry.name = name;
    entry.dtype = to_safetensors_dtype(t.scalar_type(), path + ": tensor " + name);
    entry.shape.assign(t.sizes().begin(), t.sizes().end());
    entry.bytes = std::span<const std::byte>(static_cast<const std::byte*>(t.data_ptr()), t.nbytes());
    entries.push_back(std::move(entry));
  }
  write_safetensors(path, entries, metadata);
}

}  // namespace deepen
