// Study cost: device-hours and job time of a study's runs, each with its own teacher or sharing one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deepen {

// One run as the cost model (plan/cost_model.h) rates its layout.
struct RunRates {
  std::string id;                     // "post-grow/seed1"
  int64_t teacher_devices = 0;        // T·P
  int64_t student_devices = 0;        // S
  double tokens = 0;                  // training tokens of the whole run
  double teacher_tokens_per_s = 0;    // T pipelines' supply
  double channel_tokens_per_s = 0;    // what the logit channels carry for one run
  double student_tokens_per_s = 0;    // its S students' demand, tokens-weighted over the curriculum
  double alone_tokens_per_s = 0;      // the run alone: min of the three, per stage, over the curriculum
};

struct StudyCost {
  double alone_device_hours = 0, alone_job_hours = 0;    // every run with its own teacher
  double shared_device_hours = 0, shared_job_hours = 0;  // runs grouped as given
};

// Pure. Alone, run r holds T·P + S devices for tokens / alone_tokens_per_s. A group of R runs is one
// job of T·P + Σ S devices: the teacher computes each micro-batch once for all of them and sends it R
// times, so the group moves at min(teacher, channel / R, the slowest run's students) — the fastest run
// is held back to the slowest (a bounded lead of parallel.max_in_flight micro-batches does not change
// the rate) — and holds its devices until its longest run is done (a finished run leaves, but its
// devices stay allocated). Job hours are the jobs' times summed (one after another).
//
// Worked example: two runs, each T·P = 8 teacher devices and S = 8 students, 1e9 tokens; teacher
// 1e5 tokens/s, channel 1e6, students 2e5, so alone 1e5 tokens/s (teacher bound):
//   alone:  2 × 16 devices × 1e4 s = 3.2e5 device-s = 88.9 device-hours, 2 × 1e4 s = 5.56 job hours
//   shared: rate min(1e5, 1e6 / 2, 2e5) = 1e5; 24 devices × 1e4 s = 66.7 device-hours, 2.78 job hours
StudyCost study_cost(const std::vector<RunRates>& runs, const std::vector<std::vector<size_t>>& groups);

// With a teacher cache (study.teacher = "cache"): one cache job runs the teacher once over
// `cache_tokens` on `cache_devices` devices at `cache_tokens_per_s` (all of them together), then
// every run holds only its S student devices, for tokens / student_tokens_per_s (no teacher, no
// channel: reading the cache is assumed never to hold the students back; bench/cache_prefetch_bench
// measures it). Job hours: the cache job, then the runs one after another.
// Worked example (study_cost's two runs): the cache over 1e9 tokens on 8 devices at 1e5 tokens/s,
// each run's 8 students at 2e5: cache 8 × 1e4 s = 22.2 device-hours; runs 2 × 8 × 5e3 s = 22.2;
// 44.4 device-hours (a teacher per run: 88.9), 2.78 + 2 × 1.39 = 5.56 job hours.
struct CacheStudyCost {
  double cache_device_hours = 0, cache_job_hours = 0;  // the cache job
  double device_hours = 0, job_hours = 0;              // the cache job and every run
};
CacheStudyCost cache_study_cost(const std::vector<RunRates>& runs, double cache_tokens, double cache_tokens_per_s,
                                int64_t cache_devices);

// Bytes a teacher cache stores per token (teacher_cache/cache_file.h's record): 4 (entropy) + the
// count of distinct ids + per distinct id its id's delta and its count as varints, + 8·topk. At most
// 4 + varint(K) + K·(varint(vocab − 1) + varint(K)) + 8·topk, when all K draws differ.
// Examples: K = 64, vocab 151,936, no top-k -> at most 4 + 1 + 64·(3 + 1) = 261 bytes; K = 8 -> 37.
int64_t cache_bytes_per_token_bound(int64_t samples, int64_t topk, int64_t vocab);

}  // namespace deepen
