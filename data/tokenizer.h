// Tokenizer interface (Qwen3 byte-level BPE or raw bytes), token classes for boundary diagnostics.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deepen {

// Token classes the boundary diagnostics group residual statistics by (DESIGN.md §1).
//   kFirst      position 0 of a sequence (positional: see classify_tokens)
//   kSpecial    a tokenizer special id (Qwen3: every added token, <|endoftext|> … </think>;
//               bytes: <|endoftext|>, <|bos|>, <|pad|>)
//   kStructural a token whose bytes decode to whitespace, newlines or punctuation only: every code
//               point is White_Space or in a Unicode category P* (punctuation) or Sm/Sc/Sk (math,
//               currency, modifier symbols such as + = $ ^ |). Emoji (So) are content.
//   kContent    the rest: letters, digits, emoji, and byte pieces that are not whole UTF-8 characters
enum class TokenClass : uint8_t { kFirst = 0, kSpecial = 1, kStructural = 2, kContent = 3 };
inline constexpr int kNumTokenClasses = 4;
const char* token_class_name(TokenClass c);  // "first" | "special" | "structural" | "content"

// All methods are const and safe to call from several threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Appends the ids of `text` to `out`. Text is bytes; invalid UTF-8 is read the way Python's
  // bytes.decode("utf-8", errors="replace") reads it (each maximal ill-formed subpart becomes
  // U+FFFD), so ids equal Hugging Face `tokenizers` on that decoded string. Special-token strings
  // in the text (e.g. "<|endoftext|>") become their ids, as in `tokenizers`' encode.
  virtual void encode_append(std::string_view text, std::vector<int32_t>& out) const = 0;
  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> out;
    encode_append(text, out);
    return out;
  }

  // Concatenated bytes of the tokens (special tokens included as their text). The exact bytes, not
  // a lossy UTF-8 repair. Throws InputError on an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Bytes of one token (same rules as decode).
  virtual std::string token_bytes(int32_t id) const = 0;

  // Number of ids the tokenizer can produce (Qwen3: 151,669 = 151,643 BPE + 26 added; bytes: 259).
  virtual int64_t vocab_size() const = 0;
  // Rows of the embedding/head a model for this tokenizer uses: the ids above vocab_size() are
  // padding no input ever holds. Qwen3: 151,936 (its checkpoints' vocab_size); bytes: vocab_size()
  // rounded up to a multiple of 64. The student's embedding takes this size unless
  // student.vocab_size is set; a teacher's head must have exactly this many rows.
  virtual int64_t padded_vocab_size() const = 0;
  // The document separator `deepen prep` writes after every document (Qwen3: <|endoftext|> =
  // 151643, the separator of Qwen3 pre-training; bytes: 256).
  virtual int32_t eos_id() const = 0;
  virtual bool is_special(int32_t id) const = 0;
  // kSpecial / kStructural / kContent of an id (never kFirst); O(1).
  virtual TokenClass token_class(int32_t id) const = 0;
  // Hash of the id -> bytes table. Shards record it so data tokenized by another tokenizer with
  // the same vocabulary size is refused.
  virtual uint64_t fingerprint() const = 0;
  // "bytes" or "qwen3" (for messages and metadata).
  virtual std::string name() const = 0;
};

// "bytes" | "qwen3:<path to tokenizer.json>". Throws InputError naming the spec or the file and
// the reason (missing file, not JSON, unsupported normalizer / pre-tokenizer / model).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

// Class of every position of one sequence: position 0 is kFirst, the rest token_class(id).
// Example (Qwen3): ids of "Hello, world\n" = [9707, 11, 1879, 198]
//   -> [first, structural (","), content (" world"), structural ("\n")]
std::vector<TokenClass> classify_tokens(const Tokenizer& tok, std::span<const int32_t> ids);

}  // namespace deepen
