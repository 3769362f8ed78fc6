// Build identity: the running executable's ELF build-id note, and the check that every rank has the same.
#include "dist/build_identity.h"

#include <elf.h>
#include <link.h>

#include <cstdio>
#include <map>
#include <stdexcept>

#include "config/input_error.h"

namespace deepen {
namespace {

int find_build_id(dl_phdr_info* info, size_t, void* out) {
  // The first object dl_iterate_phdr reports is the executable itself.
  auto* id = static_cast<std::string*>(out);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const auto* p = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr);
    const auto* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const unsigned char* name = p + sizeof(ElfW(Nhdr));
      const unsigned char* desc = name + ((note->n_namesz + 3) & ~3u);
      if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 && std::string_view(reinterpret_cast<const char*>(name), 3) == "GNU") {
        char hex[3];
        for (uint32_t k = 0; k < note->n_descsz; ++k) {
          std::snprintf(hex, sizeof hex, "%02x", desc[k]);
          *id += hex;
        }
        return 1;
      }
      p = desc + ((note->n_descsz + 3) & ~3u);
    }
  }
  return 1;  // only the executable
}

std::string short_id(const std::string& id) { return id.empty() ? "(none: a build without an id, or an older deepen)" : id.substr(0, 12); }

}  // namespace

std::string this_build_id() {
  std::string id;
  dl_iterate_phdr(find_build_id, &id);
  return id;
}

void check_same_build(const std::vector<std::string>& hosts, const std::vector<std::string>& builds) {
  if (hosts.size() != builds.size()) throw std::invalid_argument("check_same_build: hosts and builds differ in length");
  bool same = true;
  for (const std::string& b : builds) same = same && b == builds.front();
  if (same) return;
  // Every build, in the order of its first rank (rank 0's first), with its ranks and hosts.
  std::vector<std::string> order;
  std::map<std::string, std::string> ranks;
  for (size_t r = 0; r < builds.size(); ++r) {
    auto& list = ranks[builds[r]];
    if (list.empty()) order.push_back(builds[r]);
    list += (list.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " (" + hosts[r] + ")";
  }
  std::string text = "the ranks run different builds of deepen:";
  for (size_t i = 0; i < order.size(); ++i)
    text += std::string(i ? ";" : "") + " build " + short_id(order[i]) + " on " + ranks[order[i]];
  throw InputError(text + "; install one build on every node (a stale binary on a node's path?) and start the job again");
}

}  // namespace deepen
