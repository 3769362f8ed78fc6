// Parses, overrides, resolves, validates and prints the run configuration.
#include "config/config.h"

#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "config/hash.h"
#include "config/input_error.h"
#include "config/text_file.h"
#include "config/toml_text.h"

namespace deepen {
namespace {

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

// Keys that existed once and what to write instead ("" for any other key): an old config fails
// with the replacement spelled out rather than a bare "unknown key".
std::string retired_key_advice(const std::string& key) {
  if (key == "student.dtype")
    return "replaced by student.precision: write precision = \"fp32\" for dtype = \"fp32\", "
           "precision = \"bf16-pure\" for dtype = \"bf16\" (bf16 parameters and AdamW state, as before), or "
           "precision = \"bf16-mixed\" (bf16 compute, fp32 master weights and AdamW state)";
  return "";
}

// Option values that existed once and what to write instead ("" for any other value).
std::string retired_value_advice(const std::string& key, const std::string& value) {
  if (key == "curriculum.grow_init" && value == "copy_last")
    return "\"copy_last\" is retired: write \"stack\" (a copy of the student's last block of "
           "curriculum.block_layers layers; with one-layer blocks exactly what copy_last did)";
  return "";
}

std::string format_double(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);
  std::string s(buf, end);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

// Reads one section's keys into its struct; every error names file, section.key and the reason.
class SectionReader {
 public:
  SectionReader(const toml::table* table, std::string source, std::string section,
                const std::set<std::string>& overridden)
      : table_(table), source_(std::move(source)), section_(std::move(section)), overridden_(overridden) {}

  template <class T> void operator()(const char* key, T& field) {
    known_.insert(key);
    if (!table_) return;
    const toml::node* node = table_->get(key);
    if (!node) return;
    read(*node, key, field);
  }

  void reject_unknown_keys() const {
    if (!table_) return;
    for (const auto& [k, v] : *table_) {
      const std::string advice = retired_key_advice(section_ + "." + std::string(k.str()));
      if (!advice.empty()) throw InputError(where(std::string(k.str())) + ": " + advice);
      if (!known_.count(std::string(k.str())))
        throw InputError(where(std::string(k.str())) + ": unknown key" + suggestion());
    }
  }

 private:
  // A value from the command line is named as such: the file never held it.
  std::string where(const std::string& key) const {
    const std::string name = section_ + "." + key;
    const std::string whole = section_ + "." + key.substr(0, key.find('['));  // a list's item: its key
    return overridden_.count(whole) ? "--set " + name : source_ + ": " + name;
  }
  std::string suggestion() const {
    std::string s = " (known keys:";
    for (const auto& k : known_) s += " " + k;
    return s + ")";
  }
  [[noreturn]] void wrong(const std::string& key, const std::string& want, const toml::node& n) const {
    throw InputError(where(key) + ": expected " + want + ", got " + type_name(n));
  }

  void read(const toml::node& n, const std::string& key, int64_t& out) const {
    if (auto v = n.as_integer()) { out = v->get(); return; }
    wrong(key, "an integer", n);
  }
  // Every float key ends up in fp32 arithmetic somewhere (an LR, a norm's eps, a clip threshold), and
  // TOML spells inf and nan: a value that is not a finite fp32 number fails here, naming its key,
  // instead of training to NaN or failing later in a tensor conversion that names nothing.
  void read(const toml::node& n, const std::string& key, double& out) const {
    double x = 0;
    if (auto v = n.as_floating_point()) {
      x = v->get();
    } else if (auto i = n.as_integer()) {
      x = static_cast<double>(i->get());
    } else {
      wrong(key, "a number", n);
    }
    if (!std::isfinite(x) || std::fabs(x) > std::numeric_limits<float>::max())
      throw InputError(where(key) + ": must be a finite number within fp32's range (|x| <= " +
                       format_double(std::numeric_limits<float>::max()) + "), got " + format_double(x));
    out = x;
  }
  void read(const toml::node& n, const std::string& key, bool& out) const {
    if (auto v = n.as_boolean()) { out = v->get(); return; }
    wrong(key, "true or false", n);
  }
  void read(const toml::node& n, const std::string& key, std::string& out) const {
    if (auto v = n.as_string()) { out = v->get(); return; }
    wrong(key, "a string", n);
  }
  template <Option E> void read(const toml::node& n, const std::string& key, E& out) const {
    std::string text;
    read(n, key, text);
    const std::string advice = retired_value_advice(section_ + "." + key, text);
    if (!advice.empty()) throw InputError(where(key) + ": " + advice);
    out = parse_option<E>(text, where(key));
  }
  template <class T> void read(const toml::node& n, const std::string& key, std::vector<T>& out) const {
    const toml::array* arr = n.as_array();
    if (!arr) wrong(key, "an array", n);
    std::vector<T> result;
    for (size_t i = 0; i < arr->size(); ++i) {
      T item{};
      read((*arr)[i], key + "[" + std::to_string(i) + "]", item);
      result.push_back(std::move(item));
    }
    out = std::move(result);
  }

  const toml::table* table_;
  std::string source_;
  std::string section_;
  const std::set<std::string>& overridden_;
  std::set<std::string> known_;
};

// Applies one "section.key=value" override to the parsed table. The value is TOML ("3e-4",
// "[1, 2]", "true", "\"x\""); anything that does not parse as TOML is taken as a bare string.
// Returns the "section.key" it set.
std::string apply_override(toml::table& root, const std::string& item) {
  const auto eq = item.find('=');
  const auto dot = item.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    throw InputError("--set " + item + ": expected section.key=value");
  const std::string section = item.substr(0, dot);
  const std::string key = item.substr(dot + 1, eq - dot - 1);
  const std::string value = item.substr(eq + 1);
  if (section.empty() || key.empty()) throw InputError("--set " + item + ": expected section.key=value");
  toml::node_view<toml::node> sec = root[section];
  if (!sec) {
    root.insert(section, toml::table{});
  } else if (!sec.is_table()) {
    throw InputError("--set " + item + ": " + section + " is not a section");
  }
  toml::table& tbl = *root[section].as_table();
  try {
    toml::table parsed = toml::parse("v = " + value);
    parsed.get("v")->visit([&](auto&& node) { tbl.insert_or_assign(key, node); });
  } catch (const toml::parse_error&) {
    tbl.insert_or_assign(key, value);
  }
  return section + "." + key;
}

// parallel.global_batch fixes the sequences per optimizer step; grad_accum follows from the layout.
// Example: global_batch 64, micro_batch 4: 16 students -> grad_accum 1, 8 -> 2, 2 -> 8, 3 -> error.
// A grad_accum written beside it must agree (a saved config.toml does: it holds the derived value
// for its own layout; with another students count, leave grad_accum out).
void derive_grad_accum(ParallelConfig& p, bool grad_accum_given, const std::string& source) {
  if (p.global_batch <= 0 || p.students < 1 || p.micro_batch < 1) return;  // validate_config names bad values
  const int64_t per_accum = p.students * p.micro_batch;
  const std::string layout = "parallel.students = " + std::to_string(p.students) + " x parallel.micro_batch = " +
                             std::to_string(p.micro_batch) + " = " + std::to_string(per_accum);
  if (p.global_batch % per_accum != 0)
    throw InputError(source + ": parallel.global_batch: " + std::to_string(p.global_batch) +
                     " sequences do not divide into micro-batches of " + layout +
                     " per accumulation step; choose students and micro_batch whose product divides it");
  const int64_t derived = p.global_batch / per_accum;
  if (grad_accum_given && p.grad_accum != derived)
    throw InputError(source + ": parallel.grad_accum: " + std::to_string(p.grad_accum) +
                     " contradicts parallel.global_batch = " + std::to_string(p.global_batch) + " with " + layout +
                     " (that is grad_accum " + std::to_string(derived) +
                     "); leave grad_accum out, it follows from global_batch");
  p.grad_accum = derived;
}

// Fills in what defaults to other fields (joint stages = [layers], grow stages = 1..layers).
void resolve(Config& cfg) {
  auto& cur = cfg.curriculum;
  if (cur.stages.empty() && cur.block_layers >= 1) {
    const int64_t blocks = cfg.student.layers / cur.block_layers;  // validate_config checks the remainder
    if (cur.mode == CurriculumMode::kJoint) {
      cur.stages = {blocks};
    } else {
      for (int64_t b = 1; b <= blocks; ++b) cur.stages.push_back(b);
    }
  }
}


// Prints one section in declaration order.
class SectionWriter {
 public:
  explicit SectionWriter(std::ostringstream& out) : out_(out) {}
  void operator()(const char* key, const int64_t& v) { out_ << key << " = " << v << "\n"; }
  void operator()(const char* key, const double& v) { out_ << key << " = " << format_double(v) << "\n"; }
  void operator()(const char* key, const bool& v) { out_ << key << " = " << (v ? "true" : "false") << "\n"; }
  void operator()(const char* key, const std::string& v) { out_ << key << " = " << toml_quote(v) << "\n"; }
  template <Option E> void operator()(const char* key, const E& v) { (*this)(key, std::string(option_name(v))); }
  template <class T> void operator()(const char* key, const std::vector<T>& v) {
    out_ << key << " = [";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out_ << ", ";
      out_ << item(v[i]);
    }
    out_ << "]\n";
  }

 private:
  static std::string item(int64_t v) { return std::to_string(v); }
  static std::string item(double v) { return format_double(v); }
  static std::string item(const std::string& v) { return toml_quote(v); }
  std::ostringstream& out_;
};

// Validation helpers: each names the key and the rule.
struct Checker {
  const Config& cfg;
  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw InputError((cfg.overridden.count(key) ? "--set " : cfg.source + ": ") + key + ": " + why);
  }
  void positive(const std::string& key, double v) const {
    if (!(v > 0)) fail(key, "must be > 0, got " + format_double(v));
  }
  void at_least(const std::string& key, int64_t v, int64_t lo) const {
    if (v < lo) fail(key, "must be >= " + std::to_string(lo) + ", got " + std::to_string(v));
  }
  void in_unit_interval(const std::string& key, double v) const {
    if (!(v >= 0 && v <= 1)) fail(key, "must be in [0, 1], got " + format_double(v));
  }
  void port(const std::string& key, int64_t v) const {
    if (v < 0 || v > 65535) fail(key, "must be in [0, 65535], got " + std::to_string(v));
  }
};

void validate_run(const Checker& c, const RunConfig& r) {
  c.at_least("run.threads", r.threads, 0);
  if (r.out_dir.empty()) c.fail("run.out_dir", "must not be empty");
}

void validate_data(const Checker& c, const DataConfig& d, const CurriculumConfig& cur) {
  if (d.tokenizer != "bytes" && d.tokenizer.rfind("qwen3:", 0) != 0)
    c.fail("data.tokenizer", "must be \"bytes\" or \"qwen3:<path to tokenizer.json>\", got \"" + d.tokenizer + "\"");
  c.at_least("data.seq_len", d.seq_len, 2);
  if (!(d.valid_fraction >= 0 && d.valid_fraction < 1))
    c.fail("data.valid_fraction", "must be in [0, 1), got " + format_double(d.valid_fraction));
  c.at_least("data.shard_tokens", d.shard_tokens, 1024);
  if (d.jsonl_field.empty()) c.fail("data.jsonl_field", "must not be empty");
  if (d.parquet_text_column.empty()) c.fail("data.parquet_text_column", "must not be empty");
  c.at_least("data.max_len", d.max_len, 1);
  c.at_least("data.replay_shard_tokens", d.replay_shard_tokens, 0);
  c.at_least("data.valid_documents", d.valid_documents, 0);
  c.at_least("data.order_seed", d.order_seed, -1);
  if (d.packing != Packing::kDocuments) {
    if (d.replay_shard_tokens > 0) c.fail("data.replay_shard_tokens", "needs data.packing = \"documents\"");
    if (d.valid_documents > 0) c.fail("data.valid_documents", "needs data.packing = \"documents\"");
    return;
  }
  // A token budget becomes steps through a fixed tokens-per-step, which unpacked documents do not
  // have (each step holds its documents' real tokens); steps are the paper's unit anyway.
  if (!cur.stage_tokens.empty())
    c.fail("curriculum.stage_tokens", "token budgets need data.packing = \"windows\" (documents give each step "
                                      "a different number of tokens); give curriculum.stage_steps");
  if (!cur.budget.empty())
    c.fail("curriculum.budget", "matched token budgets need data.packing = \"windows\" (documents give each "
                                "step a different number of tokens); give curriculum.stage_steps");
}

void validate_student(const Checker& c, const StudentConfig& s) {
  c.at_least("student.layers", s.layers, 1);
  c.at_least("student.hidden", s.hidden, 1);
  c.at_least("student.heads", s.heads, 1);
  c.at_least("student.kv_heads", s.kv_heads, 1);
  c.at_least("student.head_dim", s.head_dim, 2);
  c.at_least("student.intermediate", s.intermediate, 1);
  c.at_least("student.vocab_size", s.vocab_size, 0);
  if (s.heads % s.kv_heads != 0)
    c.fail("student.heads", "must be a multiple of student.kv_heads = " + std::to_string(s.kv_heads) +
                                ", got " + std::to_string(s.heads));
  if (s.head_dim % 2 != 0) c.fail("student.head_dim", "must be even (RoPE rotates pairs), got " + std::to_string(s.head_dim));
  if (s.init == StudentInit::kTeacher && s.tie_embeddings)
    c.fail("student.tie_embeddings", "must be false with student.init = \"teacher\" (the embedding is frozen, "
                                     "the LM head trains: they cannot be one matrix)");
  c.positive("student.rope_theta", s.rope_theta);
  c.positive("student.rms_eps", s.rms_eps);
  if (!(s.mix_post_fraction > 0 && s.mix_post_fraction < 1))
    c.fail("student.mix_post_fraction", "must be in (0, 1), got " + format_double(s.mix_post_fraction));
  if (s.norm == NormPlacement::kMix) {
    const int64_t post = mix_post_layers(s.layers, s.mix_post_fraction);
    if (post >= s.layers)
      c.fail("student.mix_post_fraction", format_double(s.mix_post_fraction) + " makes all " + std::to_string(s.layers) +
                                              " layers post-norm (ceil(fraction x layers) = " + std::to_string(post) +
                                              "); that is student.norm = \"post\", or lower the fraction");
  }
}

// The stages' depths and the budget; `full` names the full depth in blocks for the messages.
void validate_stages(const Checker& c, const CurriculumConfig& cur, int64_t full_blocks, const std::string& full) {
  const bool grow = cur.mode == CurriculumMode::kGrow;
  if (cur.stages.empty()) c.fail("curriculum.stages", "needs at least one stage");
  for (size_t i = 0; i < cur.stages.size(); ++i) {
    if (cur.stages[i] < 1) c.fail("curriculum.stages", "depths must be >= 1, got " + std::to_string(cur.stages[i]));
    if (grow && i && cur.stages[i] <= cur.stages[i - 1])
      c.fail("curriculum.stages", "must be strictly increasing, got " + std::to_string(cur.stages[i - 1]) +
                                      " then " + std::to_string(cur.stages[i]));
  }
  if (cur.stages.back() != full_blocks)
    c.fail("curriculum.stages", "must end at " + full + ", got " + std::to_string(cur.stages.back()));
  if (!grow)
    for (int64_t st : cur.stages)
      if (st != full_blocks)
        c.fail("curriculum.stages", "a joint run trains at full depth in every phase (" + full + "), got " +
                                        std::to_string(st));
}

void validate_budgets(const Checker& c, const CurriculumConfig& cur) {
  const int budgets = !cur.stage_tokens.empty() + !cur.stage_steps.empty() + !cur.budget.empty();
  // None is fine for jobs that do not train (prep, plan); the job plan requires one.
  if (budgets > 1) c.fail("curriculum", "give only one of stage_tokens, stage_steps or budget");
  if (!cur.stage_tokens.empty() && cur.stage_tokens.size() != cur.stages.size())
    c.fail("curriculum.stage_tokens", "needs one entry per stage (" + std::to_string(cur.stages.size()) +
                                          "), got " + std::to_string(cur.stage_tokens.size()));
  for (const auto& t : cur.stage_tokens) {
    try {
      if (parse_count(t) <= 0) c.fail("curriculum.stage_tokens", "must be > 0, got \"" + t + "\"");
    } catch (const std::invalid_argument& e) {
      c.fail("curriculum.stage_tokens", e.what());
    }
  }
  if (!cur.stage_steps.empty() && cur.stage_steps.size() != cur.stages.size())
    c.fail("curriculum.stage_steps", "needs one entry per stage (" + std::to_string(cur.stages.size()) +
                                         "), got " + std::to_string(cur.stage_steps.size()));
  for (int64_t st : cur.stage_steps) c.at_least("curriculum.stage_steps", st, 1);
  if (!cur.budget.empty()) {
    if (cur.budget.rfind("active_layer_tokens:", 0) != 0 || cur.budget.size() == 20)
      c.fail("curriculum.budget", "must be \"active_layer_tokens:<run dir>\", got \"" + cur.budget + "\"");
    if (cur.mode != CurriculumMode::kJoint) c.fail("curriculum.budget", "only a joint run takes its budget from another run");
  }
}

void validate_curriculum(const Checker& c, const CurriculumConfig& cur, const StudentConfig& s) {
  c.at_least("curriculum.block_layers", cur.block_layers, 1);
  if (s.layers % cur.block_layers != 0)
    c.fail("curriculum.block_layers", "must divide student.layers = " + std::to_string(s.layers) + ", got " +
                                          std::to_string(cur.block_layers));
  // With one-layer blocks (the default) a stage's blocks are its layers.
  const int64_t full_blocks = s.layers / cur.block_layers;
  const std::string full = cur.block_layers == 1
                               ? "student.layers = " + std::to_string(s.layers)
                               : "student.layers / curriculum.block_layers = " + std::to_string(s.layers) + " / " +
                                     std::to_string(cur.block_layers) + " = " + std::to_string(full_blocks) + " blocks";
  validate_stages(c, cur, full_blocks, full);
  validate_budgets(c, cur);
  if (cur.grow_init == GrowInit::kTeacher && s.init != StudentInit::kTeacher)
    c.fail("curriculum.grow_init", "\"teacher\" copies the teacher's layers, which read the teacher's embedding: "
                                   "needs student.init = \"teacher\" (got \"" + std::string(option_name(s.init)) + "\")");
  if (cur.freeze_prefix && cur.mode != CurriculumMode::kGrow) c.fail("curriculum.freeze_prefix", "needs mode = \"grow\"");
  c.at_least("curriculum.rewarmup_steps", cur.rewarmup_steps, 0);
  if (cur.phase_policy == PhasePolicy::kReset && cur.rewarmup_steps > 0)
    c.fail("curriculum.rewarmup_steps", "must be 0 with curriculum.phase_policy = \"reset\" (every phase "
                                        "already restarts with optim.warmup_steps of warmup)");
}

void validate_distill_and_optim(const Checker& c, const DistillConfig& di, const OptimConfig& o) {
  c.in_unit_interval("distill.alpha", di.alpha);
  c.positive("distill.temperature", di.temperature);
  c.at_least("distill.topk", di.topk, 1);
  c.at_least("distill.vocab_chunk", di.vocab_chunk, 1);
  c.at_least("distill.row_chunk", di.row_chunk, 0);

  c.positive("optim.lr", o.lr);
  c.in_unit_interval("optim.min_lr_ratio", o.min_lr_ratio);
  if (!(o.weight_decay >= 0)) c.fail("optim.weight_decay", "must be >= 0, got " + format_double(o.weight_decay));
  if (o.betas.size() != 2) c.fail("optim.betas", "needs two values, got " + std::to_string(o.betas.size()));
  for (double b : o.betas)
    if (!(b >= 0 && b < 1)) c.fail("optim.betas", "each must be in [0, 1), got " + format_double(b));
  c.positive("optim.eps", o.eps);
  c.at_least("optim.warmup_steps", o.warmup_steps, 0);
  if (!(o.grad_clip >= 0)) c.fail("optim.grad_clip", "must be >= 0 (0 = off), got " + format_double(o.grad_clip));
}

void validate_cache(const Checker& c, const Config& cfg) {
  const CacheConfig& k = cfg.cache;
  c.at_least("cache.samples", k.samples, 1);
  if (k.samples > 65535) c.fail("cache.samples", "must be <= 65535, got " + std::to_string(k.samples));
  c.at_least("cache.topk", k.topk, 0);
  c.at_least("cache.seed", k.seed, 0);
  c.at_least("cache.train_sequences", k.train_sequences, 0);
  c.at_least("cache.valid_sequences", k.valid_sequences, 0);
  if (cfg.distill.source != DistillSource::kCache) return;
  if (k.dir.empty()) c.fail("cache.dir", "required with distill.source = \"cache\" (a folder `deepen cache` wrote)");
  if (k.targets == CacheTargets::kTopk && k.topk < 1)
    c.fail("cache.topk", "cache.targets = \"topk\" needs the cache's k here (>= 1), got 0");
}

void validate_parallel(const Checker& c, const ParallelConfig& p, const StudentConfig& s) {
  c.at_least("parallel.teacher_pipelines", p.teacher_pipelines, 1);
  c.at_least("parallel.teacher_stages", p.teacher_stages, 1);
  c.at_least("parallel.students", p.students, 1);
  c.at_least("parallel.micro_batch", p.micro_batch, 1);
  c.at_least("parallel.grad_accum", p.grad_accum, 1);
  c.at_least("parallel.global_batch", p.global_batch, 0);
  c.at_least("parallel.max_in_flight", p.max_in_flight, 1);
  if (p.students % p.teacher_pipelines != 0)
    c.fail("parallel.students", "must be a multiple of parallel.teacher_pipelines = " +
                                    std::to_string(p.teacher_pipelines) + ", got " + std::to_string(p.students));
  // A block's parameters can be let go after its forward only when the backward recomputes it
  // (gathering them again); kept for a plain backward, every block would be whole at the end of
  // the forward and "full" would save nothing over "grad_op".
  if (p.sharding == Sharding::kFull && s.recompute != Recompute::kLayer)
    c.fail("parallel.sharding", "\"full\" needs student.recompute = \"layer\" (got \"" +
                                    std::string(option_name(s.recompute)) +
                                    "\"): a block's parameters are gathered again for its recomputed backward; "
                                    "without recomputation use \"grad_op\"");
  c.positive("parallel.bucket_cap_mb", p.bucket_cap_mb);
}

void validate_eval_checkpoint_control(const Checker& c, const Config& cfg) {
  c.at_least("eval.every", cfg.eval.every, 1);
  c.at_least("eval.batches", cfg.eval.batches, 1);
  c.at_least("eval.diagnostics_every", cfg.eval.diagnostics_every, 0);
  c.at_least("eval.diagnostic_batch", cfg.eval.diagnostic_batch, 1);
  c.at_least("checkpoint.every", cfg.checkpoint.every, 0);
  c.at_least("checkpoint.keep", cfg.checkpoint.keep, 1);
  const auto& ct = cfg.control;
  c.positive("control.heartbeat_s", ct.heartbeat_s);
  if (!(ct.watchdog_s > ct.heartbeat_s))
    c.fail("control.watchdog_s", "must exceed control.heartbeat_s = " + format_double(ct.heartbeat_s));
  c.port("control.metrics_port", ct.metrics_port);
  c.port("control.coordinator_port", ct.coordinator_port);
  c.positive("control.nccl_setup_timeout_s", ct.nccl_setup_timeout_s);
}

void validate_guard(const Checker& c, const GuardConfig& g) {
  if (!(g.spike_factor == 0 || g.spike_factor > 1))
    c.fail("guard.spike_factor", "must be 0 (off) or > 1, got " + format_double(g.spike_factor));
  c.at_least("guard.spike_window", g.spike_window, 1);
  c.at_least("guard.max_skips", g.max_skips, 0);
  if (!(g.rollback_lr_factor > 0 && g.rollback_lr_factor < 1))
    c.fail("guard.rollback_lr_factor", "must be in (0, 1), got " + format_double(g.rollback_lr_factor));
  c.at_least("guard.max_rollbacks", g.max_rollbacks, 0);
  c.positive("guard.lr_scale", g.lr_scale);
}

}  // namespace

// Every float key is finite and within fp32's range before this runs (SectionReader); enumerated
// options were parsed into their enums. What is left: bounds, and rules across keys and sections.
void validate_config(const Config& cfg) {
  const Checker c{cfg};
  validate_run(c, cfg.run);
  validate_data(c, cfg.data, cfg.curriculum);
  validate_student(c, cfg.student);
  validate_curriculum(c, cfg.curriculum, cfg.student);
  validate_distill_and_optim(c, cfg.distill, cfg.optim);
  validate_parallel(c, cfg.parallel, cfg.student);
  validate_eval_checkpoint_control(c, cfg);
  validate_guard(c, cfg.guard);
  validate_cache(c, cfg);
}

Config parse_config(const std::string& toml_text, const std::string& source,
                    const std::vector<std::string>& overrides) {
  toml::table root = parse_toml(toml_text, source);
  Config cfg;
  cfg.source = source;
  for (const auto& item : overrides) cfg.overridden.insert(apply_override(root, item));
  std::set<std::string> sections;
  auto read_section = [&](const char* name, auto& section) {
    sections.insert(name);
    const toml::node* node = root.get(name);
    if (node && !node->is_table()) throw InputError(source + ": " + name + ": expected a [section] table");
    SectionReader reader(node ? node->as_table() : nullptr, source, name, cfg.overridden);
    section.visit(reader);
    reader.reject_unknown_keys();
  };
  cfg.visit_sections(read_section);
  for (const auto& [k, v] : root) {
    if (!sections.count(std::string(k.str()))) {
      const std::string name(k.str());
      for (const std::string& key : cfg.overridden)
        if (key.rfind(name + ".", 0) == 0) throw InputError("--set " + key + ": unknown section [" + name + "]");
      throw InputError(source + ": [" + name + "]: unknown section");
    }
  }
  const toml::node* parallel = root.get("parallel");
  const bool grad_accum_given = parallel && parallel->is_table() && parallel->as_table()->contains("grad_accum");
  derive_grad_accum(cfg.parallel, grad_accum_given, source);
  resolve(cfg);
  validate_config(cfg);
  return cfg;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return parse_config("", "<defaults>", overrides);
  return parse_config(read_file_text(path, "config file"), path, overrides);
}

std::string to_toml(const Config& cfg) {
  std::ostringstream out;
  auto write_section = [&](const char* name, auto& section) {
    out << "[" << name << "]\n";
    SectionWriter writer(out);
    section.visit(writer);
    out << "\n";
  };
  const_cast<Config&>(cfg).visit_sections(write_section);
  return out.str();
}

uint64_t config_hash(const Config& cfg) { return hash64(to_toml(cfg)); }

Config without_execution_settings(const Config& cfg) {
  const Config defaults;
  Config c = cfg;
  c.run.threads = defaults.run.threads;
  c.run.device = defaults.run.device;
  c.run.tensorboard = defaults.run.tensorboard;  // what is written beside the records, not what is trained
  c.student.cpu_kernels = defaults.student.cpu_kernels;
  c.teacher.cpu_kernels = defaults.teacher.cpu_kernels;
  c.student.recompute = defaults.student.recompute;
  c.student.tf32 = defaults.student.tf32;  // rounding of fp32 matmuls on CUDA only
  c.distill.row_chunk = defaults.distill.row_chunk;  // the loss's memory and summation order only
  c.control = defaults.control;
  return c;
}

Config without_layout(const Config& cfg) {
  const ParallelConfig defaults;
  Config c = cfg;
  ParallelConfig& p = c.parallel;
  p.global_batch = p.students * p.micro_batch * p.grad_accum;
  p.teacher_pipelines = defaults.teacher_pipelines;
  p.teacher_stages = defaults.teacher_stages;
  p.students = defaults.students;
  p.grad_accum = defaults.grad_accum;
  p.backend = defaults.backend;
  p.max_in_flight = defaults.max_in_flight;
  // How the students share the optimizer state and reduce gradients changes sums' order, not what is
  // trained; a sharded checkpoint resumes replicated and the other way round (train/optimizer_state_files.h).
  p.sharding = defaults.sharding;
  p.bucket_cap_mb = defaults.bucket_cap_mb;
  p.overlap_grad_reduce = defaults.overlap_grad_reduce;
  p.rank_order = defaults.rank_order;
  return c;
}

namespace {
// "section.key" -> value text, in to_toml's order.
std::vector<std::pair<std::string, std::string>> toml_entries(const Config& cfg) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(to_toml(cfg));
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.front() == '[') {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) out.emplace_back(section + "." + line.substr(0, eq), line.substr(eq + 3));
  }
  return out;
}
}  // namespace

std::vector<ConfigDifference> config_differences(const Config& a, const Config& b) {
  const auto ea = toml_entries(a), eb = toml_entries(b);
  std::vector<ConfigDifference> out;
  for (size_t i = 0; i < ea.size() && i < eb.size(); ++i)
    if (ea[i].second != eb[i].second) out.push_back({ea[i].first, ea[i].second, eb[i].second});
  return out;
}

int64_t data_order_seed(const Config& cfg) { return cfg.data.order_seed >= 0 ? cfg.data.order_seed : cfg.run.seed; }

int64_t mix_post_layers(int64_t layers, double fraction) {
  // A hair below the product, so a fraction written as 1/3 to ten digits still gives ceil(3.0) = 3.
  return static_cast<int64_t>(std::ceil(fraction * static_cast<double>(layers) - 1e-9));
}

std::vector<int64_t> stage_depths(const CurriculumConfig& cur) {
  std::vector<int64_t> out;
  for (int64_t blocks : cur.stages) out.push_back(blocks * cur.block_layers);
  return out;
}

}  // namespace deepen
