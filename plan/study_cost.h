// Study cost: device-hours and job time of a study's runs, each with its own teacher or sharing one.
#pragma once

#include <cstdint>
#include <string>
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
  int64_t teacher_pipelines = 1;      // T of its config (teacher_devices = T·P): the rates above are for T
  // The most runs whose outgoing queues its teacher's last stage can hold in a device's memory (a
  // group's teacher keeps max_in_flight payloads per run: plan/memory_model.h); 0 = no bound.
  int64_t max_shared_runs = 0;
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
// `pipelines`: teacher pipelines per group (0 or absent: each run's own T), e.g. from
// cheapest_pipelines below.
StudyCost study_cost(const std::vector<RunRates>& runs, const std::vector<std::vector<size_t>>& groups,
                     const std::vector<int64_t>& pipelines = {});

// One group with T teacher pipelines: the first member's teacher and channel rates scaled by T / its
// own T (each pipeline computes and sends its own micro-batches), its devices T·P + Σ S, and what
// bounds its pace ("teacher", "channel" or "students").
struct GroupPrice {
  int64_t pipelines = 1, devices = 0;
  double tokens_per_s = 0, hours = 0, device_hours = 0;
  std::string bound;
};
GroupPrice price_group(const std::vector<RunRates>& runs, const std::vector<size_t>& members, int64_t pipelines);

// The number of teacher pipelines with the fewest device-hours for a group, among the T that divide
// its runs' S (each pipeline serves S/T students of every run): enough that the teacher is not what
// holds the group back, and no more, since every pipeline holds its P devices for the whole group.
// Example: the header's two teacher-bound runs (T = 1 pipeline of 8 devices, S = 8 students at 2e5
// tokens/s, teacher 1e5): T = 2 doubles the teacher to 2e5 tokens/s and meets the students: 32
// devices for 5e3 s = 44.4 device-hours instead of 24 for 1e4 s = 66.7; T = 4 would add devices
// without speed. -> 2.
int64_t cheapest_pipelines(const std::vector<RunRates>& runs, const std::vector<size_t>& members);

// Pure: the groups with the fewest device-hours (each at its cheapest_pipelines), where every group
// is taken from one of `classes` (runs that may share one teacher pass: study/teacher_groups.h). A
// group holds its devices until its longest run ends, so within a class the runs are sorted by
// tokens, longest first, and cut into consecutive groups (the best cut by dynamic programming over
// the sorted order: a shorter run joins a longer group when its students' idle time costs less
// than a teacher share of its own). `max_runs` caps a group (0 = none), and so does each run's
// max_shared_runs: a group whose teacher could not hold its runs' queues is never chosen.
// Example (the paper's ten runs of one seed, `deepen plan --study configs/paper/study-qwen3-8b.toml`):
// the five 150k-step runs and post-joint-long (100k) in one group, the four 50k-step runs in another:
// adding post-joint-long to the long group costs its 8 students' devices for 28 h (224 device-hours)
// against 299 alone.
std::vector<std::vector<size_t>> cheapest_groups(const std::vector<RunRates>& runs,
                                                 const std::vector<std::vector<size_t>>& classes, size_t max_runs = 0);

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
