// Reading a checkpoint's optimizer state: replicated file or shards assembled into whole moments.
#include "train/optimizer_state_files.h"

#include <filesystem>
#include <regex>
#include <set>
#include <stdexcept>
#include <string_view>

#include <ATen/ATen.h>

#include "model/tensor_bridge.h"
#include "run_folder/run_folder.h"

namespace deepen {

int64_t optimizer_shard_count(const std::string& checkpoint_dir) {
  static const std::regex shard_name(R"(optimizer\.shard-(\d{5})-of-(\d{5})\.safetensors)");
  std::set<int64_t> counts, ranks;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoint_dir)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, shard_name)) continue;
    ranks.insert(std::stoll(m[1]));
    counts.insert(std::stoll(m[2]));
  }
  if (counts.empty()) return 0;
  const int64_t n = *counts.begin();
  if (counts.size() > 1 || static_cast<int64_t>(ranks.size()) != n || *ranks.rbegin() != n - 1)
    throw std::runtime_error(checkpoint_dir + ": optimizer shards are incomplete or of different student counts");
  return n;
}

std::map<std::string, at::Tensor> read_whole_optimizer_state(
    const std::string& checkpoint_dir, const std::map<std::string, std::vector<int64_t>>& shapes) {
  const int64_t shards = optimizer_shard_count(checkpoint_dir);
  if (shards == 0) return read_tensors(RunFolder::checkpoint_optimizer(checkpoint_dir));
  std::map<std::string, at::Tensor> out;
  std::map<std::string, int64_t> covered;
  for (const auto& [name, shape] : shapes) {
    out[name + ".exp_avg"] = at::zeros(shape, at::kFloat);
    out[name + ".exp_avg_sq"] = at::zeros(shape, at::kFloat);
    covered[name] = 0;
  }
  for (int64_t r = 0; r < shards; ++r) {
    const std::string path = RunFolder::checkpoint_optimizer_shard(checkpoint_dir, r, shards);
    const std::map<std::string, at::Tensor> part = read_tensors(path);
    for (const auto& [key, t] : part) {
      // A slice is found by its offset entry; its moments are read by the same name below.
      constexpr std::string_view kStep = ".step", kOffset = ".offset";
      if (key.ends_with(kStep) && shapes.count(key.substr(0, key.size() - kStep.size()))) out[key] = t.clone();
      if (!key.ends_with(kOffset)) continue;
      const std::string name = key.substr(0, key.size() - kOffset.size());
      if (!shapes.count(name)) continue;  // state of a parameter that no longer trains
      const int64_t offset = t.item<int64_t>();
      for (const char* m : {".exp_avg", ".exp_avg_sq"}) {
        auto it = part.find(name + m);
        if (it == part.end()) throw std::runtime_error(path + ": " + name + ".offset without " + name + m);
        at::Tensor whole = out[name + m].view({-1});
        if (offset < 0 || offset + it->second.numel() > whole.numel())
          throw std::runtime_error(path + ": " + name + m + " slice [" + std::to_string(offset) + ", +" +
                                   std::to_string(it->second.numel()) + ") outside the parameter's " +
                                   std::to_string(whole.numel()) + " elements");
        out[name + m] = out[name + m].to(it->second.scalar_type());
        out[name + m].view({-1}).narrow(0, offset, it->second.numel()).copy_(it->second.reshape({-1}));
      }
      covered[name] += part.at(name + ".exp_avg").numel();
    }
  }
  for (const auto& [name, shape] : shapes) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if (covered[name] != numel || !out.count(name + ".step"))
      throw std::runtime_error(checkpoint_dir + ": the optimizer shards cover " + std::to_string(covered[name]) +
                               " of " + std::to_string(numel) + " elements of " + name);
  }
  return out;
}

}  // namespace deepen
