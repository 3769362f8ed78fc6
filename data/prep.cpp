// `deepen prep`: a reader thread cuts documents into chunks, worker threads tokenize them, a writer
// thread appends them to the train/valid shards in chunk order (so output ignores thread count).
#include "data/prep.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "config/hash.h"
#include "config/input_error.h"
#include "config/text_file.h"
#include "data/parquet_source.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kSplitSeed = 0x76616c6964ULL;  // "valid": fixed, part of the split's definition
constexpr size_t kChunkBytes = size_t(1) << 20;   // documents are handed to workers ~1 MiB at a time
constexpr size_t kChunkDocs = 4096;

enum class SourceKind { text, jsonl, parquet };

struct SourceFile {
  std::string path;
  SourceKind kind = SourceKind::text;
  uint64_t bytes = 0;
  ParquetLayout parquet;  // kind == parquet: read from the footer while listing
};

struct Chunk {
  size_t index = 0;
  std::vector<std::string> docs;
  std::vector<std::string> ids;  // per document: what the split hashes instead of the text, "" = the text
  uint64_t bytes = 0;
  uint64_t source_pos = 0;       // source bytes consumed when the chunk was cut (for the progress bar)
};

struct TokenizedDoc {
  std::vector<int32_t> ids;  // EOS included
  bool valid = false;
};

struct Result {
  size_t index = 0;
  std::vector<TokenizedDoc> docs;
  uint64_t source_pos = 0;
};

bool has_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

SourceKind kind_of(const fs::path& p) {
  if (p.extension() == ".jsonl") return SourceKind::jsonl;
  if (p.extension() == ".parquet") return SourceKind::parquet;
  return SourceKind::text;
}

bool looks_binary(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char buf[8192];
  in.read(buf, sizeof buf);
  return std::find(buf, buf + in.gcount(), '\0') != buf + in.gcount();
}

// Every source expanded to files, in the documented order; throws before anything is written.
std::vector<SourceFile> list_sources(const DataConfig& cfg, int64_t& skipped) {
  if (cfg.sources.empty())
    throw InputError("data.sources: empty; list the text files, folders, .jsonl or .parquet files to tokenize");
  std::vector<SourceFile> out;
  auto add = [&](const fs::path& p) {
    SourceFile f{p.string(), kind_of(p), 0, {}};
    // Parquet is binary by nature; its footer is checked here, so a bad file fails before any output.
    if (f.kind == SourceKind::parquet) {
      f.parquet = read_parquet_layout(f.path, cfg.parquet_text_column, cfg.id_field);
    } else if (looks_binary(p.string())) {
      ++skipped;
      return;
    }
    std::error_code ec;
    f.bytes = uint64_t(fs::file_size(p, ec));
    out.push_back(std::move(f));
  };
  for (const std::string& src : cfg.sources) {
    std::error_code ec;
    const fs::path p(src);
    if (fs::is_directory(p, ec)) {
      std::vector<fs::path> files;
      for (auto it = fs::recursive_directory_iterator(p, fs::directory_options::skip_permission_denied, ec);
           it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) break;
        const std::string name = it->path().filename().string();
        if (!name.empty() && name[0] == '.') {
          if (it->is_directory(ec)) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file(ec)) files.push_back(it->path());
      }
      if (ec) throw InputError("data.sources: \"" + src + "\": cannot list folder: " + ec.message());
      std::sort(files.begin(), files.end());
      for (const fs::path& f : files) add(f);
    } else if (fs::is_regular_file(p, ec)) {
      add(p);
    } else {
      throw InputError("data.sources: \"" + src + "\": no such file or folder");
    }
  }
  return out;
}


// Calls add(document, id, line bytes) for every non-blank line of a JSONL file, in order; the
// document is the string field cfg.jsonl_field, the id the field cfg.id_field where the record has
// one (a string, or an integer in decimal as parquet's integer ids are). Returns false as soon as add does.
template <class Add>
bool read_jsonl(const std::string& path, const DataConfig& cfg, Add&& add) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read: " + std::strerror(errno));
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    const std::string where = path + ":" + std::to_string(lineno) + ": ";
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(where + "not valid JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains(cfg.jsonl_field) || !j[cfg.jsonl_field].is_string())
      throw InputError(where + "no string field \"" + cfg.jsonl_field + "\" (data.jsonl_field)");
    std::string id;
    if (!cfg.id_field.empty() && j.contains(cfg.id_field)) {
      const nlohmann::json& v = j[cfg.id_field];
      if (v.is_string()) id = v.get<std::string>();
      else if (v.is_number_integer()) id = v.dump();
      else if (!v.is_null())
        throw InputError(where + "field \"" + cfg.id_field + "\" (data.id_field) must be a string or an integer, got " +
                         v.type_name());
    }
    if (!add(j[cfg.jsonl_field].get<std::string>(), std::move(id), line.size() + 1)) return false;
  }
  return true;
}

// Output folder for a split: must be a folder name (created), free of shards unless overwriting.
// Returns the shard files already there (removed after a successful run when overwriting).
// `created` lists the folders made here, so a failed run can remove them again.
std::vector<std::string> prepare_output(const std::string& key, const std::string& folder, bool overwrite,
                                        std::vector<fs::path>& created) {
  if (folder.empty()) throw InputError(key + ": empty; prep needs an output folder");
  if (has_glob(folder)) throw InputError(key + ": \"" + folder + "\": prep writes a folder, not a glob pattern");
  std::error_code ec;
  if (fs::exists(folder, ec) && !fs::is_directory(folder, ec))
    throw InputError(key + ": \"" + folder + "\": exists and is not a folder");
  std::vector<std::string> old = fs::is_directory(folder, ec) ? list_shard_files(folder) : std::vector<std::string>{};
  if (!old.empty() && !overwrite)
    throw InputError(key + ": \"" + folder + "\" already holds " + std::to_string(old.size()) +
                     " shard file(s); remove them or pass --overwrite");
  fs::path missing = fs::absolute(folder, ec);
  std::vector<fs::path> made;
  for (fs::path p = missing; !p.empty() && !fs::exists(p, ec) && p != p.parent_path(); p = p.parent_path()) made.push_back(p);
  fs::create_directories(folder, ec);
  if (ec) throw InputError(key + ": \"" + folder + "\": cannot create folder: " + ec.message());
  created.insert(created.end(), made.begin(), made.end());  // deepest first
  return old;
}

// One split's shards: rolls over to a new file every shard_tokens tokens; files stay under their
// temporary names until commit().
class SplitWriter {
 public:
  SplitWriter(std::string folder, std::string prefix, int64_t shard_tokens, const Tokenizer& tok)
      : folder_(std::move(folder)), prefix_(std::move(prefix)), shard_tokens_(shard_tokens),
        vocab_(uint64_t(tok.vocab_size())), fingerprint_(tok.fingerprint()) {}

  void append_document(std::span<const int32_t> ids) {
    while (!ids.empty()) {
      if (!current_ || current_->token_count() >= uint64_t(shard_tokens_)) open_next();
      const size_t room = size_t(uint64_t(shard_tokens_) - current_->token_count());
      const size_t take = std::min(room, ids.size());
      current_->append(ids.first(take));
      ids = ids.subspan(take);
      tokens_ += int64_t(take);
    }
    current_->end_document();  // the document index: documents mode reads them back without re-tokenizing
    ++docs_;
  }
  void finish() {
    for (auto& w : writers_) w->finish();
  }
  std::vector<std::string> commit() {
    std::vector<std::string> paths;
    for (auto& w : writers_) {
      w->commit();
      paths.push_back(w->path());
    }
    return paths;
  }
  int64_t tokens() const { return tokens_; }
  int64_t docs() const { return docs_; }

 private:
  void open_next() {
    if (current_) current_->finish();
    char name[64];
    std::snprintf(name, sizeof name, "%s-%05zu%s", prefix_.c_str(), writers_.size(), kShardExtension);
    writers_.push_back(std::make_unique<ShardWriter>((fs::path(folder_) / name).string(), vocab_, fingerprint_));
    current_ = writers_.back().get();
  }

  std::string folder_, prefix_;
  int64_t shard_tokens_;
  uint64_t vocab_, fingerprint_;
  std::vector<std::unique_ptr<ShardWriter>> writers_;
  ShardWriter* current_ = nullptr;
  int64_t tokens_ = 0, docs_ = 0;
};

std::string with_commas(int64_t v) {
  const std::string digits = std::to_string(v);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Work queue and in-order result hand-off between the three roles.
class Pipeline {
 public:
  explicit Pipeline(size_t max_chunks) : max_chunks_(max_chunks) {}

  bool push(Chunk c) {  // reader; false when the pipeline failed
    std::unique_lock lk(mu_);
    cv_space_.wait(lk, [&] { return failed_ || chunks_.size() + in_flight_ < max_chunks_; });
    if (failed_) return false;
    chunks_.push_back(std::move(c));
    ++pushed_;
    cv_work_.notify_one();
    return true;
  }
  void close_input() {
    std::lock_guard lk(mu_);
    input_done_ = true;
    cv_work_.notify_all();
    cv_result_.notify_all();
  }
  std::optional<Chunk> pop() {  // worker
    std::unique_lock lk(mu_);
    cv_work_.wait(lk, [&] { return failed_ || input_done_ || !chunks_.empty(); });
    if (failed_ || chunks_.empty()) return std::nullopt;
    Chunk c = std::move(chunks_.front());
    chunks_.pop_front();
    ++in_flight_;
    return c;
  }
  void done(Result r) {  // worker
    std::lock_guard lk(mu_);
    results_.emplace(r.index, std::move(r));
    cv_result_.notify_all();
  }
  // Writer: the next result in chunk order, or nullopt when all are written (or on failure).
  std::optional<Result> next() {
    std::unique_lock lk(mu_);
    cv_result_.wait(lk, [&] { return failed_ || results_.count(next_) || (input_done_ && next_ >= pushed_); });
    if (failed_ || !results_.count(next_)) return std::nullopt;
    Result r = std::move(results_[next_]);
    results_.erase(next_++);
    --in_flight_;
    cv_space_.notify_all();
    return r;
  }
  void fail(std::exception_ptr e) {
    std::lock_guard lk(mu_);
    if (!error_) error_ = e;
    failed_ = true;
    cv_space_.notify_all();
    cv_work_.notify_all();
    cv_result_.notify_all();
  }
  std::exception_ptr error() {
    std::lock_guard lk(mu_);
    return error_;
  }
  bool failed() {
    std::lock_guard lk(mu_);
    return failed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_space_, cv_work_, cv_result_;
  std::deque<Chunk> chunks_;
  std::map<size_t, Result> results_;
  size_t max_chunks_, in_flight_ = 0, next_ = 0, pushed_ = 0;
  bool input_done_ = false, failed_ = false;
  std::exception_ptr error_;
};

class Progress {
 public:
  Progress(bool on, uint64_t total) : on_(on), total_(std::max<uint64_t>(total, 1)), start_(Clock::now()) {}
  void update(uint64_t done) {
    if (!on_) return;
    const auto now = Clock::now();
    if (now - last_ < std::chrono::milliseconds(100) && done < total_) return;
    last_ = now;
    const double frac = std::min(1.0, double(done) / double(total_));
    const double secs = std::chrono::duration<double>(now - start_).count();
    const int width = 30, fill = int(frac * width);
    std::fprintf(stderr, "\rprep %3d%% [%s%s] %s/%s MB %s MB/s ", int(frac * 100), std::string(size_t(fill), '#').c_str(),
                 std::string(size_t(width - fill), '.').c_str(), fixed(double(done) / 1e6, 1).c_str(),
                 fixed(double(total_) / 1e6, 1).c_str(), fixed(secs > 0 ? double(done) / 1e6 / secs : 0, 1).c_str());
    std::fflush(stderr);
  }
  void end() {
    if (on_) std::fprintf(stderr, "\n");
  }

 private:
  bool on_;
  uint64_t total_;
  Clock::time_point start_, last_{};
};

// Folders a run creates, removed again unless it succeeds (fs::remove leaves non-empty ones).
class CreatedFolders {
 public:
  CreatedFolders() = default;
  CreatedFolders(const CreatedFolders&) = delete;
  CreatedFolders& operator=(const CreatedFolders&) = delete;
  ~CreatedFolders() {
    if (keep_) return;
    std::sort(created.begin(), created.end(), [](const fs::path& a, const fs::path& b) {
      return std::distance(a.begin(), a.end()) > std::distance(b.begin(), b.end());  // deepest first
    });
    std::error_code e;
    for (const fs::path& p : created) fs::remove(p, e);
  }
  void keep() { keep_ = true; }
  std::vector<fs::path> created;

 private:
  bool keep_ = false;
};

// A chunk's documents tokenized, each with its EOS, and each put in its split by its key (its id
// where the source gives one, else its text).
Result tokenize_chunk(const Chunk& c, const Tokenizer& tok, double valid_fraction) {
  Result r;
  r.index = c.index;
  r.source_pos = c.source_pos;
  r.docs.resize(c.docs.size());
  for (size_t i = 0; i < c.docs.size(); ++i) {
    TokenizedDoc& d = r.docs[i];
    d.valid = is_validation_document(c.ids[i].empty() ? c.docs[i] : c.ids[i], valid_fraction);
    tok.encode_append(c.docs[i], d.ids);
    d.ids.push_back(tok.eos_id());
  }
  return r;
}

// A worker thread: tokenizes chunks until the input is done or the pipeline failed.
void tokenize_chunks(Pipeline& pipe, const Tokenizer& tok, double valid_fraction) {
  try {
    while (std::optional<Chunk> c = pipe.pop()) pipe.done(tokenize_chunk(*c, tok, valid_fraction));
  } catch (...) {
    pipe.fail(std::current_exception());
  }
}

// Sends each tokenized document to its split's writer. It holds back the newest training document,
// so that it can become the validation split if no document hashed into it.
class SplitRouter {
 public:
  SplitRouter(SplitWriter& train, SplitWriter& valid) : train_(train), valid_(valid) {}
  void add(TokenizedDoc& d) {
    if (d.valid) {
      valid_.append_document(d.ids);
      return;
    }
    if (holding_) train_.append_document(held_);
    held_ = std::move(d.ids);
    holding_ = true;
  }
  // Writes the held-back document; returns true when it went to the validation split.
  bool finish(double valid_fraction) {
    if (!holding_) return false;
    holding_ = false;
    if (valid_fraction > 0 && valid_.docs() == 0 && train_.docs() > 0) {
      valid_.append_document(held_);
      return true;
    }
    train_.append_document(held_);
    return false;
  }

 private:
  SplitWriter &train_, &valid_;
  std::vector<int32_t> held_;
  bool holding_ = false;
};

// The writer thread: the workers' results in chunk order into the splits.
void write_results(Pipeline& pipe, SplitRouter& router, Progress& progress) {
  try {
    while (std::optional<Result> r = pipe.next()) {
      for (TokenizedDoc& d : r->docs) router.add(d);
      progress.update(r->source_pos);
    }
  } catch (...) {
    pipe.fail(std::current_exception());
  }
}

// The reader (the calling thread): every source's documents, cut into chunks for the workers. It
// counts source bytes consumed for the progress bar (parquet text is compressed, so document
// bytes would not reach the files' total), and the files and document bytes into `sum`.
void read_sources(const std::vector<SourceFile>& sources, const DataConfig& cfg, Pipeline& pipe, PrepSummary& sum) {
  try {
    size_t chunks_made = 0;
    Chunk chunk;
    uint64_t pos = 0;
    auto flush = [&] {
      if (chunk.docs.empty()) return true;
      chunk.index = chunks_made;
      chunk.source_pos = pos;
      const bool ok = pipe.push(std::move(chunk));
      if (ok) ++chunks_made;
      chunk = Chunk{};
      return ok;
    };
    auto add_doc = [&](std::string doc, std::string id) {
      if (doc.empty()) return true;
      sum.bytes += int64_t(doc.size());
      chunk.bytes += doc.size();
      chunk.docs.push_back(std::move(doc));
      chunk.ids.push_back(std::move(id));
      if (chunk.bytes >= kChunkBytes || chunk.docs.size() >= kChunkDocs) return flush();
      return true;
    };
    bool ok = true;
    for (const SourceFile& src : sources) {
      if (!ok) break;
      ++sum.files;
      const uint64_t start_pos = pos;
      if (src.kind == SourceKind::text) {
        pos += src.bytes;
        ok = add_doc(read_file_text(src.path, "source file"), "");
      } else if (src.kind == SourceKind::parquet) {
        read_parquet_documents(
            src.path, src.parquet,
            [&](std::string_view text, std::string_view id) {
              return ok = add_doc(std::string(text), std::string(id));
            },
            [&](int64_t rows) {
              pos = start_pos + src.bytes * uint64_t(rows) / uint64_t(std::max<int64_t>(src.parquet.rows, 1));
            });
      } else {
        ok = read_jsonl(src.path, cfg, [&](std::string doc, std::string id, size_t line_bytes) {
          pos += line_bytes;
          return add_doc(std::move(doc), std::move(id));
        });
      }
      pos = start_pos + src.bytes;
    }
    if (ok) flush();
  } catch (...) {
    pipe.fail(std::current_exception());
  }
}

// Shards of an earlier run in the output folders that this one did not overwrite by name.
void remove_stale_shards(const std::vector<std::string>& old_shards, const PrepSummary& sum) {
  std::error_code ec;
  for (const std::string& f : old_shards)
    if (std::find(sum.train_shards.begin(), sum.train_shards.end(), f) == sum.train_shards.end() &&
        std::find(sum.valid_shards.begin(), sum.valid_shards.end(), f) == sum.valid_shards.end())
      fs::remove(f, ec);
}

}  // namespace

bool is_validation_document(std::string_view key, double valid_fraction) {
  if (valid_fraction <= 0) return false;
  const double u = double(hash64(key, kSplitSeed) >> 11) * 0x1.0p-53;  // uniform in [0, 1)
  return u < valid_fraction;
}

std::string PrepSummary::line() const {
  const double mb = double(bytes) / 1e6;
  return "prep: " + with_commas(train_docs + valid_docs) + " documents (" + with_commas(valid_docs) +
         " held out" + (valid_fallback ? ", the last one, as none hashed into the split" : "") + ") from " +
         with_commas(files) + " files" + (skipped_files ? " (" + with_commas(skipped_files) + " binary skipped)" : "") +
         ", " + with_commas(train_tokens + valid_tokens) + " tokens (train " + with_commas(train_tokens) + " in " +
         std::to_string(train_shards.size()) + " shard(s), valid " + with_commas(valid_tokens) + " in " +
         std::to_string(valid_shards.size()) + "), " + fixed(mb, 1) + " MB in " + fixed(seconds, 2) + " s (" +
         fixed(seconds > 0 ? mb / seconds : 0, 1) + " MB/s, " + std::to_string(threads) + " threads)";
}

PrepSummary run_prep(const DataConfig& cfg, const PrepOptions& opts) {
  const auto start = Clock::now();
  PrepSummary sum;
  // Everything that can be checked is checked before the first byte is written.
  if (cfg.shard_tokens <= 0) throw InputError("data.shard_tokens: must be positive, got " + std::to_string(cfg.shard_tokens));
  if (!(cfg.valid_fraction >= 0 && cfg.valid_fraction < 1))
    throw InputError("data.valid_fraction: must be in [0, 1), got " + std::to_string(cfg.valid_fraction));
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(cfg.tokenizer);
  const std::vector<SourceFile> sources = list_sources(cfg, sum.skipped_files);
  if (sources.empty()) throw InputError("data.sources: no text files found (only binary files or empty folders)");
  std::error_code ec;
  if (fs::weakly_canonical(cfg.train, ec) == fs::weakly_canonical(cfg.valid, ec))
    throw InputError("data.valid: \"" + cfg.valid + "\" is the same folder as data.train");
  CreatedFolders folders;
  std::vector<std::string> old_shards = prepare_output("data.train", cfg.train, opts.overwrite, folders.created);
  for (std::string& f : prepare_output("data.valid", cfg.valid, opts.overwrite, folders.created))
    old_shards.push_back(std::move(f));
  uint64_t total_bytes = 0;
  for (const SourceFile& s : sources) total_bytes += s.bytes;

  const int threads = opts.threads > 0 ? opts.threads : std::max(1, int(std::thread::hardware_concurrency()));
  sum.threads = threads;
  const bool show = opts.progress > 0 || (opts.progress < 0 && ::isatty(STDERR_FILENO));
  Progress progress(show, total_bytes);
  Pipeline pipe(size_t(threads) * 4);
  SplitWriter train(cfg.train, "train", cfg.shard_tokens, *tok);
  SplitWriter valid(cfg.valid, "valid", cfg.shard_tokens, *tok);
  SplitRouter router(train, valid);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) workers.emplace_back([&] { tokenize_chunks(pipe, *tok, cfg.valid_fraction); });
  std::thread writer([&] { write_results(pipe, router, progress); });
  read_sources(sources, cfg, pipe, sum);
  pipe.close_input();
  for (auto& w : workers) w.join();
  writer.join();
  if (std::exception_ptr e = pipe.error()) {
    progress.end();
    std::rethrow_exception(e);  // the writers' destructors remove every temporary file
  }

  sum.valid_fallback = router.finish(cfg.valid_fraction);
  progress.update(total_bytes);
  progress.end();
  if (train.docs() == 0)
    throw InputError("data.sources: empty dataset: no documents with text (files: " + std::to_string(sum.files) + ")");
  train.finish();
  valid.finish();
  sum.train_shards = train.commit();
  sum.valid_shards = valid.commit();
  folders.keep();
  remove_stale_shards(old_shards, sum);
  sum.train_docs = train.docs();
  sum.valid_docs = valid.docs();
  sum.train_tokens = train.tokens();
  sum.valid_tokens = valid.tokens();
  sum.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return sum;
}

}  // namespace deepen
