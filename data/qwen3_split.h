// The Qwen3 pre-tokenizer split, implemented by hand (no regex engine), with the exact semantics
// of the Oniguruma regex Hugging Face `tokenizers` runs (leftmost alternative wins, greedy with
// backtracking):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace deepen {

// One pre-token: bytes [begin, end) of the (NFC) text.
struct Piece {
  uint32_t begin;
  uint32_t end;
};

// Splits valid UTF-8 into pre-tokens; the pieces cover the text without gaps. Worked examples
// (pieces separated by |):
//   "I'M here"          -> I|'M| here            contraction, case-insensitive ('ſ counts as 's)
//   "don'tknow"         -> don|'t|know           a contraction splits even inside a word
//   "(hello world!)\n"  -> (hello| world|!)\n    one non-letter may lead a word; punctuation
//                                                 keeps trailing newlines
//   "x   y"             -> x|  | y               \s+(?!\S) leaves the last space to the word
//   "  \n  x"           -> "  \n"|" "|" x"       \s*[\r\n]+ stops at the last newline
//   "12345"             -> 1|2|3|4|5             digits one by one
//   "a  " (end)         -> a|"  "                trailing spaces stay together at the end
// `scratch` is reused between calls to avoid allocation.
void split_qwen3(std::string_view text, std::vector<Piece>& out, std::vector<uint32_t>& scratch);

}  // namespace deepen
