// Build identity: which build of deepen a process runs (the ELF build id its linker wrote), so the
// ranks of one job refuse at start to mix builds (a stale binary on one node's path).
#pragma once

#include <string>
#include <vector>

namespace deepen {

// The build id of the running executable: the hex of its NT_GNU_BUILD_ID note (gcc and clang write
// one by default, a hash of the linked output), "" if it has none. Two builds of different code have
// different ids; the same file copied to every node has one.
std::string this_build_id();

// Throws InputError (exit code 2) when the ranks run different builds; `builds[r]` is rank r's build
// id ("" = none, or a deepen too old to say), `hosts[r]` its host. Rank 0's build is the job's;
// every other build is named with its ranks and hosts, e.g.
//   the ranks run different builds of deepen: build 3fa2c1e9b0d4 on rank 0 (n1), rank 1 (n1); build
//   77ab90e1f2c3 on rank 2 (n2), rank 3 (n2); install one build on every node (a stale binary on a
//   node's path?) and start the job again
void check_same_build(const std::vector<std::string>& hosts, const std::vector<std::string>& builds);

}  // namespace deepen
