// `deepen prep` on FineWeb-Edu parquet: the same shards as the JSONL of the same records, split by
// id, any thread count; a truncated, non-parquet or column-less file is a clear error, exit 2, nothing left.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "data/parquet_source.h"
#include "data/tokenizer.h"
#include "tests/data/prep_fixture.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;

using test::slurp;

std::string qwen3_tokenizer() {
  if (const char* env = std::getenv("DEEPEN_QWEN3_TOKENIZER")) return std::string("qwen3:") + env;
  return std::string("qwen3:") + test::kQwen3Tokenizer;
}

class PrepParquetTest : public test::PrepFixture {
 protected:
  void SetUp() override {
    if (!parquet_supported()) GTEST_SKIP() << "this build has no parquet reader (pyarrow was missing when CMake ran)";
    make_root("prep_parquet_");
    // pyarrow writes the files (tests/fixtures/fineweb_parquet.py says what each one holds).
    const std::string cmd = std::string(test::kPython) + " " + test::kSourceDir + "/tests/fixtures/fineweb_parquet.py " +
                            (root_ / "in").string() + " > " + (root_ / "fixture.log").string() + " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(root_ / "fixture.log");
  }
  DataConfig config(const std::string& source, const std::string& out, const std::string& tokenizer = "bytes") const {
    DataConfig c;
    c.tokenizer = tokenizer;
    c.sources = {(root_ / "in" / source).string()};
    c.train = (root_ / out / "train").string();
    c.valid = (root_ / out / "valid").string();
    c.valid_fraction = 0.1;
    c.shard_tokens = 4096;  // several shards, so the rollover is compared too
    return c;
  }
  // Every shard file of a run, byte for byte, in order.
  static std::string shard_bytes(const PrepSummary& s) {
    std::string all;
    for (const auto& f : s.train_shards) all += fs::path(f).filename().string() + ":" + slurp(f);
    for (const auto& f : s.valid_shards) all += fs::path(f).filename().string() + ":" + slurp(f);
    return all;
  }
};

TEST_F(PrepParquetTest, ShardsEqualTheJsonlPathsForTheSameRecords) {
  // Snappy and zstd files with several row groups each, Qwen3 BPE over mixed scripts.
  const PrepSummary from_parquet = run_prep(config("fineweb", "pq", qwen3_tokenizer()), quiet());
  const PrepSummary from_jsonl = run_prep(config("fineweb.jsonl", "js", qwen3_tokenizer()), quiet());
  EXPECT_EQ(from_parquet.files, 2);
  EXPECT_EQ(from_parquet.train_docs + from_parquet.valid_docs, 149);  // 150 records, one empty
  EXPECT_GT(from_parquet.valid_docs, 0);
  EXPECT_GT(from_parquet.train_shards.size(), 1u);
  EXPECT_FALSE(from_parquet.valid_fallback) << "the split should come from the ids' hashes";
  EXPECT_EQ(from_parquet.train_docs, from_jsonl.train_docs);
  EXPECT_EQ(from_parquet.valid_docs, from_jsonl.valid_docs);
  EXPECT_EQ(shard_bytes(from_parquet), shard_bytes(from_jsonl));
}

TEST_F(PrepParquetTest, ShardsHoldTheTextColumnInRowOrderSplitById) {
  // With the byte tokenizer the shards decode back to the texts. Expected: the records as the
  // fixture wrote them to JSONL, in row order, each in the split its id hashes to, empty ones left out.
  const DataConfig cfg = config("fineweb", "pq");
  run_prep(cfg, quiet());
  std::string want_train, want_valid;
  std::ifstream jsonl(root_ / "in" / "fineweb.jsonl");
  std::string line;
  int64_t records = 0;
  while (std::getline(jsonl, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ++records;
    const std::string text = j["text"].get<std::string>();
    if (text.empty()) continue;
    (is_validation_document(j["id"].get<std::string>(), cfg.valid_fraction) ? want_valid : want_train) +=
        text + "<|endoftext|>";
  }
  ASSERT_EQ(records, 150);
  ASSERT_FALSE(want_valid.empty());
  const auto tok = make_tokenizer("bytes");
  EXPECT_EQ(tok->decode(read_all(cfg.train)), want_train);
  EXPECT_EQ(tok->decode(read_all(cfg.valid)), want_valid);
  EXPECT_NE((want_train + want_valid).find("Математика"), std::string::npos);
}

TEST_F(PrepParquetTest, LayoutComesFromTheFooter) {
  const std::string path = (root_ / "in" / "fineweb" / "000_00000.parquet").string();
  const ParquetLayout with_id = read_parquet_layout(path, "text", "id");
  EXPECT_EQ(with_id.rows, 75);
  EXPECT_EQ(with_id.row_groups, 5);  // 75 rows in groups of 16
  EXPECT_EQ(with_id.text_column, 0);
  EXPECT_EQ(with_id.id_column, 1);
  EXPECT_EQ(read_parquet_layout(path, "text", "").id_column, -1);
  EXPECT_EQ(read_parquet_layout(path, "text", "no_such_column").id_column, -1);  // ids are optional
}

TEST_F(PrepParquetTest, WithoutIdsTheSplitFollowsTheTextInBothFormats) {
  DataConfig pq = config("fineweb", "pq");
  DataConfig js = config("fineweb.jsonl", "js");
  pq.id_field = js.id_field = "";
  const PrepSummary a = run_prep(pq, quiet());
  const PrepSummary b = run_prep(js, quiet());
  EXPECT_EQ(shard_bytes(a), shard_bytes(b));
  DataConfig by_id = config("fineweb", "id");
  EXPECT_NE(shard_bytes(a), shard_bytes(run_prep(by_id, quiet()))) << "ids should change the split";
}

TEST_F(PrepParquetTest, OutputIsByteIdenticalForAnyThreadCountAndOnReruns) {
  DataConfig cfg = config("fineweb", "pq", qwen3_tokenizer());
  std::vector<std::string> runs;
  for (int threads : {1, 3, 2, 2}) {
    PrepOptions o = quiet(threads);
    o.overwrite = true;
    runs.push_back(shard_bytes(run_prep(cfg, o)));
  }
  for (size_t i = 1; i < runs.size(); ++i) EXPECT_EQ(runs[0], runs[i]) << "run " << i;
}

TEST_F(PrepParquetTest, TruncatedFileIsAnErrorNamingItAndNothingIsWritten) {
  const DataConfig cfg = config("bad/truncated.parquet", "out");
  const std::string e = error_of(cfg);
  EXPECT_NE(e.find(cfg.sources[0] + ": not a readable parquet file: truncated or damaged: it starts as parquet but "
                                    "has no valid footer"),
            std::string::npos) << e;
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

TEST_F(PrepParquetTest, NonParquetFileIsAnErrorNamingItAndNothingIsWritten) {
  const DataConfig cfg = config("bad/not_parquet.parquet", "out");
  const std::string e = error_of(cfg);
  EXPECT_NE(e.find(cfg.sources[0] + ": not a readable parquet file: not parquet: it does not start with the magic "
                                    "\"PAR1\""),
            std::string::npos) << e;
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

TEST_F(PrepParquetTest, MissingTextColumnIsAnErrorNamingFileColumnAndKey) {
  DataConfig cfg = config("bad/no_text.parquet", "out");
  std::string e = error_of(cfg);
  EXPECT_NE(e.find(cfg.sources[0] + ": no column \"text\" (data.parquet_text_column); the file has: id, dump, url"),
            std::string::npos) << e;
  EXPECT_FALSE(fs::exists(root_ / "out"));
  // A good file listed first does not change that: every footer is read before any output.
  cfg.sources.insert(cfg.sources.begin(), (root_ / "in" / "fineweb").string());
  e = error_of(cfg);
  EXPECT_NE(e.find("no_text.parquet: no column \"text\""), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(root_ / "out"));
  // The column is configurable: FineWeb-Edu's `url` column as the documents works.
  cfg.parquet_text_column = "url";
  const PrepSummary s = run_prep(cfg, quiet());
  EXPECT_EQ(s.train_docs + s.valid_docs, 150 + 10);  // every url, the empty text's row included
}

TEST_F(PrepParquetTest, IdColumnOfAnotherTypeIsAnErrorNamingFileAndColumn) {
  const DataConfig cfg = config("bad/float_id.parquet", "out");
  const std::string e = error_of(cfg);
  EXPECT_NE(e.find(cfg.sources[0] + ": column \"id\" (data.id_field): has type double; expected a string, binary or "
                                    "integer column"),
            std::string::npos) << e;
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

TEST_F(PrepParquetTest, CorruptPageFoundWhileWritingLeavesNothingBehind) {
  // The footer is fine, so prep starts writing shards; the last row group's page is garbage.
  DataConfig cfg = config("bad/corrupt_page.parquet", "out");
  cfg.shard_tokens = 1024;  // shards are open (under temporary names) when the error comes
  const std::string e = error_of(cfg);
  EXPECT_NE(e.find(cfg.sources[0] + ": not a readable parquet file: row "), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(root_ / "out")) << "a failed run must leave nothing behind";
}

TEST_F(PrepParquetTest, CommandLineExitsWith2OnABadParquetFile) {
  const char* bin = std::getenv("DEEPEN_BIN");
  const std::string deepen = bin ? bin : test::kDeepenBin;
  if (!fs::exists(deepen)) GTEST_SKIP() << deepen << " is not built (a torch-free build; ninja -C build deepen)";
  for (const char* bad : {"truncated.parquet", "not_parquet.parquet", "no_text.parquet"}) {
    const fs::path file = root_ / "in" / "bad" / bad, toml = root_ / "prep.toml";
    std::ofstream(toml) << "[data]\nsources = [\"" << (root_ / "in" / "fineweb").string() << "\", \"" << file.string()
                        << "\"]\ntrain = \"" << (root_ / "out/train").string() << "\"\nvalid = \""
                        << (root_ / "out/valid").string() << "\"\n[curriculum]\nstage_steps = [1]\n[student]\nlayers = 1\n";
    const std::string cmd = deepen + " prep " + toml.string() + " > " + (root_ / "log").string() + " 2>&1";
    const int rc = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(rc));
    const std::string log = slurp(root_ / "log");
    EXPECT_EQ(WEXITSTATUS(rc), 2) << bad << ": " << log;
    EXPECT_NE(log.find(file.string() + ": "), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(root_ / "out")) << bad;
  }
}

}  // namespace
}  // namespace deepen
