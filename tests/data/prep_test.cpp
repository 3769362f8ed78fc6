// `deepen prep`: shards hold exactly the tokenizer's ids with EOS between documents, the split is by
// document hash (of a JSONL record's id where it has one), output is identical for any thread
// count, and bad input writes nothing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "data/tokenizer.h"
#include "tests/data/prep_fixture.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;

using test::slurp;

class PrepTest : public test::PrepFixture {
 protected:
  void SetUp() override {
    make_root("prep_");
    fs::create_directories(root_ / "src");
  }
  // A corpus with structure: text files in nested folders, a JSONL file, a binary file.
  void make_corpus(int files) {
    fs::create_directories(root_ / "src" / "sub");
    for (int i = 0; i < files; ++i) {
      std::string text;
      for (int k = 0; k < 20 + i % 30; ++k)
        text += "Document " + std::to_string(i) + " line " + std::to_string(k) + ": it's <|endoftext|>-free text, ok?\n";
      std::ofstream(root_ / "src" / (i % 3 ? "sub" : ".") / ("doc" + std::to_string(1000 + i) + ".txt")) << text;
    }
    std::ofstream j(root_ / "src" / "records.jsonl");
    for (int i = 0; i < 40; ++i) j << R"({"id": )" << i << R"(, "text": "record )" << i << R"( \u00e9t\u00e9 \n ok"})" << "\n\n";
    std::ofstream(root_ / "src" / "blob.dat", std::ios::binary) << std::string("\x01\x00\x02", 3);
  }
  DataConfig config(const std::string& tokenizer = "bytes") const {
    DataConfig c;
    c.tokenizer = tokenizer;
    c.sources = {(root_ / "src").string()};
    c.train = (root_ / "out" / "train").string();
    c.valid = (root_ / "out" / "valid").string();
    c.valid_fraction = 0.1;
    c.shard_tokens = 5000;
    return c;
  }
};

TEST_F(PrepTest, ShardsHoldTheTokenizersIdsWithEosBetweenDocumentsSplitByHash) {
  make_corpus(60);
  const DataConfig cfg = config();
  const PrepSummary sum = run_prep(cfg, quiet());
  // Expected: documents in the documented order (sorted paths, JSONL lines in order).
  const auto tok = make_tokenizer("bytes");
  std::vector<std::string> docs, keys;  // keys: what the split hashes (a JSONL record's id, else the text)
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(root_ / "src"))
    if (e.is_regular_file() && e.path().filename() != "blob.dat") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    if (f.extension() != ".jsonl") {
      docs.push_back(slurp(f));
      keys.push_back(docs.back());
      continue;
    }
    for (int i = 0; i < 40; ++i) {
      docs.push_back("record " + std::to_string(i) + " \u00e9t\u00e9 \n ok");
      keys.push_back(std::to_string(i));  // "id": i (data.id_field)
    }
  }
  std::vector<int32_t> want_train, want_valid;
  int64_t n_valid = 0;
  for (size_t k = 0; k < docs.size(); ++k) {
    const std::string& d = docs[k];
    auto& out = is_validation_document(keys[k], cfg.valid_fraction) ? want_valid : want_train;
    n_valid += &out == &want_valid;
    tok->encode_append(d, out);
    out.push_back(tok->eos_id());
  }
  ASSERT_GT(n_valid, 0) << "corpus too small for the test's purpose";
  EXPECT_EQ(read_all(cfg.train), want_train);
  EXPECT_EQ(read_all(cfg.valid), want_valid);
  EXPECT_EQ(sum.train_docs + sum.valid_docs, int64_t(docs.size()));
  EXPECT_EQ(sum.valid_docs, n_valid);
  EXPECT_EQ(sum.skipped_files, 1);
  EXPECT_EQ(sum.train_tokens, int64_t(want_train.size()));
  EXPECT_EQ(sum.train_shards.size(), (want_train.size() + 4999) / 5000);  // rolled over every 5000 tokens
  EXPECT_EQ(ShardSet::open(cfg.train, 2, 0, 0).documents(), sum.train_docs);
  EXPECT_NE(sum.line().find("documents"), std::string::npos);
}

TEST_F(PrepTest, DocumentIndexGivesBackEachDocumentsTokensAcrossShardBoundaries) {
  // Documents of ~1,000-4,000 byte tokens in 5,000-token shards: many span two shards.
  make_corpus(60);
  const DataConfig cfg = config();
  const PrepSummary sum = run_prep(cfg, quiet());
  const auto tok = make_tokenizer("bytes");
  std::vector<std::vector<int32_t>> want;  // train documents in prep's order (sorted paths), EOS included
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(root_ / "src"))
    if (e.is_regular_file() && e.path().filename() != "blob.dat") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  auto add = [&](const std::string& text, const std::string& key) {
    if (is_validation_document(key, cfg.valid_fraction)) return;
    want.push_back(tok->encode(text));
    want.back().push_back(tok->eos_id());
  };
  for (const fs::path& f : files) {
    if (f.extension() != ".jsonl") {
      add(slurp(f), slurp(f));
      continue;
    }
    for (int i = 0; i < 40; ++i) add("record " + std::to_string(i) + " \u00e9t\u00e9 \n ok", std::to_string(i));
  }
  const ShardSet set = ShardSet::open(cfg.train, 2, 0, 0);
  ASSERT_TRUE(set.has_document_index());
  ASSERT_EQ(set.documents(), sum.train_docs);
  ASSERT_GT(set.shards().size(), 2u);
  int64_t spanning = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const ShardSet::DocumentSpan d = set.document(int64_t(i));
    std::vector<int32_t> got(size_t(d.tokens));
    set.read(d.begin, d.tokens, got.data());
    ASSERT_EQ(got, want[i]) << "document " << i;
    spanning += d.begin / cfg.shard_tokens != (d.begin + d.tokens - 1) / cfg.shard_tokens;
  }
  EXPECT_GT(spanning, 0) << "no document spans two shards: the test lost its point";
  for (const Shard& s : set.shards()) EXPECT_NO_THROW(s.verify());
}

TEST_F(PrepTest, OutputIsByteIdenticalForAnyThreadCount) {
  make_corpus(300);
  DataConfig cfg = config(std::string("qwen3:") + test::kQwen3Tokenizer);
  if (const char* env = std::getenv("DEEPEN_QWEN3_TOKENIZER")) cfg.tokenizer = std::string("qwen3:") + env;
  cfg.shard_tokens = 20000;
  std::vector<std::string> runs;
  for (int threads : {1, 2, 3}) {
    PrepOptions o = quiet(threads);
    o.overwrite = true;
    const PrepSummary sum = run_prep(cfg, o);
    std::string all;
    for (const auto& f : sum.train_shards) all += slurp(f);
    all += "|";
    for (const auto& f : sum.valid_shards) all += slurp(f);
    runs.push_back(all);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

TEST_F(PrepTest, MissingSourceFolderIsAnInputErrorAndNothingIsWritten) {
  DataConfig cfg = config();
  cfg.sources = {(root_ / "no_such_folder").string()};
  const std::string e = error_of(cfg);
  EXPECT_NE(e.find("data.sources: \"" + (root_ / "no_such_folder").string() + "\": no such file or folder"),
            std::string::npos) << e;
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

TEST_F(PrepTest, BadJsonlLinesNameTheFileAndLineAndWriteNothing) {
  make_corpus(5);
  std::ofstream(root_ / "src" / "zz.jsonl") << R"({"text": "fine"})" << "\n" << R"({"body": "no text field"})" << "\n";
  std::string e = error_of(config());
  EXPECT_NE(e.find("zz.jsonl:2: no string field \"text\" (data.jsonl_field)"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(root_ / "out")) << "a failed run must leave nothing behind";
  std::ofstream(root_ / "src" / "zz.jsonl") << "{not json\n";
  e = error_of(config());
  EXPECT_NE(e.find("zz.jsonl:1: not valid JSON"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

TEST_F(PrepTest, JsonlFieldIsConfigurable) {
  std::ofstream(root_ / "src" / "a.jsonl") << R"({"body": "alpha"})" << "\n" << R"({"body": "beta"})" << "\n";
  DataConfig cfg = config();
  cfg.jsonl_field = "body";
  cfg.valid_fraction = 0;
  run_prep(cfg, quiet());
  const auto tok = make_tokenizer("bytes");
  EXPECT_EQ(tok->decode(read_all(cfg.train)), "alpha<|endoftext|>beta<|endoftext|>");
  EXPECT_TRUE(list_shard_files(cfg.valid).empty());
}

TEST_F(PrepTest, SmallCorpusStillGetsAValidationDocument) {
  // Three documents, 1% held out: none is likely to hash into the split, so the last one is.
  for (const char* name : {"a.txt", "b.txt", "c.txt"}) std::ofstream(root_ / "src" / name) << "text of " << name;
  DataConfig cfg = config();
  cfg.valid_fraction = 0.01;
  const PrepSummary sum = run_prep(cfg, quiet());
  ASSERT_TRUE(sum.valid_fallback);
  EXPECT_EQ(sum.valid_docs, 1);
  const auto tok = make_tokenizer("bytes");
  EXPECT_EQ(tok->decode(read_all(cfg.valid)), "text of c.txt<|endoftext|>");
  EXPECT_EQ(tok->decode(read_all(cfg.train)), "text of a.txt<|endoftext|>text of b.txt<|endoftext|>");
}

TEST_F(PrepTest, ExistingShardsAreKeptUnlessOverwriting) {
  make_corpus(20);
  DataConfig cfg = config();
  cfg.shard_tokens = 1000;
  const PrepSummary first = run_prep(cfg, quiet());
  ASSERT_GT(first.train_shards.size(), 2u);
  const std::string e = error_of(cfg);
  EXPECT_NE(e.find("data.train: \"" + cfg.train + "\" already holds"), std::string::npos) << e;
  EXPECT_NE(e.find("--overwrite"), std::string::npos) << e;
  cfg.shard_tokens = 1'000'000;  // now one shard: the old extra ones must go
  PrepOptions o = quiet();
  o.overwrite = true;
  const PrepSummary second = run_prep(cfg, o);
  EXPECT_EQ(list_shard_files(cfg.train), second.train_shards);
  EXPECT_EQ(second.train_shards.size(), 1u);
}

TEST_F(PrepTest, EmptyDatasetIsAnInputError) {
  std::ofstream(root_ / "src" / "empty.txt") << "";
  std::ofstream(root_ / "src" / "empty.jsonl") << "\n\n";
  const std::string e = error_of(config());
  EXPECT_NE(e.find("empty dataset"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

TEST_F(PrepTest, CommandLineReportsBadInputWithExitCode2) {
  const char* bin = std::getenv("DEEPEN_BIN");
  const std::string deepen = bin ? bin : test::kDeepenBin;
  if (!fs::exists(deepen)) GTEST_SKIP() << deepen << " is not built (a torch-free build; ninja -C build deepen)";
  const fs::path toml = root_ / "prep.toml";
  std::ofstream(toml) << "[data]\nsources = [\"" << (root_ / "missing").string() << "\"]\ntrain = \""
                      << (root_ / "out/train").string() << "\"\nvalid = \"" << (root_ / "out/valid").string()
                      << "\"\n[curriculum]\nstage_steps = [1]\n[student]\nlayers = 1\n";
  const std::string cmd = deepen + " prep " + toml.string() + " > " + (root_ / "log").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 2) << slurp(root_ / "log");
  EXPECT_NE(slurp(root_ / "log").find("data.sources: \"" + (root_ / "missing").string() + "\": no such file or folder"),
            std::string::npos) << slurp(root_ / "log");
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

}  // namespace
}  // namespace deepen
