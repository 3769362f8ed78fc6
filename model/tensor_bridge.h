// Between safetensors entries (model/safetensors.h) and ATen tensors: dtype mapping, reading, writing.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "model/safetensors.h"

namespace deepen {

// F32 <-> kFloat, F16 <-> kHalf, BF16 <-> kBFloat16, F64, I64, I32, I16, I8, U8, BOOL. Throws
// InputError naming `what` for a type that has no counterpart.
at::ScalarType to_scalar_type(DType dtype, const std::string& what);
DType to_safetensors_dtype(at::ScalarType type, const std::string& what);

// A CPU tensor of the stored dtype and shape holding `name`'s bytes: a zero-copy view of the
// mapped shard when the data is aligned to its element size (the view keeps the shard mapped),
// otherwise a copy. Read-only: the mapping is not writable.
at::Tensor checkpoint_tensor(const SafetensorsCheckpoint& checkpoint, const std::string& name);
at::Tensor file_tensor(const SafetensorsFile& file, const TensorInfo& info);

// Every tensor of a safetensors file by name, as file_tensor gives them (read-only CPU views
// where aligned): the reading counterpart of write_tensors. Throws naming the path.
std::map<std::string, at::Tensor> read_tensors(const std::string& path);

// Writes named tensors (any device/dtype; each copied to CPU contiguous, dtype kept) with
// write_safetensors: atomic, in the given order.
void write_tensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                   const std::map<std::string, std::string>& metadata = {});

}  // namespace deepen
