// Run configuration: one typed struct per TOML section, with defaults, bounds and documentation.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "config/count.h"
#include "config/float_dtype.h"
#include "config/options.h"

namespace deepen {

// Every section lists its fields once, in visit(); parsing, printing and --set all go through it, so
// the documentation below is the only list of keys there is.

struct RunConfig {
  std::string name = "run";
  std::string out_dir = "runs/run";  // resolved config, metrics, eval records and checkpoints go here
  int64_t seed = 1;                  // model init, sampler and dropout-free training are all seeded by it
  int64_t threads = 0;               // intra-op CPU threads; 0 = all cores given to this rank
  RunDevice device = RunDevice::kAuto;  // "auto" | "cpu" | "cuda": where models and batches live; auto = CUDA if visible
  // TensorBoard event files in out_dir beside metrics.jsonl (`tensorboard --logdir <out_dir or a
  // folder of runs>`): every numeric field of each metrics and eval record as a scalar ("train/loss",
  // "eval/val_ce", ...), written as the record is (run_folder/tensorboard_events.h). An execution
  // setting: switching it does not stop a resume.
  bool tensorboard = false;
  template <class V> void visit(V& v) {
    v("name", name); v("out_dir", out_dir); v("seed", seed); v("threads", threads); v("device", device);
    v("tensorboard", tensorboard);
  }
};

struct DataConfig {
  std::string tokenizer = "bytes";   // "bytes" | "qwen3:<path to tokenizer.json>"
  std::string train = "data/train";  // shard folder or glob made by `deepen prep`
  std::string valid = "data/valid";
  int64_t seq_len = 256;             // windows: tokens per sequence (targets are the next tokens)
  // How training sequences are made (train/document_batch.h):
  //   "windows":   the token stream cut into seq_len-token windows (packed: documents run into
  //                each other across EOS); every position is a target.
  //   "documents": one document per sequence (the paper's protocol: no packing), truncated to
  //                max_len tokens, a micro-batch right-padded to its longest member; padded
  //                positions are excluded from the loss, the eval, every diagnostic and every token
  //                count. Needs shards with a document index (`deepen prep` of this version).
  Packing packing = Packing::kWindows;
  int64_t max_len = 8192;            // documents: a document is cut to its first max_len tokens
  // documents: a fixed training shard of the first train documents holding >= this many target
  // tokens (truncated to max_len); 0 = every train document. Grow runs wrap within it (every
  // phase replays it); joint runs read it once and continue onto fresh documents (the shard's size:
  // data/documents.h, replay_shard_documents; its order: data/sampler.h, ReplayShard).
  int64_t replay_shard_tokens = 0;
  // documents: the validation set is the first N documents of data.valid (eval covers all of
  // them every time, ceil(N / parallel.micro_batch) batches); 0 = eval.batches batches as before.
  int64_t valid_documents = 0;
  // The seed of the training data's order (the sampler's permutations); -1 = run.seed. Runs that
  // vary only their initialisation across seeds may share one order, and then one teacher pass
  // (deepen study's shared teacher: study/teacher_groups.h).
  int64_t order_seed = -1;
  // prep only:
  std::vector<std::string> sources;  // text files, folders, .jsonl or .parquet files to tokenize
  std::string jsonl_field = "text";  // field holding the document in JSONL sources
  std::string parquet_text_column = "text";  // column holding the document in parquet sources (FineWeb-Edu: text)
  // JSONL field or parquet column naming a document (FineWeb-Edu: id): where a record has it, the
  // held-out split hashes the id instead of the text (a null or empty id counts as none); "" = always the text.
  std::string id_field = "id";
  double valid_fraction = 0.01;      // share of documents held out, chosen by document hash
  int64_t shard_tokens = 50'000'000; // tokens per shard file
  template <class V> void visit(V& v) {
    v("tokenizer", tokenizer); v("train", train); v("valid", valid); v("seq_len", seq_len);
    v("packing", packing); v("max_len", max_len); v("replay_shard_tokens", replay_shard_tokens);
    v("valid_documents", valid_documents); v("order_seed", order_seed);
    v("sources", sources); v("jsonl_field", jsonl_field); v("parquet_text_column", parquet_text_column);
    v("id_field", id_field); v("valid_fraction", valid_fraction);
    v("shard_tokens", shard_tokens);
  }
};

struct TeacherConfig {
  std::string checkpoint;    // Hugging Face folder: config.json + model.safetensors[.index.json]
  FloatDtype dtype = FloatDtype::kFp32;  // "fp32" | "bf16": compute dtype of the frozen teacher
  CpuKernels cpu_kernels = CpuKernels::kAuto;  // "auto" | "fused" | "aten": its fp32 CPU steps (model/cpu_kernel_choice.h)
  template <class V> void visit(V& v) { v("checkpoint", checkpoint); v("dtype", dtype); v("cpu_kernels", cpu_kernels); }
};

struct StudentConfig {
  int64_t layers = 9;         // full depth; the curriculum's last stage must reach it
  int64_t hidden = 1024;
  int64_t heads = 16;
  int64_t kv_heads = 8;       // GQA: heads must be a multiple of kv_heads
  int64_t head_dim = 64;      // independent of hidden/heads, as in Qwen3
  int64_t intermediate = 3072;
  int64_t vocab_size = 0;     // 0 = take it from the tokenizer (and check it against the teacher)
  // "pre" | "post" | "peri" | "mix" | "pre_scaled": where RMSNorm sits relative to the residual add
  // (model/norm_placement.h; docs/model.md#norm-placement).
  NormPlacement norm = NormPlacement::kPre;
  // mix only: the first ceil(mix_post_fraction x layers) layers of the full depth are post-norm, the
  // rest pre-norm (Mix-LN; the boundary is fixed by the final depth, never by the depth while growing).
  // In (0, 1), and it must leave at least one pre-norm layer.
  double mix_post_fraction = 0.25;
  bool tie_embeddings = true;
  // "random": every weight drawn (Qwen3's init, std 0.02). "teacher" (the paper's student): the
  // embedding is copied from teacher.checkpoint and frozen, the LM head copied and trained (needs
  // tie_embeddings = false), the boundary norm (pre: the final norm; post: an entry norm on the
  // embedding output) starts from the teacher's final norm and trains; decoder layers are random.
  // Needs hidden = the teacher's hidden size.
  StudentInit init = StudentInit::kRandom;
  double rope_theta = 1'000'000.0;
  double rms_eps = 1e-6;
  // Arithmetic of the student (model/student.h):
  //   "fp32":       fp32 parameters, compute and AdamW state.
  //   "bf16-mixed": fp32 parameters (the optimizer's masters) and fp32 AdamW state; the forward and
  //                 backward run in bf16 on bf16 copies of the weights made at each use, gradients
  //                 reach the fp32 parameters and accumulate there; the loss's softmax stays fp32.
  //   "bf16-pure":  bf16 parameters, compute AND AdamW state (updates below half a bf16 ulp of a
  //                 weight are lost; kept for comparison and for memory-bound experiments).
  // Replaces the former student.dtype ("fp32" -> "fp32", "bf16" -> "bf16-pure").
  StudentPrecision precision = StudentPrecision::kFp32;
  // CUDA only: fp32 matmuls (the "fp32" precision's, and the fp32 parts of the others) may use TF32
  // tensor cores (10-bit mantissa products, fp32 accumulation). Off keeps fp32 exact as on CPU.
  bool tf32 = false;
  CpuKernels cpu_kernels = CpuKernels::kAuto;  // "auto" | "fused" | "aten": fp32 CPU steps (model/cpu_kernel_choice.h)
  Recompute recompute = Recompute::kNone;  // "none" | "layer" | "mlp": activation recomputation (model/recompute.h)
  template <class V> void visit(V& v) {
    v("layers", layers); v("hidden", hidden); v("heads", heads); v("kv_heads", kv_heads);
    v("head_dim", head_dim); v("intermediate", intermediate); v("vocab_size", vocab_size);
    v("norm", norm); v("mix_post_fraction", mix_post_fraction); v("tie_embeddings", tie_embeddings); v("init", init); v("rope_theta", rope_theta);
    v("rms_eps", rms_eps); v("precision", precision); v("tf32", tf32);
    v("cpu_kernels", cpu_kernels); v("recompute", recompute);
  }
};

struct CurriculumConfig {
  // "grow" (depth increases stage by stage) | "joint" (full depth from step 0; several stages =
  // phases at that fixed depth, e.g. stages = [3, 3] with stage_steps = [50000, 50000]: the
  // post-joint-long control restarts its LR at the grow runs' phase boundaries)
  CurriculumMode mode = CurriculumMode::kGrow;
  std::vector<int64_t> stages;            // active blocks per stage (grow: strictly increasing)
  int64_t block_layers = 1;               // decoder layers per block (the paper: 3 blocks x 3 layers)
  std::vector<std::string> stage_tokens;  // per stage, "50M" / "2.5B" / "123456"; or use stage_steps
  std::vector<int64_t> stage_steps;       // per stage optimizer steps (exclusive with stage_tokens)
  std::string budget;                     // "" | "active_layer_tokens:<run dir>" (joint runs only)
  // The growth operator (curriculum/growth_operator.h): how every block not carried over from the
  // previous stage starts.
  //   "random":   the config's init (Qwen3's, std 0.02; the paper's new layers).
  //   "stack":    a copy of the student's own last block (its last block_layers layers, in order).
  //   "identity": random, then each new layer's o_proj and down_proj zeroed (function-preserving
  //               where the placement allows it: pre, pre_scaled, peri, and mix's pre-norm layers).
  //   "teacher":  the teacher's layers each new layer maps to (layer i of the full depth L takes
  //               teacher layer floor(i x L_teacher / L)); the first stage's blocks too, so a joint
  //               run starts from them. Needs student.init = "teacher".
  // Optimizer state of new parameters is always fresh.
  GrowInit grow_init = GrowInit::kRandom;
  bool freeze_prefix = false;             // freeze control: only appended blocks train
  // Freeze control: whether the LM head and the boundary norm (and a tied/random embedding) freeze
  // with the prefix. true = the literal reading of "only the new block updates" (the paper is silent).
  bool freeze_head_and_norm = true;
  int64_t rewarmup_steps = 0;             // LR re-warmup after each growth (0 = none; "keep" only)
  // At every stage start after the first: "keep" (AdamW state carried, one LR schedule over the
  // run, optional rewarmup_steps) | "reset" (the paper: fresh AdamW state for every trainable
  // parameter, and a full warmup + cosine down to lr · min_lr_ratio within each stage).
  PhasePolicy phase_policy = PhasePolicy::kKeep;
  template <class V> void visit(V& v) {
    v("mode", mode); v("stages", stages); v("block_layers", block_layers); v("stage_tokens", stage_tokens);
    v("stage_steps", stage_steps); v("budget", budget); v("grow_init", grow_init);
    v("freeze_prefix", freeze_prefix); v("freeze_head_and_norm", freeze_head_and_norm);
    v("rewarmup_steps", rewarmup_steps); v("phase_policy", phase_policy);
  }
};

// Post-norm layers of a mix student of `layers` layers: ceil(fraction × layers).
// Example: 9 layers, 0.25 -> 3 (layers 0, 1, 2 post-norm, 3..8 pre-norm); 12, 0.25 -> 3; 9, 0.5 -> 5.
int64_t mix_post_layers(int64_t layers, double fraction);

// Active decoder layers per stage: stages × block_layers. Example: stages = [1, 2, 3],
// block_layers = 3 -> [3, 6, 9].
std::vector<int64_t> stage_depths(const CurriculumConfig& cur);

struct DistillConfig {
  double alpha = 1.0;             // weight of the KL term; 1 - alpha weighs CE on the labels
  double temperature = 1.0;
  // "full" (the logits) | "topk" (the k largest log-probabilities and their ids) | "hidden" (the
  // teacher's final normalised hidden states; every student holds its frozen head): what the teacher sends
  TeacherOutput logits = TeacherOutput::kFull;
  int64_t topk = 64;
  TopkTail tail = TopkTail::kRenormalize;  // top-k only: "renormalize" | "bucket"
  int64_t vocab_chunk = 8192;     // teacher_topk's log-sum-exp runs this many vocabulary columns at a time
  FloatDtype channel_dtype = FloatDtype::kFp32;  // "fp32" | "bf16": full-logit values on the wire
  // The loss takes this many tokens (rows) at a time, each with the whole vocabulary; 0 = auto: as
  // many as fit a 512 MiB budget of chunk buffers (train/loss_chunking.h; 883 at V = 151,936).
  int64_t row_chunk = 0;
  // "teacher": the targets come from a live teacher ([teacher], on teacher ranks under mpirun) |
  // "cache": from the teacher cache in cache.dir (`deepen cache`, docs/cache.md): no teacher runs and
  // a job has no teacher ranks (world = parallel.students); distill.logits and the teacher ranks of
  // [parallel] are then unused. The KL term takes the cache's targets (cache.targets).
  DistillSource source = DistillSource::kTeacher;
  template <class V> void visit(V& v) {
    v("alpha", alpha); v("temperature", temperature); v("logits", logits); v("topk", topk);
    v("tail", tail); v("vocab_chunk", vocab_chunk); v("channel_dtype", channel_dtype); v("row_chunk", row_chunk);
    v("source", source);
  }
};

// [cache]: the teacher cache (teacher_cache/, docs/cache.md). `deepen cache CONFIG` writes one into
// dir (or --out): for every cached token, K samples of the teacher's distribution at
// distill.temperature (validation tokens at τ = 1, what eval scores), stored as ids and counts
// (Random Sampling KD, arXiv 2503.16870), the teacher's entropy, and optionally its top-k. A run with
// distill.source = "cache" trains from the cache in dir; samples, seed (and topk, for topk targets)
// must be the cache's, and the cache must come from this config's teacher, tokenizer and data.
struct CacheConfig {
  std::string dir;                 // the cache folder
  int64_t samples = 64;            // K: draws per token from p_T^τ (with replacement), 1..65535
  int64_t topk = 0;                // also store the k largest log-probabilities per token; 0 = none
  int64_t seed = 1;                // the sampling seed (every token's draws are a function of it and the token's place)
  // The first N train sequences (data.packing = "documents": documents) are cached; 0 = all of
  // data.train. A run whose data order reads a later one is refused at start.
  int64_t train_sequences = 0;
  // The first N validation sequences (documents); 0 = the eval set of this config (data.valid_documents,
  // else eval.batches × parallel.micro_batch).
  int64_t valid_sequences = 0;
  CacheTargets targets = CacheTargets::kSampled;  // "sampled" (RS-KD, unbiased) | "topk" (needs a cache with topk)
  template <class V> void visit(V& v) {
    v("dir", dir); v("samples", samples); v("topk", topk); v("seed", seed); v("train_sequences", train_sequences);
    v("valid_sequences", valid_sequences); v("targets", targets);
  }
};

struct OptimConfig {
  double lr = 3e-4;
  double min_lr_ratio = 0.1;      // cosine decays to lr * min_lr_ratio
  double weight_decay = 0.1;
  std::vector<double> betas = {0.9, 0.95};
  double eps = 1e-8;
  int64_t warmup_steps = 200;
  LrShape schedule = LrShape::kCosine;  // "cosine" | "constant"
  double grad_clip = 1.0;           // global L2 norm; 0 = off
  template <class V> void visit(V& v) {
    v("lr", lr); v("min_lr_ratio", min_lr_ratio); v("weight_decay", weight_decay);
    v("betas", betas); v("eps", eps); v("warmup_steps", warmup_steps); v("schedule", schedule);
    v("grad_clip", grad_clip);
  }
};

struct ParallelConfig {
  int64_t teacher_pipelines = 1;   // T
  int64_t teacher_stages = 1;      // P: stages per pipeline
  int64_t students = 1;            // S: data-parallel student ranks, a multiple of T
  int64_t micro_batch = 4;         // sequences per student rank per micro-batch
  int64_t grad_accum = 1;          // micro-batches per optimizer step (derived when global_batch is set)
  // Sequences per optimizer step, whatever the layout: grad_accum = global_batch / (students ×
  // micro_batch), an error when that does not divide. 0 = students × micro_batch × grad_accum as
  // given. Scaling studies set it, so runs on different layouts optimise the same objective.
  int64_t global_batch = 0;
  Backend backend = Backend::kAuto;  // "auto" | "mpi" | "nccl"
  FloatDtype activation_dtype = FloatDtype::kFp32;  // between teacher stages: "fp32" | "bf16"
  int64_t max_in_flight = 4;       // micro-batches buffered per pipeline hop (back-pressure)
  // Which world rank is which (dist/rank_layout.h has the worked examples):
  //   "roles": all teacher stages, pipeline by pipeline, then all students; with tasks per node
  //            dividing T·P, teachers and students sit on separate nodes (the logits cross nodes).
  //   "pipelines": each pipeline's P stages then the S/T students it feeds; with tasks per node a
  //            multiple of P + S/T, a pipeline and its students share a node (the logits stay on
  //            NVLink; only the students' gradient all-reduce crosses nodes).
  RankOrder rank_order = RankOrder::kRoles;
  // The students' data parallelism: "none" (each student holds the whole AdamW state; gradients
  // all-reduced) | "grad_op" (FSDP's SHARD_GRAD_OP, ZeRO stage 2: gradients reduce-scattered, the
  // AdamW moments sharded over the students, updated parameters all-gathered; train/sharded_adamw.h)
  // | "full" (FSDP's FULL_SHARD, ZeRO stage 3, for the decoder blocks: as grad_op, and each block's
  // parameters held as 1/S shards between uses, gathered block by block for the forward and again
  // for the recomputed backward; every micro-batch's gradients reduce-scattered; needs
  // student.recompute = "layer").
  Sharding sharding = Sharding::kNone;
  double bucket_cap_mb = 32;       // gradient bucket of the students' reduction (DDP's bucket_cap_mb)
  // Launch each bucket's reduction from inside the last micro-batch's backward as soon as its
  // gradients are final (train/gradient_buckets.h); false: all after the backward. Same bits.
  bool overlap_grad_reduce = true;
  template <class V> void visit(V& v) {
    v("teacher_pipelines", teacher_pipelines); v("teacher_stages", teacher_stages);
    v("students", students); v("micro_batch", micro_batch); v("grad_accum", grad_accum);
    v("global_batch", global_batch); v("backend", backend); v("activation_dtype", activation_dtype);
    v("max_in_flight", max_in_flight); v("rank_order", rank_order); v("sharding", sharding);
    v("bucket_cap_mb", bucket_cap_mb); v("overlap_grad_reduce", overlap_grad_reduce);
  }
};

struct EvalConfig {
  int64_t every = 500;              // steps between evals (also at every stage end)
  int64_t batches = 50;             // validation micro-batches per eval
  int64_t diagnostics_every = 250;  // steps between boundary diagnostics (also at each growth)
  int64_t diagnostic_batch = 8;     // sequences in the fixed diagnostic batch
  template <class V> void visit(V& v) {
    v("every", every); v("batches", batches); v("diagnostics_every", diagnostics_every);
    v("diagnostic_batch", diagnostic_batch);
  }
};

struct CheckpointConfig {
  int64_t every = 1000;  // steps; 0 = only at the end and on a coordinated stop
  int64_t keep = 3;      // newest K kept
  template <class V> void visit(V& v) { v("every", every); v("keep", keep); }
};

struct ControlConfig {
  double heartbeat_s = 5;
  double watchdog_s = 120;             // a rank silent or stuck this long aborts the job
  int64_t metrics_port = 0;            // 0 = no /metrics endpoint
  std::string metrics_bind = "127.0.0.1";
  int64_t coordinator_port = 0;        // 0 = from DEEPEN_COORDINATOR or a free port
  // Each NCCL communicator's set-up (ranks arriving, ncclCommInitRank connecting them) must finish
  // within this, else the job ends naming the group and the NCCL network env. It runs before the
  // watchdog exists; NCCL init of a few hundred GPUs takes seconds to a minute.
  double nccl_setup_timeout_s = 300;
  template <class V> void visit(V& v) {
    v("heartbeat_s", heartbeat_s); v("watchdog_s", watchdog_s); v("metrics_port", metrics_port);
    v("metrics_bind", metrics_bind); v("coordinator_port", coordinator_port);
    v("nccl_setup_timeout_s", nccl_setup_timeout_s);
  }
};

// [guard]: the divergence guard on every student (train/divergence_guard.h). A step whose loss or
// gradient norm is not finite (or, with spike_factor, whose loss jumps past spike_factor x the median
// of the last spike_window steps) trips it before its update is applied, so no non-finite weights
// are ever stepped into, checkpointed or exported. Every student sees the same step loss and norm
// (both are reduced over the students), so all take the same decision at the same step. The whole
// section is a recovery setting: changing it does not stop a resume (that is how a stopped run
// resumes with a lower lr_scale).
struct GuardConfig {
  // "stop": the run ends with exit code 4 (config/input_error.h), naming the step, the student(s),
  //         the quantity and the last good checkpoint; resume from it, e.g. with a lower lr_scale.
  // "skip": the step's update is dropped (its data is consumed, its metrics record left out, the
  //         skip written to guard.jsonl) and the run goes on; past max_skips in one start it stops.
  // "rollback": the run ends with exit code 5 after writing a lowered LR scale (x rollback_lr_factor)
  //         to guard.jsonl; the next start resumes from the last good checkpoint with it (the Slurm
  //         scripts requeue on 5). After max_rollbacks the guard stops instead.
  GuardAction action = GuardAction::kStop;
  double spike_factor = 0;          // > 1 turns the loss-spike test on; 0 = off
  int64_t spike_window = 100;       // steps whose losses the spike test takes the median of
  int64_t max_skips = 10;
  double rollback_lr_factor = 0.5;  // in (0, 1)
  int64_t max_rollbacks = 3;
  // Multiplies the whole LR schedule (warmup, cosine, every phase). Resume a run the guard stopped
  // with a lower one: `--set guard.lr_scale=0.5`; the "lr" of metrics.jsonl is the value used.
  double lr_scale = 1;
  template <class V> void visit(V& v) {
    v("action", action); v("spike_factor", spike_factor); v("spike_window", spike_window);
    v("max_skips", max_skips); v("rollback_lr_factor", rollback_lr_factor); v("max_rollbacks", max_rollbacks);
    v("lr_scale", lr_scale);
  }
};

struct Config {
  std::string source;                 // file the config came from, for error messages
  std::set<std::string> overridden;   // "section.key"s set by --set: errors name them as such
  RunConfig run;
  DataConfig data;
  TeacherConfig teacher;
  StudentConfig student;
  CurriculumConfig curriculum;
  DistillConfig distill;
  OptimConfig optim;
  ParallelConfig parallel;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  ControlConfig control;
  GuardConfig guard;
  CacheConfig cache;
  template <class V> void visit_sections(V& v) {
    v("run", run); v("data", data); v("teacher", teacher); v("student", student);
    v("curriculum", curriculum); v("distill", distill); v("optim", optim);
    v("parallel", parallel); v("eval", eval); v("checkpoint", checkpoint); v("control", control);
    v("guard", guard); v("cache", cache);
  }
};

// The seed of the training data's order: data.order_seed, or run.seed when it is -1.
// Example: run.seed 3, order_seed -1 -> 3; run.seed 3, order_seed 42 -> 42.
int64_t data_order_seed(const Config& cfg);

// Reads `path` (may be empty: defaults only), applies `overrides` ("section.key=value", TOML
// syntax for the value, bare words taken as strings), validates. Throws InputError naming the
// file, the key and the reason.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Same, from TOML text (tests, and configs embedded in checkpoints).
Config parse_config(const std::string& toml_text, const std::string& source,
                    const std::vector<std::string>& overrides = {});

// Checks values and cross-section consistency; throws InputError. load_config calls it.
void validate_config(const Config& cfg);

// The resolved config as TOML, every key present; parse_config(to_toml(c)) == c.
std::string to_toml(const Config& cfg);

// A stable hash of the resolved config (hash64 of to_toml), saved with checkpoints.
uint64_t config_hash(const Config& cfg);

// The config with the settings that change only how a run executes (speed, memory, rounding), never
// what it trains, put back to their defaults: run.threads, run.device, run.tensorboard, student.cpu_kernels,
// teacher.cpu_kernels, student.recompute, student.tf32, distill.row_chunk and [control]. A checkpoint resumes across them and the
// report counts runs that differ only in them as one experiment.
Config without_execution_settings(const Config& cfg);

// The config with the rank layout taken out: [parallel]'s teacher_pipelines, teacher_stages,
// students, grad_accum, backend, max_in_flight and rank_order back to their defaults and global_batch set to
// the sequences per optimizer step (students × micro_batch × grad_accum). Two configs equal under it
// train the same model on the same data order with the same global batch; only the ranks that do
// it differ. Example: students 4, micro_batch 2, grad_accum 1 and students 2, micro_batch 2,
// grad_accum 2 both give global_batch 8. micro_batch stays: it defines the eval batches.
Config without_layout(const Config& cfg);

// The keys whose values differ between two configs, in to_toml's order, each as
// {"section.key", value in a, value in b} (values as TOML text). Example: a with
// curriculum.stage_steps = [3, 3], b the defaults -> {{"curriculum.stage_steps", "[3, 3]", "[]"}}.
struct ConfigDifference {
  std::string key, a, b;
};
std::vector<ConfigDifference> config_differences(const Config& a, const Config& b);

}  // namespace deepen
