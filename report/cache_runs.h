// Which runs of a report trained from a teacher cache instead of a live teacher, as report notes.
#pragma once

#include <string>
#include <vector>

#include "report/run_data.h"

namespace deepen {

// One note per cache setting among `runs` (distill.source = "cache"), naming its folder, what the runs
// trained on and which runs: e.g. "trained from the teacher cache runs/x/cache (cache.dir): sampled
// targets, K = 64 draws per token at τ = 1 (RS-KD, unbiased; val_kl is its estimate from the
// validation tokens' draws, val_ce is exact): post-grow seed 1, pre-grow seed 1". Empty when every
// run had a live teacher.
std::vector<std::string> cache_run_notes(const std::vector<RunData>& runs);

}  // namespace deepen
