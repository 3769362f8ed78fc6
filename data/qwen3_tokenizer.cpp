// Qwen3 byte-level BPE: tokenizer.json loading and validation, added-token cutting, NFC, the split,
// rank-ordered merges (linear scan for short words, a heap for long ones), decode.
#include "data/qwen3_tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "config/hash.h"
#include "config/input_error.h"
#include "config/text_file.h"
#include "data/qwen3_split.h"
#include "data/unicode_text.h"

namespace deepen {
namespace {

using nlohmann::json;

constexpr const char* kQwenPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr uint64_t kNoMerge = ~uint64_t(0);
// Words longer than this merge with a heap (O(n log n)) instead of a linear scan per merge (O(n²)
// but with tiny constants): a run of 10,000 spaces is one pre-token.
constexpr size_t kHeapThreshold = 96;

// GPT-2's byte-level alphabet: bytes that are printable Latin-1 stand for themselves, the other 68
// bytes map to U+0100.. in byte order, so every token is a printable string in tokenizer.json.
std::array<char32_t, 256> byte_level_alphabet() {
  std::array<char32_t, 256> cps{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    cps[size_t(b)] = printable ? char32_t(b) : next++;
  }
  return cps;
}

// Pair (left id, right id) -> (rank << 32 | merged id); open addressing.
class MergeTable {
 public:
  void init(size_t count) {
    size_t cap = 1024;
    while (cap < count + count / 2) cap <<= 1;
    slots_.assign(cap, Slot{kNoMerge, kNoMerge});
    mask_ = cap - 1;
  }
  // Returns false when the pair is already there (a duplicate merge: the first rank wins, as in HF).
  bool insert(int32_t a, int32_t b, uint64_t val) {
    const uint64_t key = pack(a, b);
    for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return false;
      if (slots_[i].key == kNoMerge) {
        slots_[i] = Slot{key, val};
        return true;
      }
    }
  }
  uint64_t get(int32_t a, int32_t b) const {
    const uint64_t key = pack(a, b);
    for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return slots_[i].val;
      if (slots_[i].key == kNoMerge) return kNoMerge;
    }
  }

 private:
  struct Slot {
    uint64_t key, val;  // key and value side by side: one cache line per probe
  };
  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// tokenizer.json is 7 MB, almost all of it model.vocab (151,643 entries) and model.merges
// (151,387 pairs). A DOM of those (std::map nodes, one json per string) costs more than the rest of
// loading, so this SAX handler streams them into flat vectors and builds a DOM for everything else.
class TokenizerJsonReader final : public nlohmann::json_sax<json> {
 public:
  json root;
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool saw_vocab = false, saw_merges = false;
  std::string problem;  // structural problem inside vocab/merges ("" = none)

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override { return integer(v); }
  bool number_unsigned(number_unsigned_t v) override { return integer(int64_t(v)); }
  bool number_float(number_float_t v, const string_t&) override {
    if (mode_ != kNormal) return bad("a number where an id or a merge was expected");
    return value(json(v));
  }
  bool string(string_t& v) override {
    if (mode_ == kVocab) return bad("a string where a token id was expected");
    if (mode_ == kMerges) {
      if (depth_in_ == 1) {  // "left right" form
        const size_t sp = v.find(' ');
        if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos)
          return bad("merge " + std::to_string(merges.size()) + " is not \"left right\"");
        merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
        return true;
      }
      pair_.push_back(std::move(v));
      return true;
    }
    return value(json(std::move(v)));
  }
  bool binary(binary_t&) override { return bad("binary value"); }
  bool start_object(std::size_t) override {
    if (mode_ != kNormal) {
      if (mode_ == kVocab && depth_in_ == 0) { ++depth_in_; return true; }
      return bad("an object inside model.vocab or model.merges");
    }
    if (path_is("vocab")) { mode_ = kVocab; saw_vocab = true; depth_in_ = 0; return start_object(0); }
    return open(json::object());
  }
  bool key(string_t& k) override {
    key_ = std::move(k);  // in model.vocab: the token; elsewhere: where the next value goes
    return true;
  }
  bool end_object() override {
    if (mode_ == kVocab) { mode_ = kNormal; return true; }
    return close();
  }
  bool start_array(std::size_t) override {
    if (mode_ == kMerges) {
      if (depth_in_ != 1) return bad("nested arrays inside a merge");
      ++depth_in_;
      pair_.clear();
      return true;
    }
    if (mode_ == kVocab) return bad("an array inside model.vocab");
    if (path_is("merges")) { mode_ = kMerges; saw_merges = true; depth_in_ = 1; return true; }
    return open(json::array());
  }
  bool end_array() override {
    if (mode_ == kMerges) {
      if (depth_in_ == 2) {
        if (pair_.size() != 2) return bad("merge " + std::to_string(merges.size()) + " is not [left, right]");
        merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
        --depth_in_;
        return true;
      }
      mode_ = kNormal;
      return true;
    }
    return close();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw_error_ = e.what();
    return false;
  }
  const std::string& parse_error_message() const { return throw_error_; }

 private:
  enum Mode { kNormal, kVocab, kMerges };
  bool integer(int64_t v) {
    if (mode_ == kVocab) { vocab.emplace_back(std::move(key_), v); return true; }
    if (mode_ == kMerges) return bad("a number inside model.merges");
    return value(json(v));
  }
  bool bad(const std::string& why) {
    if (problem.empty()) problem = why;
    return false;
  }
  // The container being opened sits at model.<name>.
  bool path_is(const char* name) const {
    return stack_.size() == 2 && stack_[1].second == "model" && stack_.back().first->is_object() && key_ == name;
  }
  json* place(json v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    json& top = *stack_.back().first;
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    json& slot = top[key_];
    slot = std::move(v);
    return &slot;
  }
  bool value(json v) {
    place(std::move(v));
    return true;
  }
  bool open(json v) {
    const std::string k = stack_.empty() ? "" : (stack_.back().first->is_array() ? "[]" : key_);
    stack_.emplace_back(place(std::move(v)), k);
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  Mode mode_ = kNormal;
  int depth_in_ = 0;
  std::string key_;
  std::vector<std::string> pair_;
  std::vector<std::pair<json*, std::string>> stack_;  // open containers and the key each sits under
  std::string throw_error_;
};

// Merge results of words that are not a single vocabulary entry, shared by all threads. Striped
// locks keep two threads from contending; a full stripe is simply emptied (it is only a cache).
class WordCache {
 public:
  bool find(uint64_t h, std::string_view word, std::vector<int32_t>& out) {
    Stripe& s = stripes_[h % kStripes];
    std::lock_guard lk(s.mu);
    const auto it = s.map.find(h);
    if (it == s.map.end() || it->second.word != word) return false;
    out.insert(out.end(), it->second.ids.begin(), it->second.ids.end());
    return true;
  }
  void insert(uint64_t h, std::string_view word, std::span<const int32_t> ids) {
    Stripe& s = stripes_[h % kStripes];
    std::lock_guard lk(s.mu);
    if (s.map.size() >= kPerStripe) s.map.clear();
    Entry& e = s.map[h];
    e.word.assign(word);
    e.ids.assign(ids.begin(), ids.end());
  }

 private:
  static constexpr size_t kStripes = 64, kPerStripe = 4096;
  struct Entry {
    std::string word;
    std::vector<int32_t> ids;
  };
  struct Stripe {
    std::mutex mu;
    std::unordered_map<uint64_t, Entry> map;
  };
  std::array<Stripe, kStripes> stripes_;
};

// Checks of tokenizer.json's fields: each failure names the file, the field and what was expected.
class JsonCheck {
 public:
  explicit JsonCheck(const std::string& path) : path_(path) {}
  [[noreturn]] void fail(const std::string& where, const std::string& why) const {
    throw InputError(path_ + ": " + where + ": " + why);
  }
  const json& member(const json& j, const char* key, const std::string& where) const {
    if (!j.is_object() || !j.contains(key)) fail(where, std::string("missing \"") + key + "\"");
    return j.at(key);
  }
  void equals(const json& j, const std::string& want, const std::string& where) const {
    if (!j.is_string() || j.get<std::string>() != want)
      fail(where, "expected " + json(want).dump() + ", got " + j.dump().substr(0, 200) +
                      " (deepen implements the Qwen2/Qwen3 tokenizer configuration only)");
  }
  // An optional flag that must be absent, null or false.
  void is_false(const json& j, const char* key, const std::string& where) const {
    if (j.contains(key) && !j.at(key).is_null() && j.at(key) != false)
      fail(where + "." + key, "must be false, got " + j.at(key).dump());
  }
  // An optional string that must be absent, null or "".
  void is_empty(const json& j, const char* key, const std::string& where) const {
    if (j.contains(key) && !j.at(key).is_null() && j.at(key) != "")
      fail(where + "." + key, "must be empty, got " + j.at(key).dump());
  }

 private:
  const std::string& path_;
};

// Parses tokenizer.json into `reader` (vocab and merges streamed, the rest as a DOM).
void parse_tokenizer_json(const std::string& text, TokenizerJsonReader& reader, const JsonCheck& check) {
  bool parsed = false;
  try {
    parsed = json::sax_parse(text, &reader);
  } catch (const json::exception& e) {
    check.fail("file", std::string("not valid JSON: ") + e.what());
  }
  if (!reader.problem.empty()) check.fail(reader.saw_merges ? "model.merges" : "model.vocab", reader.problem);
  if (!parsed) check.fail("file", "not valid JSON: " + reader.parse_error_message());
}

// Normalizer, pre-tokenizer, decoder and the BPE model's flags: exactly Qwen's, or an error naming
// the field (another configuration would tokenize differently without saying so).
void check_qwen_configuration(const json& doc, const JsonCheck& check) {
  const json& norm = check.member(doc, "normalizer", "normalizer");
  check.equals(check.member(norm, "type", "normalizer"), "NFC", "normalizer.type");
  const json& pre = check.member(doc, "pre_tokenizer", "pre_tokenizer");
  check.equals(check.member(pre, "type", "pre_tokenizer"), "Sequence", "pre_tokenizer.type");
  const json& seq = check.member(pre, "pretokenizers", "pre_tokenizer");
  if (!seq.is_array() || seq.size() != 2) check.fail("pre_tokenizer.pretokenizers", "expected [Split, ByteLevel]");
  check.equals(check.member(seq[0], "type", "pre_tokenizer.pretokenizers[0]"), "Split", "pre_tokenizer.pretokenizers[0].type");
  check.equals(check.member(check.member(seq[0], "pattern", "pre_tokenizer.pretokenizers[0]"), "Regex",
                            "pre_tokenizer.pretokenizers[0].pattern"),
               kQwenPattern, "pre_tokenizer.pretokenizers[0].pattern.Regex");
  check.equals(check.member(seq[0], "behavior", "pre_tokenizer.pretokenizers[0]"), "Isolated",
               "pre_tokenizer.pretokenizers[0].behavior");
  check.is_false(seq[0], "invert", "pre_tokenizer.pretokenizers[0]");
  check.equals(check.member(seq[1], "type", "pre_tokenizer.pretokenizers[1]"), "ByteLevel", "pre_tokenizer.pretokenizers[1].type");
  check.is_false(seq[1], "add_prefix_space", "pre_tokenizer.pretokenizers[1]");
  check.is_false(seq[1], "use_regex", "pre_tokenizer.pretokenizers[1]");
  if (doc.contains("decoder") && !doc["decoder"].is_null())
    check.equals(check.member(doc["decoder"], "type", "decoder"), "ByteLevel", "decoder.type");

  const json& model = check.member(doc, "model", "model");
  check.equals(check.member(model, "type", "model"), "BPE", "model.type");
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0.0)
    check.fail("model.dropout", "must be null, got " + model["dropout"].dump());
  check.is_false(model, "byte_fallback", "model");
  check.is_false(model, "ignore_merges", "model");
  check.is_empty(model, "continuing_subword_prefix", "model");
  check.is_empty(model, "end_of_word_suffix", "model");
}

// tokenizer.json's strings back to raw bytes, through the inverse of byte_level_alphabet.
// Example: "Ġthe" -> " the" (U+0120 stands for the space byte 0x20).
class ByteLevelDecoder {
 public:
  ByteLevelDecoder() {
    const std::array<char32_t, 256> alphabet = byte_level_alphabet();
    byte_of_cp_.fill(-1);
    for (int b = 0; b < 256; ++b) byte_of_cp_[alphabet[size_t(b)]] = b;
  }
  // False when `in` holds a character outside the alphabet.
  bool to_raw(const std::string& in, std::string& raw) const {
    raw.clear();
    const auto* p = reinterpret_cast<const unsigned char*>(in.data());
    for (size_t i = 0; i < in.size();) {
      char32_t cp;
      i += size_t(decode_utf8(p + i, cp));
      if (cp >= byte_of_cp_.size() || byte_of_cp_[cp] < 0) return false;
      raw.push_back(char(byte_of_cp_[cp]));
    }
    return true;
  }

 private:
  std::array<int, 512> byte_of_cp_;
};

// Bytes of every token id, filled from model.vocab and then added_tokens: an id out of range or
// given twice is an error where it is given, a gap in the ids an error of the section that left it.
class IdBytes {
 public:
  explicit IdBytes(const JsonCheck& check) : check_(check) {}
  void assign(int64_t id, std::string b, const std::string& where) {
    if (id < 0 || id > 100'000'000) check_.fail(where, "id " + std::to_string(id) + " out of range");
    if (size_t(id) >= bytes.size()) {
      bytes.resize(size_t(id) + 1);
      seen_.resize(size_t(id) + 1, false);
    }
    if (seen_[size_t(id)]) check_.fail(where, "id " + std::to_string(id) + " is used twice");
    seen_[size_t(id)] = true;
    bytes[size_t(id)] = std::move(b);
  }
  void check_contiguous(const std::string& where) const {
    for (size_t id = 0; id < bytes.size(); ++id)
      if (!seen_[id]) check_.fail(where, "ids are not contiguous: " + std::to_string(id) + " is missing");
  }
  std::vector<std::string> bytes;

 private:
  std::vector<bool> seen_;
  const JsonCheck& check_;
};

// model.vocab: each byte-level string as raw bytes under its id.
void read_vocab(const TokenizerJsonReader& reader, const ByteLevelDecoder& byte_level, IdBytes& ids,
                const JsonCheck& check) {
  if (!reader.saw_vocab || reader.vocab.empty()) check.fail("model.vocab", "missing or empty");
  std::string raw;
  for (const auto& [str, id] : reader.vocab) {
    const std::string where = "model.vocab[" + json(str).dump() + "]";
    if (!byte_level.to_raw(str, raw)) check.fail(where, "character outside the byte-level alphabet");
    ids.assign(id, raw, where);
  }
  ids.check_contiguous("model.vocab");
}

class Qwen3Tokenizer final : public Tokenizer {
 public:
  explicit Qwen3Tokenizer(const std::string& path) : path_(path) { load(read_file_text(path, "tokenizer file")); }

  void encode_append(std::string_view text, std::vector<int32_t>& out) const override;
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (int32_t id : ids) s += bytes_of(id);
    return s;
  }
  std::string token_bytes(int32_t id) const override { return std::string(bytes_of(id)); }
  int64_t vocab_size() const override { return int64_t(classes_.size()); }
  int64_t padded_vocab_size() const override { return std::max<int64_t>(kQwen3PaddedVocab, vocab_size()); }
  int32_t eos_id() const override { return eos_; }
  bool is_special(int32_t id) const override { return token_class(id) == TokenClass::kSpecial; }
  TokenClass token_class(int32_t id) const override {
    check_id(id);
    return classes_[size_t(id)];
  }
  uint64_t fingerprint() const override { return fingerprint_; }
  std::string name() const override { return "qwen3"; }

 private:
  struct Added {
    std::string text;
    int32_t id;
  };
  struct Work {  // per-call buffers
    std::string normalized;
    std::vector<Piece> pieces;
    std::vector<uint32_t> scratch;
    std::vector<int32_t> syms;
    std::vector<uint64_t> pairs;
  };

  void load(const std::string& text);
  // load's steps after the vocabulary, in order.
  void read_added_tokens(const json& doc, size_t num_bpe, IdBytes& ids, const JsonCheck& check);
  uint64_t build_id_tables(const std::vector<std::string>& bytes, size_t num_bpe, const JsonCheck& check);
  uint64_t read_merges(const TokenizerJsonReader& reader, const ByteLevelDecoder& byte_level, const JsonCheck& check);
  void check_id(int32_t id) const {
    if (id < 0 || size_t(id) >= classes_.size())
      throw InputError("token id " + std::to_string(id) + " is outside the Qwen3 vocabulary [0, " +
                       std::to_string(classes_.size()) + ")");
  }
  std::string_view bytes_of(int32_t id) const {
    check_id(id);
    return std::string_view(pool_).substr(offsets_[size_t(id)], offsets_[size_t(id) + 1] - offsets_[size_t(id)]);
  }
  int32_t find_word(std::string_view w) const { return find_word(w, hash64(w)); }
  int32_t find_word(std::string_view w, uint64_t h) const {
    const uint32_t tag = uint32_t(h >> 32);
    for (size_t i = h & word_mask_;; i = (i + 1) & word_mask_) {
      const WordSlot& slot = words_[i];
      if (slot.id < 0) return -1;
      if (slot.tag == tag && slot.len == w.size() && std::memcmp(pool_.data() + slot.offset, w.data(), w.size()) == 0)
        return slot.id;
    }
  }
  std::string_view bytes_of_unchecked(int32_t id) const {
    return std::string_view(pool_).substr(offsets_[size_t(id)], offsets_[size_t(id) + 1] - offsets_[size_t(id)]);
  }
  void encode_segment(std::string_view s, std::vector<int32_t>& out, Work& w) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out, Work& w) const;
  void merge_scan(std::string_view word, std::vector<int32_t>& out, Work& w) const;
  void merge_heap(std::string_view word, std::vector<int32_t>& out) const;

  std::string path_;
  std::string pool_;               // bytes of every id, back to back
  std::vector<uint32_t> offsets_;  // id -> [offsets_[id], offsets_[id+1]) in pool_
  std::vector<TokenClass> classes_;
  std::array<int32_t, 256> byte_ids_{};
  MergeTable merges_;
  // bytes -> BPE id (not the added tokens), open addressing.
  // One 16-byte slot per probe: a lookup touches the slot and the token's bytes, nothing else.
  struct WordSlot {
    uint32_t tag = 0;  // high half of the hash
    int32_t id = -1;   // -1 = empty
    uint32_t offset = 0, len = 0;
  };
  std::vector<WordSlot> words_;
  size_t word_mask_ = 0;
  // Per BPE id: 0 = not known yet, 1 = merging its own bytes gives exactly this id, 2 = it does not.
  // Lets a pre-token that is a whole vocabulary entry (most are) skip the merge loop. Written
  // racily but idempotently (every thread computes the same value).
  std::unique_ptr<std::atomic<uint8_t>[]> whole_;
  mutable std::unique_ptr<WordCache> cache_ = std::make_unique<WordCache>();
  std::vector<Added> added_;
  std::array<std::vector<int32_t>, 256> added_by_first_byte_;  // indices into added_, longest first
  int32_t eos_ = -1;
  uint64_t fingerprint_ = 0;
};

void Qwen3Tokenizer::load(const std::string& text) {
  const JsonCheck check(path_);
  TokenizerJsonReader reader;
  parse_tokenizer_json(text, reader, check);
  check_qwen_configuration(reader.root, check);
  const ByteLevelDecoder byte_level;
  IdBytes ids(check);
  read_vocab(reader, byte_level, ids, check);
  const size_t num_bpe = ids.bytes.size();
  read_added_tokens(reader.root, num_bpe, ids, check);
  const uint64_t fp = build_id_tables(ids.bytes, num_bpe, check);
  const uint64_t merges_fp = read_merges(reader, byte_level, check);
  whole_ = std::make_unique<std::atomic<uint8_t>[]>(num_bpe);
  for (size_t id = 0; id < num_bpe; ++id) whole_[id].store(0, std::memory_order_relaxed);
  fingerprint_ = mix64(fp ^ merges_fp);
}

// Added tokens: matched in the raw text before anything else, leftmost-longest; the ids past the
// BPE vocabulary get their bytes here, and one of them must be <|endoftext|>.
void Qwen3Tokenizer::read_added_tokens(const json& doc, size_t num_bpe, IdBytes& ids, const JsonCheck& check) {
  const json& added = check.member(doc, "added_tokens", "added_tokens");
  for (size_t k = 0; k < added.size(); ++k) {
    const std::string where = "added_tokens[" + std::to_string(k) + "]";
    const json& a = added[k];
    const std::string content = check.member(a, "content", where).get<std::string>();
    const int64_t id = check.member(a, "id", where).get<int64_t>();
    for (const char* key : {"lstrip", "rstrip", "single_word", "normalized"}) check.is_false(a, key, where);
    if (content.empty()) check.fail(where, "empty content");
    if (size_t(id) < num_bpe) {
      if (ids.bytes[size_t(id)] != content) check.fail(where, "id " + std::to_string(id) + " already names another token");
    } else {
      ids.assign(id, content, where);
    }
    added_.push_back({content, int32_t(id)});
  }
  ids.check_contiguous("added_tokens");
  std::vector<int32_t> order(added_.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = int32_t(k);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return added_[size_t(a)].text.size() > added_[size_t(b)].text.size(); });
  for (int32_t k : order) added_by_first_byte_[uint8_t(added_[size_t(k)].text[0])].push_back(k);
  for (const Added& a : added_)
    if (a.text == "<|endoftext|>") eos_ = a.id;
  if (eos_ < 0) check.fail("added_tokens", "no <|endoftext|> token (deepen's document separator)");
}

// Id -> bytes pool, classes, the word table over the BPE entries and the 256 byte tokens; returns
// the fingerprint of the ids' bytes.
uint64_t Qwen3Tokenizer::build_id_tables(const std::vector<std::string>& bytes, size_t num_bpe, const JsonCheck& check) {
  offsets_.reserve(bytes.size() + 1);
  offsets_.push_back(0);
  uint64_t fp = hash64("qwen3-bpe");
  for (size_t id = 0; id < bytes.size(); ++id) {
    pool_ += bytes[id];
    offsets_.push_back(uint32_t(pool_.size()));
    fp = mix64(fp ^ hash64(bytes[id], id));
  }
  classes_.resize(bytes.size());
  for (size_t id = 0; id < bytes.size(); ++id)
    classes_[id] = id >= num_bpe ? TokenClass::kSpecial
                   : is_structural_text(bytes[id]) ? TokenClass::kStructural
                                                   : TokenClass::kContent;
  for (const Added& a : added_) classes_[size_t(a.id)] = TokenClass::kSpecial;

  size_t cap = 1024;
  while (cap < num_bpe + num_bpe / 2) cap <<= 1;  // load <= 2/3: short probes, 4 MB for Qwen3
  words_.assign(cap, WordSlot{});
  word_mask_ = cap - 1;
  for (size_t id = 0; id < num_bpe; ++id) {
    const uint64_t h = hash64(bytes[id]);
    size_t i = h & word_mask_;
    while (words_[i].id >= 0) i = (i + 1) & word_mask_;
    words_[i] = WordSlot{uint32_t(h >> 32), int32_t(id), offsets_[id], uint32_t(bytes[id].size())};
  }
  byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    const int32_t id = find_word(std::string(1, char(b)));
    if (id < 0) check.fail("model.vocab", "byte " + std::to_string(b) + " has no token (byte-level BPE needs all 256)");
    byte_ids_[size_t(b)] = id;
  }
  return fp;
}

// Merges: rank = position in the list. Returns their fingerprint.
uint64_t Qwen3Tokenizer::read_merges(const TokenizerJsonReader& reader, const ByteLevelDecoder& byte_level,
                                     const JsonCheck& check) {
  if (!reader.saw_merges) check.fail("model.merges", "missing");
  merges_.init(reader.merges.size());
  std::string ra, rb;
  uint64_t merges_fp = hash64("merges");
  for (size_t r = 0; r < reader.merges.size(); ++r) {
    const auto where = [r] { return "model.merges[" + std::to_string(r) + "]"; };  // only for an error
    if (!byte_level.to_raw(reader.merges[r].first, ra) || !byte_level.to_raw(reader.merges[r].second, rb))
      check.fail(where(), "character outside the byte-level alphabet");
    const int32_t ia = find_word(ra), ib = find_word(rb);
    ra += rb;
    const int32_t im = find_word(ra);
    if (ia < 0 || ib < 0) check.fail(where(), "merges a token that is not in the vocabulary");
    if (im < 0) check.fail(where(), "its result is not in the vocabulary");
    merges_.insert(ia, ib, (uint64_t(r) << 32) | uint32_t(im));
    merges_fp = mix64(merges_fp ^ ((uint64_t(uint32_t(ia)) << 32) | uint32_t(ib)));
  }
  return merges_fp;
}

void Qwen3Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = repair_utf8(text);
    text = repaired;
  }
  Work w;
  out.reserve(out.size() + text.size() / 3);
  // Added tokens first, leftmost-longest (all of Qwen's start with '<').
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t seg = 0;
  for (size_t i = 0; i < text.size();) {
    const auto& cands = added_by_first_byte_[p[i]];
    bool matched = false;
    for (int32_t k : cands) {
      const std::string& t = added_[size_t(k)].text;
      if (text.compare(i, t.size(), t) == 0) {
        encode_segment(text.substr(seg, i - seg), out, w);
        out.push_back(added_[size_t(k)].id);
        i += t.size();
        seg = i;
        matched = true;
        break;
      }
    }
    if (!matched) ++i;
  }
  encode_segment(text.substr(seg), out, w);
}

void Qwen3Tokenizer::encode_segment(std::string_view s, std::vector<int32_t>& out, Work& w) const {
  if (s.empty()) return;
  bool ascii = true;
  for (unsigned char c : s) {
    if (c >= 0x80) { ascii = false; break; }
  }
  if (!ascii) {
    w.normalized.clear();
    append_nfc(s, w.normalized);
    s = w.normalized;
  }
  w.pieces.clear();
  split_qwen3(s, w.pieces, w.scratch);
  for (const Piece& pc : w.pieces) encode_word(s.substr(pc.begin, pc.end - pc.begin), out, w);
}

void Qwen3Tokenizer::encode_word(std::string_view word, std::vector<int32_t>& out, Work& w) const {
  if (word.size() == 1) {
    out.push_back(byte_ids_[uint8_t(word[0])]);
    return;
  }
  const uint64_t h = hash64(word);
  const int32_t id = find_word(word, h);
  if (id >= 0) {
    const uint8_t state = whole_[size_t(id)].load(std::memory_order_relaxed);
    if (state == 1) {
      out.push_back(id);
      return;
    }
    if (state == 0) {
      const size_t before = out.size();
      merge_scan(word, out, w);
      const bool whole = out.size() == before + 1 && out.back() == id;
      whole_[size_t(id)].store(whole ? 1 : 2, std::memory_order_relaxed);
      return;
    }
  }
  if (cache_->find(h, word, out)) return;
  const size_t before = out.size();
  if (word.size() > kHeapThreshold) merge_heap(word, out);
  else merge_scan(word, out, w);
  cache_->insert(h, word, std::span(out).subspan(before));
}

// Short words: pairs[k] = rank<<32 | merged id of (syms[k], syms[k+1]); the smallest value is the
// lowest rank, and the first occurrence of it the leftmost such pair, as in `tokenizers`.
void Qwen3Tokenizer::merge_scan(std::string_view word, std::vector<int32_t>& out, Work& w) const {
  if (word.size() > kHeapThreshold) {
    merge_heap(word, out);
    return;
  }
  auto& syms = w.syms;
  auto& pairs = w.pairs;
  size_t m = word.size();
  syms.resize(m);
  for (size_t k = 0; k < m; ++k) syms[k] = byte_ids_[uint8_t(word[k])];
  pairs.resize(m);
  for (size_t k = 0; k + 1 < m; ++k) pairs[k] = merges_.get(syms[k], syms[k + 1]);
  while (m > 1) {
    size_t best = 0;
    for (size_t k = 1; k + 1 < m; ++k)
      if (pairs[k] < pairs[best]) best = k;
    if (pairs[best] == kNoMerge) break;
    syms[best] = int32_t(uint32_t(pairs[best]));
    std::copy(syms.begin() + long(best) + 2, syms.begin() + long(m), syms.begin() + long(best) + 1);
    std::copy(pairs.begin() + long(best) + 1, pairs.begin() + long(m) - 1, pairs.begin() + long(best));
    --m;
    if (best > 0) pairs[best - 1] = merges_.get(syms[best - 1], syms[best]);
    if (best + 1 < m) pairs[best] = merges_.get(syms[best], syms[best + 1]);
  }
  out.insert(out.end(), syms.begin(), syms.begin() + long(m));
}

// Long words: the `tokenizers` algorithm: a min-heap of (rank, position) over a linked list of
// symbols; stale entries are skipped when popped.
void Qwen3Tokenizer::merge_heap(std::string_view word, std::vector<int32_t>& out) const {
  const size_t n = word.size();
  std::vector<int32_t> id(n), prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t k = 0; k < n; ++k) {
    id[k] = byte_ids_[uint8_t(word[k])];
    prev[k] = int32_t(k) - 1;
    next[k] = k + 1 < n ? int32_t(k + 1) : -1;
  }
  struct Entry {
    uint64_t rank_pos;  // rank << 32 | position: smallest first
    int32_t merged;
    bool operator>(const Entry& o) const { return rank_pos > o.rank_pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int32_t pos) {
    const int32_t nx = next[size_t(pos)];
    if (nx < 0) return;
    const uint64_t v = merges_.get(id[size_t(pos)], id[size_t(nx)]);
    if (v != kNoMerge) heap.push({(v & ~uint64_t(0xFFFFFFFF)) | uint32_t(pos), int32_t(uint32_t(v))});
  };
  for (size_t k = 0; k + 1 < n; ++k) push(int32_t(k));
  while (!heap.empty()) {
    const Entry e = heap.top();
    heap.pop();
    const int32_t pos = int32_t(uint32_t(e.rank_pos));
    if (!alive[size_t(pos)]) continue;
    const int32_t nx = next[size_t(pos)];
    if (nx < 0) continue;
    const uint64_t v = merges_.get(id[size_t(pos)], id[size_t(nx)]);
    if (v == kNoMerge || int32_t(uint32_t(v)) != e.merged || (v >> 32) != (e.rank_pos >> 32)) continue;
    id[size_t(pos)] = e.merged;
    alive[size_t(nx)] = false;
    next[size_t(pos)] = next[size_t(nx)];
    if (next[size_t(pos)] >= 0) prev[size_t(next[size_t(pos)])] = pos;
    if (prev[size_t(pos)] >= 0) push(prev[size_t(pos)]);
    push(pos);
  }
  for (int32_t k = 0; k >= 0; k = next[size_t(k)]) out.push_back(id[size_t(k)]);
}

}  // namespace

std::unique_ptr<Tokenizer> load_qwen3_tokenizer(const std::string& path) {
  return std::make_unique<Qwen3Tokenizer>(path);
}

}  // namespace deepen
