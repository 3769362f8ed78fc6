// Byte tokenizer (256 byte ids + 3 specials) and the `deepen tokenize` command on both tokenizers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/input_error.h"
#include "data/tokenizer.h"
#include "tests/test_paths.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;

TEST(ByteTokenizer, EveryByteStringRoundTrips) {
  const auto tok = make_tokenizer("bytes");
  EXPECT_EQ(tok->vocab_size(), 259);
  EXPECT_EQ(tok->padded_vocab_size(), 320);
  EXPECT_EQ(tok->eos_id(), 256);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(char(b));
  const std::vector<int32_t> ids = tok->encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[size_t(b)], b);
  EXPECT_EQ(tok->decode(ids), all);
}

TEST(ByteTokenizer, SpecialTextBecomesSpecialIds) {
  const auto tok = make_tokenizer("bytes");
  EXPECT_EQ(tok->encode("a<|endoftext|><|bos|>b<|pad|><|x|>"),
            (std::vector<int32_t>{'a', 256, 257, 'b', 258, '<', '|', 'x', '|', '>'}));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{'h', 'i', 256}), "hi<|endoftext|>");
  EXPECT_THROW(tok->decode(std::vector<int32_t>{259}), InputError);
  EXPECT_THROW(tok->decode(std::vector<int32_t>{-1}), InputError);
}

TEST(ByteTokenizer, TokenClasses) {
  const auto tok = make_tokenizer("bytes");
  const std::vector<TokenClass> cls = classify_tokens(*tok, tok->encode("a, b\n<|endoftext|>\xC3\xA9"));
  const std::vector<TokenClass> want = {TokenClass::kFirst,      TokenClass::kStructural, TokenClass::kStructural,
                                        TokenClass::kContent,    TokenClass::kStructural, TokenClass::kSpecial,
                                        TokenClass::kContent,    TokenClass::kContent};
  EXPECT_EQ(cls, want);
  EXPECT_STREQ(token_class_name(TokenClass::kStructural), "structural");
  EXPECT_NE(tok->fingerprint(), make_tokenizer(std::string("qwen3:") + test::kQwen3Tokenizer)->fingerprint());
}

// `deepen tokenize`: the small tool to check a tokenizer from the shell.
class TokenizeCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin = std::getenv("DEEPEN_BIN");
    const std::string deepen = bin ? bin : test::kDeepenBin;
    if (!fs::exists(deepen)) GTEST_SKIP() << deepen << " is not built (a torch-free build; ninja -C build deepen)";
  }
  std::string run(const std::string& args, const std::string& input, int* rc) {
    // One folder per test: ctest runs the tests of this fixture in parallel processes.
    const fs::path dir = fs::path(test::kBinaryDir) / "testdata" /
                         (std::string("tokenize_cmd_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir);
    std::ofstream(dir / "in", std::ios::binary) << input;
    const char* bin = std::getenv("DEEPEN_BIN");
    const std::string cmd = std::string(bin ? bin : test::kDeepenBin) + " tokenize " + args + " < " +
                            (dir / "in").string() + " > " + (dir / "out").string() + " 2>&1";
    const int status = std::system(cmd.c_str());
    *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream in(dir / "out", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
};

TEST_F(TokenizeCommand, EncodesAndDecodesQwen3) {
  const std::string spec = std::string("--tokenizer qwen3:") + test::kQwen3Tokenizer;
  int rc = -1;
  EXPECT_EQ(run(spec, "Hello, world\n", &rc), "9707 11 1879 198\n");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(run(spec + " --decode", "9707 11\n1879   198", &rc), "Hello, world\n");
  EXPECT_EQ(rc, 0);
  const std::string err = run(spec + " --decode", "9707 151669", &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("\"151669\" is not a token id of qwen3"), std::string::npos) << err;
}

TEST_F(TokenizeCommand, BadTokenizerSpecIsExitCode2) {
  int rc = -1;
  const std::string err = run("--tokenizer qwen3:/nonexistent.json", "x", &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("/nonexistent.json: cannot open tokenizer file"), std::string::npos) << err;
  EXPECT_EQ(run("--tokenizer bytes", "hi", &rc), "104 105\n");
}

}  // namespace
}  // namespace deepen
