// Hand-written matcher for the Qwen3 split regex (see qwen3_split.h for the pattern and examples).
#include "data/qwen3_split.h"

#include "data/unicode_text.h"

namespace deepen {
namespace {

using C = SplitClass;

struct AsciiClasses {
  C cls[128];
  constexpr AsciiClasses() : cls{} {
    for (int c = 0; c < 128; ++c) {
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) cls[c] = C::kLetter;
      else if (c >= '0' && c <= '9') cls[c] = C::kNumber;
      else if (c == '\r' || c == '\n') cls[c] = C::kNewline;
      else if (c == ' ' || c == '\t' || c == 0x0B || c == 0x0C) cls[c] = C::kSpace;
      else cls[c] = C::kOther;
    }
  }
};
constexpr AsciiClasses kAscii;

// Lower-cased contraction letter for (?i:...): ASCII letters fold to themselves, and U+017F (long s)
// case-folds to 's' in Oniguruma's Unicode case folding; nothing else folds onto s t r e v m l d.
char fold_letter(char32_t cp) {
  if (cp < 128) return (cp >= 'A' && cp <= 'Z') ? char(cp + 32) : char(cp);
  if (cp == 0x17F) return 's';
  return 0;
}

// Length in code points of the contraction at i (cp[i] == '\''), or 0.
int contraction(const uint32_t* cp, size_t i, size_t n) {
  if (i + 1 >= n) return 0;
  const char a = fold_letter(cp[i + 1]);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= n) return 0;
  const char b = fold_letter(cp[i + 2]);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

}  // namespace

void split_qwen3(std::string_view text, std::vector<Piece>& out, std::vector<uint32_t>& scratch) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t nbytes = text.size();
  // Decode once: offsets, code points and classes of every code point (plus an end sentinel).
  scratch.resize(3 * (nbytes + 1));
  uint32_t* off = scratch.data();
  uint32_t* cp = off + (nbytes + 1);
  auto* cls = reinterpret_cast<C*>(cp + (nbytes + 1));
  size_t n = 0;
  for (size_t b = 0; b < nbytes;) {
    off[n] = uint32_t(b);
    if (p[b] < 0x80) {
      cp[n] = p[b];
      cls[n] = kAscii.cls[p[b]];
      ++b;
    } else {
      char32_t c;
      b += size_t(decode_utf8(p + b, c));
      cp[n] = c;
      cls[n] = split_class(c);
    }
    ++n;
  }
  off[n] = uint32_t(nbytes);

  auto emit = [&](size_t i, size_t j) { out.push_back(Piece{off[i], off[j]}); };
  auto is_ws = [&](size_t k) { return cls[k] == C::kNewline || cls[k] == C::kSpace; };

  size_t i = 0;
  while (i < n) {
    const C c = cls[i];
    // 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (cp[i] == '\'') {
      if (const int len = contraction(cp, i, n)) { emit(i, i + size_t(len)); i += size_t(len); continue; }
    }
    // 2. [^\r\n\p{L}\p{N}]?\p{L}+ : the optional lead is tried first, then no lead.
    size_t letters = n;  // where the letter run starts, if this alternative matches
    if (c == C::kLetter) letters = i;
    else if (c != C::kNewline && c != C::kNumber && i + 1 < n && cls[i + 1] == C::kLetter) letters = i + 1;
    if (letters != n) {
      size_t j = letters + 1;
      while (j < n && cls[j] == C::kLetter) ++j;
      emit(i, j);
      i = j;
      continue;
    }
    // 3. \p{N}
    if (c == C::kNumber) { emit(i, i + 1); ++i; continue; }
    // 4.  ?[^\s\p{L}\p{N}]+[\r\n]*
    size_t other = n;
    if (c == C::kOther) other = i;
    else if (cp[i] == ' ' && i + 1 < n && cls[i + 1] == C::kOther) other = i + 1;
    if (other != n) {
      size_t j = other + 1;
      while (j < n && cls[j] == C::kOther) ++j;
      while (j < n && cls[j] == C::kNewline) ++j;
      emit(i, j);
      i = j;
      continue;
    }
    // Whitespace from here on: r = end of the whitespace run.
    size_t r = i + 1;
    while (r < n && is_ws(r)) ++r;
    // 5. \s*[\r\n]+ : \s* backtracks to the last newline of the run.
    size_t last_nl = n;
    for (size_t k = r; k > i; --k) {
      if (cls[k - 1] == C::kNewline) { last_nl = k - 1; break; }
    }
    if (last_nl != n) { emit(i, last_nl + 1); i = last_nl + 1; continue; }
    // 6. \s+(?!\S) : the whole run at the end of text, else all but the last whitespace.
    if (r == n) { emit(i, r); i = r; continue; }
    if (r - i >= 2) { emit(i, r - 1); i = r - 1; continue; }
    // 7. \s+ : a single whitespace before a non-space that alternatives 2 and 4 did not take.
    emit(i, r);
    i = r;
  }
}

}  // namespace deepen
