// The optimizer state of a checkpoint folder, whichever way it was written: one replicated file
// (optimizer.safetensors) or one shard per student (optimizer.shard-R-of-S.safetensors).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace deepen {

// How many optimizer shard files the checkpoint holds: 0 for a replicated checkpoint. Throws
// std::runtime_error naming the folder when shard files of different counts, or a missing shard,
// are found.
int64_t optimizer_shard_count(const std::string& checkpoint_dir);

// The whole-parameter state (AdamW::state_tensors' names: "<name>.exp_avg", "<name>.exp_avg_sq",
// "<name>.step") of either form. A sharded checkpoint's slices are placed by their offsets into
// zero tensors of `shapes` (every parameter that holds state, by name); a parameter the shards do
// not cover exactly is a std::runtime_error naming it. This is what lets a checkpoint resume on
// another student count, or replicated after sharded and the other way round.
std::map<std::string, at::Tensor> read_whole_optimizer_state(
    const std::string& checkpoint_dir, const std::map<std::string, std::vector<int64_t>>& shapes);

}  // namespace deepen
