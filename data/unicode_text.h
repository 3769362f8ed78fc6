// UTF-8 and Unicode pieces the tokenizers need: Python-compatible repair of invalid UTF-8, fast NFC
// (utf8proc), and the code point classes of the Qwen3 split regex.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace deepen {

// True when `s` is well-formed UTF-8 (Unicode Table 3-7: no overlongs, surrogates or > U+10FFFF).
bool is_valid_utf8(std::string_view s);

// Replaces each maximal ill-formed subpart by U+FFFD, exactly as CPython's
// bytes.decode("utf-8", errors="replace") does. Examples:
//   "a\xE2\x82" -> "a\uFFFD"            (truncated 3-byte sequence: one replacement)
//   "\xF0\x80"  -> "\uFFFD\uFFFD"        (F0 needs 90..BF next: two)
//   "\xED\xA0\x80" -> 3 x "\uFFFD"       (a UTF-16 surrogate is not UTF-8)
//   "\xC0\xAF"  -> 2 x "\uFFFD"          (overlong)
std::string repair_utf8(std::string_view s);

// Appends the NFC form of valid UTF-8 `s` to `out`. Only runs that can change are handed to
// utf8proc: a code point below U+0300 (or a CJK ideograph, kana or Hangul syllable) is a
// normalization boundary and NFC-stable, so text made of them is copied as it is.
void append_nfc(std::string_view s, std::string& out);

// Decodes the code point at p (valid UTF-8); returns its length in bytes.
inline int decode_utf8(const unsigned char* p, char32_t& cp) {
  const unsigned char c = p[0];
  if (c < 0x80) { cp = c; return 1; }
  if (c < 0xE0) { cp = (char32_t(c & 0x1F) << 6) | (p[1] & 0x3F); return 2; }
  if (c < 0xF0) { cp = (char32_t(c & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F); return 3; }
  cp = (char32_t(c & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
  return 4;
}

void append_utf8(char32_t cp, std::string& out);

// Classes of the Qwen3 split regex (Oniguruma semantics, as Hugging Face `tokenizers` runs it):
//   kLetter   \p{L}  = Lu Ll Lt Lm Lo
//   kNumber   \p{N}  = Nd Nl No
//   kNewline  \r or \n (also \s)
//   kSpace    the rest of \s: U+0009, U+000B, U+000C, U+0085 and categories Zs, Zl, Zp
//   kOther    everything else (punctuation, symbols, marks, controls, unassigned)
enum class SplitClass : uint8_t { kLetter, kNumber, kNewline, kSpace, kOther };
SplitClass split_class(char32_t cp);

// General category of a code point as utf8proc reports it (UTF8PROC_CATEGORY_*).
int unicode_category(char32_t cp);

// True when `bytes` is non-empty, valid UTF-8 and every code point is White_Space or punctuation
// (P*) or a math/currency/modifier symbol (Sm, Sc, Sk): the `structural` token class.
bool is_structural_text(std::string_view bytes);

}  // namespace deepen
