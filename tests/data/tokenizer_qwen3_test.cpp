// Qwen3 tokenizer: ids equal Hugging Face `tokenizers` on >= 10 MB of varied text, decode, errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "data/qwen3_split.h"
#include "data/qwen3_tokenizer.h"
#include "data/tokenizer.h"
#include "tests/test_paths.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;

std::string qwen3_json() {
  if (const char* env = std::getenv("DEEPEN_QWEN3_TOKENIZER")) return env;
  return test::kQwen3Tokenizer;
}

const Tokenizer& qwen3() {
  static const std::unique_ptr<Tokenizer> tok = make_tokenizer("qwen3:" + qwen3_json());
  return *tok;
}

struct RefDoc {
  std::string name;
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;
};

// Runs tests/tokenizer_reference.py (HF `tokenizers`) and reads what it wrote.
std::vector<RefDoc> reference_docs() {
  std::string path;
  if (const char* env = std::getenv("DEEPEN_TOKENIZER_REF")) {
    path = env;  // a file made earlier by the script, to iterate quickly
  } else {
    const fs::path dir = fs::path(test::kBinaryDir) / "testdata";
    fs::create_directories(dir);
    path = (dir / "tokenizer_reference.bin").string();
    const std::string cmd = std::string(test::kPython) + " " + test::kSourceDir +
                            "/tests/tokenizer_reference.py --tokenizer " + qwen3_json() + " --out " + path;
    const int rc = std::system(cmd.c_str());
    if (rc != 0) throw std::runtime_error("reference script failed (rc " + std::to_string(rc) + "): " + cmd);
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string buf = ss.str();
  size_t pos = 0;
  auto take = [&](size_t n) {
    if (pos + n > buf.size()) throw std::runtime_error(path + ": truncated reference file");
    const char* p = buf.data() + pos;
    pos += n;
    return p;
  };
  auto u32 = [&] { uint32_t v; std::memcpy(&v, take(4), 4); return v; };
  auto u64 = [&] { uint64_t v; std::memcpy(&v, take(8), 8); return v; };
  if (std::string(take(8), 8) != "DPTKREF1") throw std::runtime_error(path + ": not a reference file");
  std::vector<RefDoc> docs(u32());
  for (RefDoc& d : docs) {
    const uint32_t nl = u32();
    d.name.assign(take(nl), nl);
    const uint64_t tl = u64();
    d.text.assign(take(tl), tl);
    d.ids.resize(u32());
    std::memcpy(d.ids.data(), take(d.ids.size() * 4), d.ids.size() * 4);
    const uint64_t dl = u64();
    d.decoded.assign(take(dl), dl);
  }
  return docs;
}

std::string show(std::span<const int32_t> ids, size_t from, size_t n) {
  std::string s;
  for (size_t i = from; i < std::min(ids.size(), from + n); ++i) s += std::to_string(ids[i]) + " ";
  return s;
}

TEST(Qwen3Tokenizer, IdsEqualHuggingFaceTokenizersOnTenMegabytesOfText) {
  const std::vector<RefDoc> docs = reference_docs();
  size_t bytes = 0, tokens = 0;
  for (const RefDoc& d : docs) bytes += d.text.size(), tokens += d.ids.size();
  EXPECT_GE(bytes, size_t(10'000'000)) << "the corpus must hold at least 10 MB";

  // Both cores, as prep uses them: also checks that encode is safe to call concurrently.
  std::vector<std::vector<int32_t>> ours(docs.size());
  std::vector<std::string> decoded(docs.size());
  std::vector<std::thread> threads;
  const unsigned nthreads = 2;
  for (unsigned t = 0; t < nthreads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < docs.size(); i += nthreads) {
        ours[i] = qwen3().encode(docs[i].text);
        decoded[i] = qwen3().decode(ours[i]);
      }
    });
  }
  for (auto& th : threads) th.join();

  size_t mismatched = 0, bad_decode = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    const RefDoc& d = docs[i];
    if (ours[i] != d.ids) {
      size_t k = 0;
      while (k < ours[i].size() && k < d.ids.size() && ours[i][k] == d.ids[k]) ++k;
      if (++mismatched <= 10)
        ADD_FAILURE() << d.name << ": ids differ at token " << k << " of " << d.ids.size() << "\n  hf:     "
                      << show(d.ids, k > 3 ? k - 3 : 0, 10) << "\n  deepen: " << show(ours[i], k > 3 ? k - 3 : 0, 10)
                      << "\n  text near there: " << ::testing::PrintToString(qwen3().decode(std::span(d.ids).subspan(
                                                         k > 3 ? k - 3 : 0, std::min<size_t>(10, d.ids.size() - (k > 3 ? k - 3 : 0)))));
    }
    if (decoded[i] != d.decoded && ++bad_decode <= 5) ADD_FAILURE() << d.name << ": decode differs";
  }
  EXPECT_EQ(mismatched, 0u) << "of " << docs.size() << " documents (" << bytes << " bytes, " << tokens << " tokens)";
  EXPECT_EQ(bad_decode, 0u);
  std::cout << "compared " << docs.size() << " documents, " << bytes << " bytes, " << tokens << " tokens\n";
}

TEST(Qwen3Tokenizer, KnownIdsAndSizes) {
  const Tokenizer& tok = qwen3();
  EXPECT_EQ(tok.vocab_size(), 151669);
  EXPECT_EQ(tok.padded_vocab_size(), 151936);
  EXPECT_EQ(tok.eos_id(), 151643);
  EXPECT_EQ(tok.encode("Hello, world\n"), (std::vector<int32_t>{9707, 11, 1879, 198}));
  EXPECT_EQ(tok.encode("<|im_start|>user"), (std::vector<int32_t>{151644, 872}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{9707, 11, 1879, 198, 151643}), "Hello, world\n<|endoftext|>");
}

TEST(Qwen3Tokenizer, TokenClassesForBoundaryDiagnostics) {
  const Tokenizer& tok = qwen3();
  const std::vector<int32_t> ids = tok.encode("Hello, world\n<|endoftext|> 42");
  const std::vector<TokenClass> cls = classify_tokens(tok, ids);
  ASSERT_EQ(ids.size(), 8u);  // Hello | , | ␣world | \n | <|endoftext|> | ␣ | 4 | 2
  EXPECT_EQ(cls[0], TokenClass::kFirst);
  EXPECT_EQ(cls[1], TokenClass::kStructural);
  EXPECT_EQ(cls[2], TokenClass::kContent);
  EXPECT_EQ(cls[3], TokenClass::kStructural);
  EXPECT_EQ(cls[4], TokenClass::kSpecial);
  EXPECT_EQ(cls[5], TokenClass::kStructural);
  EXPECT_EQ(cls[6], TokenClass::kContent);
  EXPECT_TRUE(tok.is_special(tok.eos_id()));
  EXPECT_FALSE(tok.is_special(ids[2]));
  EXPECT_EQ(tok.token_class(tok.encode("\n\n")[0]), TokenClass::kStructural);
  EXPECT_EQ(tok.token_class(tok.encode(" {")[0]), TokenClass::kStructural);
  EXPECT_EQ(tok.token_class(tok.encode("😀")[0]), TokenClass::kContent);  // a byte piece of the emoji
}

TEST(Qwen3Tokenizer, SplitFollowsTheRegexExamples) {
  auto split = [](std::string_view s) {
    std::vector<Piece> pieces;
    std::vector<uint32_t> scratch;
    split_qwen3(s, pieces, scratch);
    std::vector<std::string> out;
    for (const Piece& p : pieces) out.emplace_back(s.substr(p.begin, p.end - p.begin));
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(split("I'M here"), (V{"I", "'M", " here"}));
  EXPECT_EQ(split("don'tknow"), (V{"don", "'t", "know"}));
  EXPECT_EQ(split("(hello world!)\n"), (V{"(hello", " world", "!)\n"}));
  EXPECT_EQ(split("x   y"), (V{"x", "  ", " y"}));
  EXPECT_EQ(split("  \n  x"), (V{"  \n", " ", " x"}));
  EXPECT_EQ(split("12345"), (V{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(split("a  "), (V{"a", "  "}));
  EXPECT_EQ(split("'\xC5\xBFx"), (V{"'\xC5\xBF", "x"}));  // 'ſ is the contraction 's
}


// A small tokenizer.json with Qwen's pipeline and a vocabulary of our choosing: the 256 byte
// tokens, then `extra` tokens, merged by `merges` (left, right as raw bytes).
nlohmann::json tiny_tokenizer(const std::vector<std::string>& extra,
                              const std::vector<std::pair<std::string, std::string>>& merges) {
  // Qwen's pipeline sections, read once (the file is 7 MB).
  static const nlohmann::json base = [] {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(qwen3_json()));
    j["model"]["vocab"] = nlohmann::json::object();
    j["model"]["merges"] = nlohmann::json::array();
    return j;
  }();
  nlohmann::json real = base;
  auto level = [](const std::string& raw) {  // raw bytes -> byte-level string (GPT-2 alphabet)
    std::string out;
    for (unsigned char b : raw) {
      int n = 0;
      char32_t cp = b;
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      if (!printable) {
        for (int c = 0; c < b; ++c)
          if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) ++n;
        cp = 256 + char32_t(n);
      }
      if (cp < 0x80) out += char(cp);
      else { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
    }
    return out;
  };
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[level(std::string(1, char(b)))] = b;
  for (size_t k = 0; k < extra.size(); ++k) vocab[level(extra[k])] = 256 + k;
  nlohmann::json m = nlohmann::json::array();
  for (const auto& [a, b] : merges) m.push_back({level(a), level(b)});
  real["model"]["vocab"] = vocab;
  real["model"]["merges"] = m;
  real["added_tokens"] = nlohmann::json::array(
      {{{"id", 256 + extra.size()}, {"content", "<|endoftext|>"}, {"single_word", false}, {"lstrip", false},
        {"rstrip", false}, {"normalized", false}, {"special", true}}});
  return real;
}

std::unique_ptr<Tokenizer> load_json(const nlohmann::json& j, const std::string& name) {
  const fs::path dir = fs::path(test::kBinaryDir) / "testdata" / "tiny_tokenizers";
  fs::create_directories(dir);
  std::ofstream(dir / name) << j.dump();
  return make_tokenizer("qwen3:" + (dir / name).string());
}

std::string load_error(const nlohmann::json& j, const std::string& name) {
  return test::error_of([&] { load_json(j, name); });
}

TEST(Qwen3Tokenizer, MergesGoByRankThenLeftmost) {
  // ids: 256 "aa", 257 "bc", 258 "ab"; merge ranks: (b,c)=0, (a,a)=1, (a,b)=2.
  const auto tok = load_json(tiny_tokenizer({"aa", "bc", "ab"}, {{"b", "c"}, {"a", "a"}, {"a", "b"}}), "ranks.json");
  EXPECT_EQ(tok->encode("abc"), (std::vector<int32_t>{'a', 257}));       // (b,c) outranks (a,b)
  EXPECT_EQ(tok->encode("aaa"), (std::vector<int32_t>{256, 'a'}));       // equal ranks: leftmost first
  EXPECT_EQ(tok->encode("aab"), (std::vector<int32_t>{256, 'b'}));       // (a,a) before (a,b)
  EXPECT_EQ(tok->encode("ab<|endoftext|>"), (std::vector<int32_t>{258, 259}));
  const std::string long_word(5000, 'a');  // one pre-token longer than the scan limit: the heap path
  const std::vector<int32_t> ids = tok->encode(long_word);
  EXPECT_EQ(ids, std::vector<int32_t>(2500, 256));
}

TEST(Qwen3Tokenizer, InconsistentFilesNameTheFieldAndReason) {
  std::string e = load_error(tiny_tokenizer({"ab"}, {{"a", "c"}}), "bad_merge.json");
  EXPECT_NE(e.find("bad_merge.json: model.merges[0]: its result is not in the vocabulary"), std::string::npos) << e;
  nlohmann::json j = tiny_tokenizer({}, {});
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+";
  e = load_error(j, "regex.json");
  EXPECT_NE(e.find("regex.json: pre_tokenizer.pretokenizers[0].pattern.Regex: expected"), std::string::npos) << e;
  j = tiny_tokenizer({}, {});
  j["model"]["vocab"].erase("A");
  e = load_error(j, "no_byte.json");
  EXPECT_NE(e.find("no_byte.json: model.vocab: ids are not contiguous"), std::string::npos) << e;
  j = tiny_tokenizer({}, {});
  j["model"]["byte_fallback"] = true;
  e = load_error(j, "fallback.json");
  EXPECT_NE(e.find("fallback.json: model.byte_fallback: must be false"), std::string::npos) << e;
}

TEST(Qwen3Tokenizer, BadFilesAreInputErrorsNamingTheFile) {
  const fs::path dir = fs::path(test::kBinaryDir) / "testdata" / "bad_tokenizers";
  fs::create_directories(dir);
  auto error_of = [&](const std::string& name, const std::string& content) -> std::string {
    const fs::path p = dir / name;
    std::ofstream(p) << content;
    return test::error_of([&] { make_tokenizer("qwen3:" + p.string()); });
  };
  std::string e = error_of("not_json.json", "{ nope");
  EXPECT_NE(e.find("not_json.json"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  e = error_of("nfkc.json", R"({"normalizer": {"type": "NFKC"}})");
  EXPECT_NE(e.find("nfkc.json: normalizer.type"), std::string::npos) << e;
  try {
    make_tokenizer("qwen3:/nonexistent/tokenizer.json");
    ADD_FAILURE() << "no error";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("/nonexistent/tokenizer.json: cannot open"), std::string::npos) << err.what();
  }
  EXPECT_THROW(make_tokenizer("sentencepiece:x"), InputError);
  EXPECT_THROW(qwen3().decode(std::vector<int32_t>{151669}), InputError);
}

}  // namespace
}  // namespace deepen
