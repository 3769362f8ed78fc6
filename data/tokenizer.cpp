// make_tokenizer, the byte tokenizer (256 byte ids + 3 specials) and sequence classification.
#include "data/tokenizer.h"

#include <array>

#include "config/hash.h"
#include "config/input_error.h"
#include "data/qwen3_tokenizer.h"
#include "data/unicode_text.h"

namespace deepen {
namespace {

// Ids 0..255 are the bytes themselves; 256.. are the specials, whose text in the input is read as
// the special id (as the Qwen3 tokenizer does with its added tokens).
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr std::array<const char*, 3> kSpecials = {"<|endoftext|>", "<|bos|>", "<|pad|>"};

  void encode_append(std::string_view text, std::vector<int32_t>& out) const override {
    out.reserve(out.size() + text.size());
    for (size_t i = 0; i < text.size();) {
      if (text[i] == '<') {
        bool matched = false;
        for (size_t k = 0; k < kSpecials.size(); ++k) {
          const std::string_view s = kSpecials[k];
          if (text.substr(i, s.size()) == s) {
            out.push_back(int32_t(256 + k));
            i += s.size();
            matched = true;
            break;
          }
        }
        if (matched) continue;
      }
      out.push_back(int32_t(uint8_t(text[i])));
      ++i;
    }
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    s.reserve(ids.size());
    for (int32_t id : ids) s += token_bytes(id);
    return s;
  }
  std::string token_bytes(int32_t id) const override {
    check(id);
    if (id < 256) return std::string(1, char(id));
    return kSpecials[size_t(id - 256)];
  }
  int64_t vocab_size() const override { return 256 + int64_t(kSpecials.size()); }
  int64_t padded_vocab_size() const override { return (vocab_size() + 63) / 64 * 64; }
  int32_t eos_id() const override { return 256; }
  bool is_special(int32_t id) const override {
    check(id);
    return id >= 256;
  }
  TokenClass token_class(int32_t id) const override {
    if (is_special(id)) return TokenClass::kSpecial;
    return is_structural_text(std::string(1, char(id))) ? TokenClass::kStructural : TokenClass::kContent;
  }
  uint64_t fingerprint() const override { return hash64("deepen-bytes-v1:<|endoftext|><|bos|><|pad|>"); }
  std::string name() const override { return "bytes"; }

 private:
  void check(int32_t id) const {
    if (id < 0 || id >= vocab_size())
      throw InputError("token id " + std::to_string(id) + " is outside the byte vocabulary [0, " +
                       std::to_string(vocab_size()) + ")");
  }
};

}  // namespace

const char* token_class_name(TokenClass c) {
  switch (c) {
    case TokenClass::kFirst: return "first";
    case TokenClass::kSpecial: return "special";
    case TokenClass::kStructural: return "structural";
    case TokenClass::kContent: return "content";
  }
  return "?";
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  if (spec == "bytes") return std::make_unique<ByteTokenizer>();
  const std::string prefix = "qwen3:";
  if (spec.rfind(prefix, 0) == 0) {
    const std::string path = spec.substr(prefix.size());
    if (path.empty()) throw InputError("tokenizer \"" + spec + "\": missing the path to tokenizer.json");
    return load_qwen3_tokenizer(path);
  }
  throw InputError("tokenizer \"" + spec + "\": expected \"bytes\" or \"qwen3:<path to tokenizer.json>\"");
}

std::vector<TokenClass> classify_tokens(const Tokenizer& tok, std::span<const int32_t> ids) {
  std::vector<TokenClass> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) out[i] = i == 0 ? TokenClass::kFirst : tok.token_class(ids[i]);
  return out;
}

}  // namespace deepen
