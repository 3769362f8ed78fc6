// The teacher cache's writer: plan, resume, the teacher's forward passes, draws, files, manifest.
#include "teacher_cache/cache_writer.h"

#include <ATen/ATen.h>

#include <chrono>
#include <filesystem>
#include <iostream>

#include "config/input_error.h"
#include "config/text_file.h"
#include "data/documents.h"
#include "data/tokenizer.h"
#include "model/hf_config.h"
#include "model/teacher_stage.h"
#include "model/torch_dtype.h"
#include "teacher_cache/cache_file.h"
#include "teacher_cache/teacher_draws.h"
#include "train/micro_batch.h"
#include "train/shard_batch_source.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;

std::vector<ShardIdentity> shard_identities(const ShardSet& set) {
  std::vector<ShardIdentity> out;
  for (const Shard& s : set.shards())
    out.push_back({fs::path(s.path()).filename().string(), s.header().payload_hash, s.size()});
  return out;
}

int64_t items_of(const ShardSet& set, Packing packing) {
  return packing == Packing::kDocuments ? set.documents() : set.sequences();
}

// Target positions of item i of `set` (a window's seq_len, a document's targets cut to max_len).
int64_t records_of(const ShardSet& set, int64_t i, const DataConfig& d) {
  if (d.packing == Packing::kDocuments) return document_targets(set.document(i).tokens, d.max_len);
  return d.seq_len;
}

// The files of one split: per shard, the items [a, b) it holds, cut to the first `cached`.
void plan_split(const ShardSet& set, const DataConfig& d, int64_t split, int64_t cached, CacheManifest& m) {
  const char* dir = split == 0 ? "train" : "valid";
  int64_t token_begin = 0, doc_begin = 0, records_total = 0;
  for (const Shard& shard : set.shards()) {
    const int64_t token_end = token_begin + shard.size();
    const int64_t doc_end = doc_begin + static_cast<int64_t>(shard.header().doc_count);
    int64_t a = 0, b = 0;
    if (d.packing == Packing::kDocuments) {
      a = doc_begin, b = doc_end;  // the documents whose last token is in this shard
    } else {
      // Sequence i starts at token i·seq_len: those starting in [token_begin, token_end).
      a = (token_begin + d.seq_len - 1) / d.seq_len;
      b = (token_end + d.seq_len - 1) / d.seq_len;
    }
    a = std::min(a, cached);
    b = std::min(b, cached);
    if (b > a) {
      CacheFileEntry f;
      f.path = std::string(dir) + "/" + fs::path(shard.path()).stem().string() + ".cache";
      f.split = split;
      f.first_sequence = a;
      f.sequences = b - a;
      for (int64_t i = a; i < b; ++i) f.records += records_of(set, i, d);
      records_total += f.records;
      m.files.push_back(f);
    }
    token_begin = token_end;
    doc_begin = doc_end;
  }
  (split == 0 ? m.train_records : m.valid_records) = records_total;
}

std::string describe_bytes(double b) {
  char buf[32];
  if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  else std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  return buf;
}

// A planned file already in place that is exactly the planned one (header, index, payload hash).
bool complete_file(const std::string& path, const CacheFileEntry& f, const CacheManifest& m, std::string& why) {
  if (!fs::exists(path)) return false;
  try {
    const CacheFile file = CacheFile::open(path);
    const CacheFileHeader& h = file.header();
    if (static_cast<int64_t>(h.first_sequence) != f.first_sequence || static_cast<int64_t>(h.sequences) != f.sequences ||
        static_cast<int64_t>(h.records) != f.records || h.samples != m.samples || h.topk != m.topk) {
      why = "its header describes other sequences or draws";
      return false;
    }
    if (file.hash_payload() != h.payload_hash) {
      why = "its payload does not match its hash";
      return false;
    }
    return true;
  } catch (const std::exception& e) {
    why = e.what();
    return false;
  }
}

// The records of one micro-batch's rows: K draws per real target position, the entropy, the top-k.
void write_batch(TeacherStage& teacher, const MicroBatch& mb, const std::vector<int64_t>& items, int64_t split,
                 const CacheManifest& m, CacheFileWriter& out) {
  at::NoGradGuard no_grad;
  const at::Tensor logits = teacher.forward(mb.inputs.to(teacher.device()));  // [B, T, V]
  const double tau = split == 0 ? m.train_temperature : m.valid_temperature;
  const at::Tensor labels = mb.labels;
  std::vector<CacheRecord> records;
  for (size_t b = 0; b < items.size(); ++b) {
    const int64_t n = (labels[static_cast<int64_t>(b)] != kIgnoreLabel).sum().item<int64_t>();
    const at::Tensor rows = logits[static_cast<int64_t>(b)].narrow(0, 0, n);
    std::vector<TokenPlace> places(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) places[static_cast<size_t>(t)] = {split, items[b], t};
    const TeacherDraws draws = draw_from_teacher(rows, tau, token_uniforms(static_cast<uint64_t>(m.seed), places, m.samples));
    TeacherTargets top;
    if (m.topk > 0) {
      top = teacher_topk(rows, m.topk, tau);
      top.values = top.values.to(at::kCPU, at::kFloat).contiguous();
      top.indices = top.indices.to(at::kCPU, at::kLong).contiguous();
    }
    records.assign(static_cast<size_t>(n), CacheRecord{});
    const int64_t K = m.samples;
    const int64_t* ids = draws.ids.data_ptr<int64_t>();
    const double* h = draws.entropy.data_ptr<double>();
    for (int64_t t = 0; t < n; ++t) {
      CacheRecord& r = records[static_cast<size_t>(t)];
      r.entropy = static_cast<float>(h[t]);
      for (int64_t j = 0; j < K; ++j) {
        const uint32_t id = static_cast<uint32_t>(ids[t * K + j]);
        if (r.ids.empty() || r.ids.back() != id) {
          r.ids.push_back(id);
          r.counts.push_back(1);
        } else {
          ++r.counts.back();
        }
      }
      for (int64_t j = 0; j < m.topk; ++j) {
        r.topk_ids.push_back(static_cast<uint32_t>(top.indices.data_ptr<int64_t>()[t * m.topk + j]));
        r.topk_logp.push_back(top.values.data_ptr<float>()[t * m.topk + j]);
      }
    }
    out.append_sequence(records);
  }
}

}  // namespace

CacheManifest cache_identity(const Config& cfg, const Tokenizer& tokenizer, int64_t vocab, const ShardSet& train,
                             const ShardSet& valid, uint64_t teacher_fingerprint, uint64_t teacher_weights_hash) {
  const DataConfig& d = cfg.data;
  CacheManifest m;
  m.teacher_checkpoint = cfg.teacher.checkpoint;
  m.teacher_fingerprint = teacher_fingerprint;
  m.teacher_weights_hash = teacher_weights_hash;
  m.teacher_dtype = cfg.teacher.dtype;
  m.vocab = vocab;
  m.tokenizer = d.tokenizer;
  m.tokenizer_fingerprint = tokenizer.fingerprint();
  m.packing = d.packing;
  m.seq_len = d.packing == Packing::kWindows ? d.seq_len : 0;
  m.max_len = d.packing == Packing::kDocuments ? d.max_len : 0;
  m.train_shards = shard_identities(train);
  m.valid_shards = shard_identities(valid);
  m.samples = cfg.cache.samples;
  m.topk = cfg.cache.topk;
  m.seed = cfg.cache.seed;
  m.train_temperature = cfg.distill.temperature;
  m.valid_temperature = 1.0;  // eval scores KL at τ = 1 (train/trainer_eval.cpp)
  return m;
}

CacheManifest plan_cache(const Config& cfg, const Tokenizer& tokenizer, int64_t vocab, const ShardSet& train,
                         const ShardSet& valid, uint64_t teacher_fingerprint, uint64_t teacher_weights_hash) {
  const DataConfig& d = cfg.data;
  CacheManifest m = cache_identity(cfg, tokenizer, vocab, train, valid, teacher_fingerprint, teacher_weights_hash);
  const int64_t train_items = items_of(train, d.packing), valid_items = items_of(valid, d.packing);
  const std::string item = d.packing == Packing::kDocuments ? "documents" : "sequences";
  m.train_sequences = cfg.cache.train_sequences > 0 ? cfg.cache.train_sequences : train_items;
  if (m.train_sequences > train_items)
    throw InputError(cfg.source + ": cache.train_sequences = " + std::to_string(m.train_sequences) + ": " + d.train +
                     " holds " + std::to_string(train_items) + " " + item);
  const int64_t eval_set = d.packing == Packing::kDocuments && d.valid_documents > 0
                               ? d.valid_documents
                               : cfg.eval.batches * cfg.parallel.micro_batch;
  m.valid_sequences = cfg.cache.valid_sequences > 0 ? cfg.cache.valid_sequences : eval_set;
  if (m.valid_sequences > valid_items)
    throw InputError(cfg.source + ": " +
                     (cfg.cache.valid_sequences > 0 ? "cache.valid_sequences = " : "the eval set (cache.valid_sequences = 0) = ") +
                     std::to_string(m.valid_sequences) + ": " + d.valid + " holds " + std::to_string(valid_items) + " " + item);
  plan_split(train, d, 0, m.train_sequences, m);
  plan_split(valid, d, 1, m.valid_sequences, m);
  return m;
}

CacheWriteStats write_cache(const Config& cfg, const Tokenizer& tokenizer, const CacheWriteOptions& o,
                            at::Device device) {
  if (o.parts < 1 || o.part < 0 || o.part >= o.parts)
    throw InputError("deepen cache: --part " + std::to_string(o.part) + "/" + std::to_string(o.parts) +
                     ": need 0 <= part < parts");
  if (cfg.teacher.checkpoint.empty()) throw InputError(cfg.source + ": teacher.checkpoint: required by `deepen cache`");
  const auto start = std::chrono::steady_clock::now();
  // Every decision first: the plan from small files (shard headers and indexes, the teacher's
  // config.json and fingerprint), checked against what the folder holds, before the teacher loads.
  const Qwen3Config tc = read_qwen3_config(cfg.teacher.checkpoint + "/config.json");
  const ShardSet train = open_data_split(cfg.data.train, cfg.data, tokenizer);
  const ShardSet valid = open_data_split(cfg.data.valid, cfg.data, tokenizer);
  if (tc.vocab_size < tokenizer.vocab_size())
    throw InputError(cfg.teacher.checkpoint + "/config.json: vocab_size " + std::to_string(tc.vocab_size) +
                     " is smaller than the " + tokenizer.name() + " tokenizer's " + std::to_string(tokenizer.vocab_size()) + " ids");
  const uint64_t fingerprint = teacher_fingerprint(cfg.teacher.checkpoint);
  CacheManifest m = plan_cache(cfg, tokenizer, tc.vocab_size, train, valid, fingerprint, 0);
  const std::string& dir = o.out_dir;
  auto refuse_other = [&](const CacheManifest& have, const std::string& file) {
    const std::vector<std::string> diffs = manifest_differences(m, have);
    if (diffs.empty()) return;
    std::string msg = dir + ": holds a teacher cache made with another config (" + file + "):";
    for (const std::string& x : diffs) msg += "\n  " + x + " (this config vs the folder's)";
    throw InputError(msg + "\ngive another --out, or remove the folder to make this one there");
  };
  CacheWriteStats stats;
  if (fs::exists(cache_manifest_path(dir))) {
    const CacheManifest done = read_cache_manifest(dir);
    refuse_other(done, "manifest.json");
    if (o.print_progress) std::cerr << "deepen cache: " << dir << " is complete already (" << describe_bytes(double(done.bytes())) << ")\n";
    stats.complete = true;
    return stats;
  }
  m.teacher_weights_hash = teacher_weights_hash(cfg.teacher.checkpoint);
  if (fs::exists(cache_plan_path(dir)))
    refuse_other(parse_cache_manifest(read_file_text(cache_plan_path(dir), "teacher cache plan"), cache_plan_path(dir)),
                 "plan.json");
  fs::create_directories(fs::path(dir) / "train");
  fs::create_directories(fs::path(dir) / "valid");
  write_file_text(cache_plan_path(dir), cache_manifest_json(m), "the teacher cache's plan");

  std::shared_ptr<TeacherStage> teacher;
  const int64_t b = cfg.parallel.micro_batch;
  for (size_t f = 0; f < m.files.size(); ++f) {
    if (static_cast<int64_t>(f) % o.parts != o.part) continue;
    CacheFileEntry& entry = m.files[f];
    const std::string path = (fs::path(dir) / entry.path).string();
    std::string why;
    if (complete_file(path, entry, m, why)) {
      ++stats.files_kept;
      continue;
    }
    if (fs::exists(path) && o.print_progress)
      std::cerr << "deepen cache: WARNING: " << path << " is not the planned file (" << why << "); writing it again\n";
    if (!teacher)
      teacher = TeacherStage::load(cfg.teacher.checkpoint, 0, static_cast<int>(tc.num_hidden_layers), true, true,
                                   to_scalar_type(cfg.teacher.dtype), device, cfg.teacher.cpu_kernels);
    const auto file_start = std::chrono::steady_clock::now();
    const ShardSet& set = entry.split == 0 ? train : valid;
    CacheFileWriter out(path, static_cast<uint32_t>(m.samples), static_cast<uint32_t>(m.topk),
                        static_cast<uint64_t>(entry.first_sequence));
    for (int64_t i = entry.first_sequence; i < entry.first_sequence + entry.sequences; i += b) {
      std::vector<int64_t> items;
      for (int64_t k = i; k < std::min(i + b, entry.first_sequence + entry.sequences); ++k) items.push_back(k);
      write_batch(*teacher, read_micro_batch(set, items, cfg.data, tokenizer.eos_id()), items, entry.split, m, out);
    }
    out.commit();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - file_start).count();
    const auto bytes = static_cast<int64_t>(fs::file_size(path));
    ++stats.files_written;
    stats.records += entry.records;
    stats.bytes += bytes;
    if (o.print_progress)
      std::cerr << "deepen cache: " << entry.path << ": " << entry.sequences << " sequences, " << entry.records
                << " tokens, " << describe_bytes(double(bytes)) << " (" << double(bytes) / double(entry.records)
                << " bytes/token), " << double(entry.records) / s << " tokens/s\n";
  }

  // The manifest, once every file of every part is in place.
  int64_t present = 0;
  for (CacheFileEntry& entry : m.files) {
    const std::string path = (fs::path(dir) / entry.path).string();
    if (!fs::exists(path)) continue;
    const CacheFileHeader h = read_cache_file_header(path);
    entry.bytes = fs::file_size(path);
    entry.hash = h.payload_hash;
    ++present;
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (present == static_cast<int64_t>(m.files.size())) {
    write_file_text(cache_manifest_path(dir), cache_manifest_json(m), "the teacher cache's manifest");
    stats.complete = true;
    if (o.print_progress)
      std::cerr << "deepen cache: " << dir << " complete: " << m.files.size() << " files, "
                << m.train_records + m.valid_records << " tokens, " << describe_bytes(double(m.bytes())) << " ("
                << double(m.bytes()) / double(m.train_records + m.valid_records) << " bytes/token)\n";
  } else if (o.print_progress) {
    std::cerr << "deepen cache: part " << o.part << "/" << o.parts << " done; " << present << " of " << m.files.size()
              << " files in place (the part that completes the set writes manifest.json; `deepen cache` without "
                 "--part completes it too)\n";
  }
  return stats;
}

}  // namespace deepen
