// UTF-8 repair, NFC through utf8proc on the runs that can change, and split-regex classes.
#include "data/unicode_text.h"

#include <cstdlib>
#include <memory>
#include <stdexcept>

#include <utf8proc.h>

namespace deepen {
namespace {

// Length of the well-formed sequence starting at s[i], or -(length of the maximal ill-formed
// subpart) (at least 1) when it is not well-formed. Table 3-7 of the Unicode standard.
int utf8_sequence(const unsigned char* p, size_t avail) {
  const unsigned char c = p[0];
  if (c < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c == 0xE0) { need = 2; lo = 0xA0; }
  else if (c >= 0xE1 && c <= 0xEC) need = 2;
  else if (c == 0xED) { need = 2; hi = 0x9F; }
  else if (c >= 0xEE && c <= 0xEF) need = 2;
  else if (c == 0xF0) { need = 3; lo = 0x90; }
  else if (c >= 0xF1 && c <= 0xF3) need = 3;
  else if (c == 0xF4) { need = 3; hi = 0x8F; }
  else return -1;  // 80..C1, F5..FF never start a character
  for (int k = 1; k <= need; ++k) {
    if (size_t(k) >= avail) return -k;  // truncated: the subpart read so far is one replacement
    const unsigned char b = p[k];
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return -k;
  }
  return need + 1;
}

// Code points that are NFC-stable on their own and a normalization boundary (canonical combining
// class 0, NFC_Quick_Check = Yes): nothing before or after them can recompose across them.
// Stable across Unicode versions by the normalization stability policy.
bool nfc_inert(char32_t cp) {
  return cp < 0x300 ||
         (cp >= 0x3041 && cp <= 0x3096) ||   // hiragana letters (U+3099/309A are not here)
         (cp >= 0x30A1 && cp <= 0x30FA) ||   // katakana letters
         (cp >= 0x3400 && cp <= 0x4DBF) ||   // CJK extension A
         (cp >= 0x4E00 && cp <= 0x9FFF) ||   // CJK unified ideographs (not the F900 compatibility ones)
         (cp >= 0xAC00 && cp <= 0xD7A3) ||   // precomposed Hangul syllables
         (cp >= 0x2010 && cp <= 0x2027) ||   // dashes, quotes, bullets, ellipsis
         (cp >= 0x3000 && cp <= 0x3029) ||   // CJK punctuation (U+302A.. are combining marks)
         (cp >= 0xFF01 && cp <= 0xFF60);     // fullwidth forms (compatibility only: NFC keeps them)
}

// Letters and digits of Unicode 15.1 and 16.0 (CJK extension I, Todhri, Garay, Tulu-Tigalari, Kirat
// Rai, Egyptian hieroglyphs extension A, ...). `tokenizers`' regex engine (Oniguruma) knows
// Unicode 16.0, the libutf8proc of Debian 12 (2.8) only 15.0, where these are unassigned (Cn).
// Found by comparing the class of every code point with `tokenizers` (the sweep in
// tests/tokenizer_reference.py keeps checking it); consulted only when utf8proc says Cn.
struct AddedRange {
  char32_t first, last;
  SplitClass cls;
};
constexpr AddedRange kUnicode16Additions[] = {
    {0x1C89, 0x1C8A, SplitClass::kLetter},   {0xA7CB, 0xA7CD, SplitClass::kLetter},
    {0xA7DA, 0xA7DC, SplitClass::kLetter},   {0x105C0, 0x105F3, SplitClass::kLetter},
    {0x10D40, 0x10D49, SplitClass::kNumber}, {0x10D4A, 0x10D65, SplitClass::kLetter},
    {0x10D6F, 0x10D85, SplitClass::kLetter}, {0x10EC2, 0x10EC4, SplitClass::kLetter},
    {0x11380, 0x11389, SplitClass::kLetter}, {0x1138B, 0x1138B, SplitClass::kLetter},
    {0x1138E, 0x1138E, SplitClass::kLetter}, {0x11390, 0x113B5, SplitClass::kLetter},
    {0x113B7, 0x113B7, SplitClass::kLetter}, {0x113D1, 0x113D1, SplitClass::kLetter},
    {0x113D3, 0x113D3, SplitClass::kLetter}, {0x116D0, 0x116E3, SplitClass::kNumber},
    {0x11BC0, 0x11BE0, SplitClass::kLetter}, {0x11BF0, 0x11BF9, SplitClass::kNumber},
    {0x13460, 0x143FA, SplitClass::kLetter}, {0x16100, 0x1611D, SplitClass::kLetter},
    {0x16130, 0x16139, SplitClass::kNumber}, {0x16D40, 0x16D6C, SplitClass::kLetter},
    {0x16D70, 0x16D79, SplitClass::kNumber}, {0x18CFF, 0x18CFF, SplitClass::kLetter},
    {0x1CCF0, 0x1CCF9, SplitClass::kNumber}, {0x1E5D0, 0x1E5ED, SplitClass::kLetter},
    {0x1E5F0, 0x1E5F0, SplitClass::kLetter}, {0x1E5F1, 0x1E5FA, SplitClass::kNumber},
    {0x2EBF0, 0x2EE5D, SplitClass::kLetter},
};

SplitClass class_of_unassigned(char32_t cp) {
  for (const AddedRange& r : kUnicode16Additions)
    if (cp >= r.first && cp <= r.last) return r.cls;
  return SplitClass::kOther;
}

void nfc_run(std::string_view run, std::string& out) {
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                          utf8proc_ssize_t(run.size()), &result,
                                          utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) throw std::runtime_error(std::string("utf8proc NFC failed: ") + utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(result, &std::free);
  out.append(reinterpret_cast<const char*>(result), size_t(n));
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    const int len = utf8_sequence(p + i, n - i);
    if (len < 0) return false;
    i += size_t(len);
  }
  return true;
}

std::string repair_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const int len = utf8_sequence(p + i, n - i);
    if (len > 0) {
      out.append(s.data() + i, size_t(len));
      i += size_t(len);
    } else {
      out.append("\xEF\xBF\xBD");
      i += size_t(-len);
    }
  }
  return out;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

void append_nfc(std::string_view s, std::string& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t copied = 0;     // s[0, copied) is already in out
  size_t prev = 0;       // start of the previous code point (a boundary when it is inert)
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) { prev = i; ++i; continue; }
    char32_t cp;
    int len = decode_utf8(p + i, cp);
    if (nfc_inert(cp)) { prev = i; i += size_t(len); continue; }
    // A run that may change starts at the boundary before it (the previous code point, which may
    // compose with what follows) and ends before the next inert code point.
    const size_t start = i > 0 ? prev : 0;
    size_t end = i + size_t(len);
    while (end < n) {
      char32_t c2;
      const int l2 = decode_utf8(p + end, c2);
      if (nfc_inert(c2)) break;
      end += size_t(l2);
    }
    out.append(s.data() + copied, start - copied);
    nfc_run(s.substr(start, end - start), out);
    copied = end;
    prev = end;
    i = end;
  }
  out.append(s.data() + copied, n - copied);
}

int unicode_category(char32_t cp) { return utf8proc_category(utf8proc_int32_t(cp)); }

SplitClass split_class(char32_t cp) {
  if (cp == '\r' || cp == '\n') return SplitClass::kNewline;
  if (cp == 0x09 || cp == 0x0B || cp == 0x0C || cp == 0x85) return SplitClass::kSpace;
  switch (utf8proc_category(utf8proc_int32_t(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
      return SplitClass::kLetter;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return SplitClass::kNumber;
    case UTF8PROC_CATEGORY_ZS: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP:
      return SplitClass::kSpace;
    case UTF8PROC_CATEGORY_CN:
      return class_of_unassigned(cp);
    default:
      return SplitClass::kOther;
  }
}

bool is_structural_text(std::string_view bytes) {
  if (bytes.empty() || !is_valid_utf8(bytes)) return false;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < bytes.size();) {
    char32_t cp;
    i += size_t(decode_utf8(p + i, cp));
    const SplitClass sc = split_class(cp);
    if (sc == SplitClass::kNewline || sc == SplitClass::kSpace) continue;
    switch (utf8proc_category(utf8proc_int32_t(cp))) {
      case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS:
      case UTF8PROC_CATEGORY_PE: case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF:
      case UTF8PROC_CATEGORY_PO: case UTF8PROC_CATEGORY_SM: case UTF8PROC_CATEGORY_SC:
      case UTF8PROC_CATEGORY_SK:
        continue;
      default:
        return false;
    }
  }
  return true;
}

}  // namespace deepen
