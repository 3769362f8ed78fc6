// Token shards: round trips in both widths, sequence windows across shards, and every bad input a
// user can hand the reader (each an InputError naming the file and the reason, nothing written).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "config/hash.h"
#include "config/input_error.h"
#include "data/token_shards.h"
#include "tests/test_paths.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;

class ShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(test::kBinaryDir) / "testdata" /
           (std::string("shard_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string error_of(const std::function<void()>& f) { return test::error_of(f); }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  // Raw shard bytes with a consistent header check, for corrupt-header cases.
  static std::string raw_shard(uint32_t version, uint32_t token_bytes, uint64_t vocab, uint64_t count,
                               uint64_t max_id, const std::string& payload) {
    std::string h(kShardHeaderBytes, '\0');
    auto put = [&](size_t at, uint64_t v, int n) { for (int i = 0; i < n; ++i) h[at + size_t(i)] = char(v >> (8 * i)); };
    std::memcpy(h.data(), kShardMagic, 8);
    put(8, version, 4);
    put(12, token_bytes, 4);
    put(16, vocab, 8);
    put(24, count, 8);
    put(56, max_id, 4);
    put(60, uint32_t(hash64(h.data(), 60)), 4);
    return h + payload;
  }
  // A version-2 header for `count` 2-byte tokens and the given document ends (index appended).
  static std::string raw_v2(const std::string& tokens, const std::vector<uint64_t>& ends) {
    std::string h = raw_shard(2, 2, 259, tokens.size() / 2, 5, "");
    auto put = [&](size_t at, uint64_t v, int n) { for (int i = 0; i < n; ++i) h[at + size_t(i)] = char(v >> (8 * i)); };
    put(32, ends.size(), 8);
    put(60, uint32_t(hash64(h.data(), 60)), 4);
    std::string index(ends.size() * 8, '\0');
    for (size_t j = 0; j < ends.size(); ++j)
      for (int i = 0; i < 8; ++i) index[8 * j + size_t(i)] = char(ends[j] >> (8 * i));
    return h + tokens + index;
  }
  void write_raw(const std::string& name, const std::string& bytes) { std::ofstream(path(name), std::ios::binary) << bytes; }

  fs::path dir_;
};

std::vector<int32_t> iota_ids(size_t n, int32_t mod) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = int32_t((i * 7919) % size_t(mod));
  return v;
}

TEST_F(ShardTest, RoundTripsBothTokenWidths) {
  for (uint64_t vocab : {uint64_t(259), uint64_t(65536), uint64_t(65537), uint64_t(151669)}) {
    const std::vector<int32_t> ids = iota_ids(5000, int32_t(vocab));
    const std::string p = path("v" + std::to_string(vocab) + ".bin");
    const std::vector<uint64_t> ends = {10, 2000, 5000};
    write_shard(p, ids, vocab, 1234, ends);
    const Shard s = Shard::open(p);
    EXPECT_EQ(s.header().token_bytes, vocab <= 65536 ? 2u : 4u);
    EXPECT_EQ(fs::file_size(p), kShardHeaderBytes + ids.size() * s.header().token_bytes + 3 * 8);
    EXPECT_EQ(s.header().version, kShardVersion);
    EXPECT_EQ(s.document_end(1), 2000);
    EXPECT_EQ(s.header().vocab_size, vocab);
    EXPECT_EQ(s.header().doc_count, 3u);
    EXPECT_EQ(s.header().tokenizer_fingerprint, 1234u);
    std::vector<int32_t> back(ids.size());
    s.read(0, int64_t(ids.size()), back.data());
    EXPECT_EQ(back, ids);
    std::vector<int64_t> wide(10);
    s.read(100, 10, wide.data());
    for (size_t i = 0; i < 10; ++i) EXPECT_EQ(wide[i], ids[100 + i]);
    EXPECT_NO_THROW(s.verify());
  }
}

TEST_F(ShardTest, StreamingWriterMatchesOneShotAndLeavesNothingUntilCommit) {
  const std::vector<int32_t> ids = iota_ids(3'000'000, 151669);  // > 1 MiB blocks of payload
  const std::vector<uint64_t> ends = {1'000'000, 3'000'000};
  write_shard(path("a.bin"), ids, 151669, 9, ends);
  {
    ShardWriter w(path("b.bin"), 151669, 9);
    for (size_t at = 0; at < ids.size(); at += 99'991) {
      const size_t n = std::min<size_t>(99'991, ids.size() - at);
      if (at < 1'000'000 && at + n >= 1'000'000) {  // the first document ends inside this piece
        w.append(std::span(ids).subspan(at, 1'000'000 - at));
        w.end_document();
        w.append(std::span(ids).subspan(1'000'000, at + n - 1'000'000));
      } else {
        w.append(std::span(ids).subspan(at, n));
      }
    }
    w.end_document();
    w.finish();
    EXPECT_FALSE(fs::exists(path("b.bin"))) << "visible before commit";
    w.commit();
  }
  std::ifstream a(path("a.bin"), std::ios::binary), b(path("b.bin"), std::ios::binary);
  EXPECT_TRUE(std::equal(std::istreambuf_iterator<char>(a), {}, std::istreambuf_iterator<char>(b)));
  {
    ShardWriter abandoned(path("c.bin"), 151669, 9);
    abandoned.append(ids);
  }
  EXPECT_EQ(files(), (std::vector<std::string>{"a.bin", "b.bin"}));
}

TEST_F(ShardTest, WritingAnIdOutsideTheVocabularyFailsAndWritesNothing) {
  const std::vector<int32_t> ids = {1, 2, 300, 4};
  const std::string e = error_of([&] { write_shard(path("x.bin"), ids, 259, 0); });
  EXPECT_NE(e.find("x.bin: token 2 has id 300, outside the vocabulary [0, 259)"), std::string::npos) << e;
  EXPECT_TRUE(files().empty());
}

TEST_F(ShardTest, SequencesAreStrideSeqLenWindowsAcrossShards) {
  // 10 tokens 0..9 in shards of 4 + 6; window 4 (seq_len 3): t0..t3, t3..t6, t6..t9.
  write_shard(path("00.bin"), std::vector<int32_t>{0, 1, 2, 3}, 259, 5);
  write_shard(path("01.bin"), std::vector<int32_t>{4, 5, 6, 7, 8, 9}, 259, 5);
  const ShardSet set = ShardSet::open(dir_.string(), 4, 259, 5);
  EXPECT_EQ(set.tokens(), 10);
  EXPECT_EQ(set.sequences(), 3);
  std::vector<int64_t> seq(4);
  set.read_sequence(1, seq.data());
  EXPECT_EQ(seq, (std::vector<int64_t>{3, 4, 5, 6}));
  set.read_sequence(2, seq.data());
  EXPECT_EQ(seq, (std::vector<int64_t>{6, 7, 8, 9}));
  EXPECT_THROW(set.read_sequence(3, seq.data()), std::out_of_range);
  // A glob and a single file name work too.
  EXPECT_EQ(ShardSet::open((dir_ / "0*.bin").string(), 4, 259, 0).tokens(), 10);
  EXPECT_EQ(ShardSet::open(path("01.bin"), 4, 259, 0).sequences(), 1);
}

TEST_F(ShardTest, DocumentIndexGivesEveryDocumentAcrossShards) {
  // The header's worked example: documents of 3, 4 and 5 tokens in shards of 5 tokens, as prep
  // writes them (document 1 begins in shard 0 and ends in shard 1).
  std::vector<int32_t> ids(12);
  std::iota(ids.begin(), ids.end(), 0);
  const std::vector<uint64_t> e0 = {3}, e1 = {2}, e2 = {2};
  write_shard(path("s0.bin"), std::span(ids).subspan(0, 5), 259, 5, e0);
  write_shard(path("s1.bin"), std::span(ids).subspan(5, 5), 259, 5, e1);
  write_shard(path("s2.bin"), std::span(ids).subspan(10, 2), 259, 5, e2);
  const ShardSet set = ShardSet::open(dir_.string(), 2, 259, 5);
  ASSERT_TRUE(set.has_document_index());
  ASSERT_EQ(set.documents(), 3);
  const int64_t want[3][2] = {{0, 3}, {3, 4}, {7, 5}};
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(set.document(i).begin, want[i][0]) << i;
    EXPECT_EQ(set.document(i).tokens, want[i][1]) << i;
  }
  std::vector<int32_t> doc(4);
  set.read(set.document(1).begin, set.document(1).tokens, doc.data());
  EXPECT_EQ(doc, (std::vector<int32_t>{3, 4, 5, 6}));
  EXPECT_THROW(set.document(3), std::out_of_range);
  for (const Shard& s : set.shards()) EXPECT_NO_THROW(s.verify());
}

TEST_F(ShardTest, VersionOneShardsStillReadAndDocumentsModeNamesTheFileToRePrep) {
  // A version-1 file (no index) from an older deepen: packed windows read it as before ...
  write_raw("old.bin", raw_shard(1, 2, 259, 4, 9, std::string("\x01\x00\x02\x00\x03\x00\x09\x00", 8)));
  const ShardSet set = ShardSet::open(dir_.string(), 2, 259, 0);
  EXPECT_EQ(set.sequences(), 3);
  EXPECT_FALSE(set.has_document_index());
  // ... and documents mode refuses it, naming the file and the fix.
  const std::string e = error_of([&] { set.require_document_index("data.packing = \"documents\""); });
  EXPECT_NE(e.find("old.bin: shard format version 1 has no document index, which data.packing = \"documents\" needs; "
                   "re-run `deepen prep`"),
            std::string::npos)
      << e;
}

TEST_F(ShardTest, CorruptDocumentIndexIsAClearError) {
  const std::string tokens("\x01\x00\x02\x00\x03\x00\x04\x00", 8);  // 4 tokens
  write_raw("order.bin", raw_v2(tokens, {3, 3}));
  std::string e = error_of([&] { Shard::open(path("order.bin")); });
  EXPECT_NE(e.find("order.bin: corrupted document index: document 1 ends at 3, not after 3"), std::string::npos) << e;
  write_raw("past.bin", raw_v2(tokens, {2, 5}));
  e = error_of([&] { Shard::open(path("past.bin")); });
  EXPECT_NE(e.find("past.bin: corrupted document index: document 1 ends at 5, past the shard's 4 tokens"),
            std::string::npos)
      << e;
  std::string cut = raw_v2(tokens, {2, 4});
  cut.resize(cut.size() - 3);
  write_raw("cut.bin", cut);
  e = error_of([&] { Shard::open(path("cut.bin")); });
  EXPECT_NE(e.find("cut.bin: truncated"), std::string::npos) << e;
  EXPECT_NE(e.find("4 tokens and 2 documents"), std::string::npos) << e;
  // A flipped bit in an otherwise valid index: the payload hash covers it.
  const std::vector<uint64_t> ends = {2, 4};
  write_shard(path("flip.bin"), std::vector<int32_t>{1, 2, 3, 4}, 259, 0, ends);
  {
    std::fstream f(path("flip.bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(kShardHeaderBytes + 8));  // first index entry: 2 -> 3 (still increasing)
    f.put('\x03');
  }
  const Shard flipped = Shard::open(path("flip.bin"));
  e = error_of([&] { flipped.verify(); });
  EXPECT_NE(e.find("flip.bin: payload hash mismatch"), std::string::npos) << e;
}

TEST_F(ShardTest, WrongMagicIsAClearError) {
  write_raw("notes.bin", std::string(200, 'x'));
  const std::string e = error_of([&] { Shard::open(path("notes.bin")); });
  EXPECT_NE(e.find("notes.bin: not a token shard (wrong magic"), std::string::npos) << e;
}

TEST_F(ShardTest, WrongVersionIsAClearError) {
  write_raw("v3.bin", raw_shard(3, 2, 259, 2, 5, std::string(4, '\1')));
  const std::string e = error_of([&] { Shard::open(path("v3.bin")); });
  EXPECT_NE(e.find("v3.bin: shard format version 3, this deepen reads versions 1 to 2"), std::string::npos) << e;
}

TEST_F(ShardTest, TruncatedFileIsAClearError) {
  write_shard(path("t.bin"), iota_ids(100, 259), 259, 0);
  fs::resize_file(path("t.bin"), kShardHeaderBytes + 150);
  std::string e = error_of([&] { Shard::open(path("t.bin")); });
  EXPECT_NE(e.find("t.bin: truncated"), std::string::npos) << e;
  fs::resize_file(path("t.bin"), 10);
  e = error_of([&] { Shard::open(path("t.bin")); });
  EXPECT_NE(e.find("t.bin: truncated: 10 bytes"), std::string::npos) << e;
}

TEST_F(ShardTest, TokenIdAtOrAboveVocabIsAClearError) {
  // The header admits it ...
  write_raw("hdr.bin", raw_shard(1, 2, 259, 2, 259, std::string("\x01\x00\x03\x01", 4)));
  std::string e = error_of([&] { Shard::open(path("hdr.bin")); });
  EXPECT_NE(e.find("hdr.bin: token id 259 >= vocab size 259"), std::string::npos) << e;
  // ... or only the payload has it (a flipped bit): caught when the token is read.
  write_raw("body.bin", raw_shard(1, 2, 259, 2, 3, std::string("\x01\x00\xff\x01", 4)));
  const Shard s = Shard::open(path("body.bin"));
  std::vector<int32_t> out(2);
  e = error_of([&] { s.read(0, 2, out.data()); });
  EXPECT_NE(e.find("body.bin: token 1 has id 511 >= vocab size 259"), std::string::npos) << e;
  e = error_of([&] { s.verify(); });
  EXPECT_NE(e.find("body.bin: payload hash mismatch"), std::string::npos) << e;
}

TEST_F(ShardTest, VocabMismatchBetweenShardsIsAClearError) {
  write_shard(path("a.bin"), iota_ids(50, 259), 259, 0);
  write_shard(path("b.bin"), iota_ids(50, 300), 300, 0);
  const std::string e = error_of([&] { ShardSet::open(dir_.string(), 8, 0, 0); });
  EXPECT_NE(e.find("b.bin: vocab size 300 differs from"), std::string::npos) << e;
  EXPECT_NE(e.find("a.bin's 259"), std::string::npos) << e;
}

TEST_F(ShardTest, ShardsFromAnotherTokenizerAreRefused) {
  write_shard(path("a.bin"), iota_ids(50, 259), 259, 111);
  std::string e = error_of([&] { ShardSet::open(dir_.string(), 8, 151669, 0); });
  EXPECT_NE(e.find("a.bin: vocab size 259, but the tokenizer has 151669"), std::string::npos) << e;
  e = error_of([&] { ShardSet::open(dir_.string(), 8, 259, 222); });
  EXPECT_NE(e.find("a.bin: written by a different tokenizer"), std::string::npos) << e;
  write_shard(path("b.bin"), iota_ids(50, 259), 259, 333);
  e = error_of([&] { ShardSet::open(dir_.string(), 8, 259, 0); });
  EXPECT_NE(e.find("b.bin: written by a different tokenizer than"), std::string::npos) << e;
}

TEST_F(ShardTest, EmptyDatasetIsAClearError) {
  std::string e = error_of([&] { ShardSet::open(dir_.string(), 8, 259, 0); });
  EXPECT_NE(e.find(dir_.string() + ": empty dataset: no *.bin shards"), std::string::npos) << e;
  write_shard(path("empty.bin"), {}, 259, 0);
  e = error_of([&] { ShardSet::open(dir_.string(), 8, 259, 0); });
  EXPECT_NE(e.find("empty dataset: 1 shard file(s) hold 0 tokens"), std::string::npos) << e;
  e = error_of([&] { ShardSet::open((dir_ / "missing").string(), 8, 259, 0); });
  EXPECT_NE(e.find("missing: no such shard file or folder"), std::string::npos) << e;
  write_shard(path("short.bin"), iota_ids(5, 259), 259, 0);
  e = error_of([&] { ShardSet::open(dir_.string(), 8, 259, 0); });
  EXPECT_NE(e.find("5 tokens, fewer than one sequence of 8"), std::string::npos) << e;
}

}  // namespace
}  // namespace deepen
