// Teacher cache files: the record bytes the layout documents, a write/read round trip, and the ways a
// damaged or unfinished file is caught.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "teacher_cache/cache_file.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;

CacheRecord record(float h, std::vector<uint32_t> ids, std::vector<uint32_t> counts) {
  CacheRecord r;
  r.entropy = h;
  r.ids = std::move(ids);
  r.counts = std::move(counts);
  return r;
}

// The example of cache_file.h: K = 4 draws {17, 17, 301, 5} give ids 5, 17, 301 with counts 1, 2, 1.
TEST(CacheFile, ARecordIsTheDocumentedBytes) {
  std::vector<unsigned char> out;
  encode_cache_record(record(1.5f, {5, 17, 301}, {1, 2, 1}), 4, 0, out);
  ASSERT_EQ(out.size(), 12u);
  const std::vector<unsigned char> after_entropy(out.begin() + 4, out.end());
  EXPECT_EQ(after_entropy, (std::vector<unsigned char>{0x03, 0x05, 0x0c, 0x9c, 0x02, 0x01, 0x02, 0x01}));
  CacheRecord back;
  EXPECT_EQ(decode_cache_record(out.data(), out.data() + out.size(), 4, 0, back), out.data() + out.size());
  EXPECT_EQ(back.entropy, 1.5f);
  EXPECT_EQ(back.ids, (std::vector<uint32_t>{5, 17, 301}));
  EXPECT_EQ(back.counts, (std::vector<uint32_t>{1, 2, 1}));
}

TEST(CacheFile, ABadRecordIsRefusedOnBothSides) {
  std::vector<unsigned char> out;
  EXPECT_THROW(encode_cache_record(record(0, {5, 5}, {1, 3}), 4, 0, out), std::invalid_argument);  // not distinct
  EXPECT_THROW(encode_cache_record(record(0, {5, 6}, {1, 2}), 4, 0, out), std::invalid_argument);  // sums to 3
  encode_cache_record(record(0, {5, 6}, {1, 3}), 4, 0, out);
  CacheRecord r;
  EXPECT_THROW(decode_cache_record(out.data(), out.data() + out.size() - 1, 4, 0, r), std::runtime_error);  // truncated
  EXPECT_THROW(decode_cache_record(out.data(), out.data() + out.size(), 8, 0, r), std::runtime_error);  // counts != K
}

std::vector<CacheRecord> sequence_of(uint32_t seed, int n, uint32_t topk) {
  std::vector<CacheRecord> rs;
  for (int t = 0; t < n; ++t) {
    CacheRecord r = record(0.25f * float(t), {seed + uint32_t(t), seed + 1000u + uint32_t(t) * 70000u}, {3, 5});
    for (uint32_t j = 0; j < topk; ++j) {
      r.topk_ids.push_back(j * 7 + seed);
      r.topk_logp.push_back(-float(j) - 0.5f);
    }
    rs.push_back(r);
  }
  return rs;
}

TEST(CacheFile, WrittenSequencesReadBackExactlyAndTheHashCoversThem) {
  const fs::path dir = test::scratch_dir("CacheFile", "round_trip");
  const std::string path = (dir / "00000.cache").string();
  CacheFileWriter w(path, 8, 3, 40);
  const std::vector<std::vector<CacheRecord>> seqs = {sequence_of(1, 5, 3), sequence_of(9, 0, 3), sequence_of(4, 7, 3)};
  for (const auto& s : seqs) w.append_sequence(s);
  EXPECT_FALSE(fs::exists(path));  // only the temporary until commit
  const CacheFileHeader h = w.commit();
  ASSERT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(h.first_sequence, 40u);
  EXPECT_EQ(h.sequences, 3u);
  EXPECT_EQ(h.records, 12u);

  const CacheFile f = CacheFile::open(path);
  EXPECT_EQ(f.header().payload_hash, h.payload_hash);
  EXPECT_EQ(f.hash_payload(), h.payload_hash);
  for (size_t i = 0; i < seqs.size(); ++i) {
    ASSERT_EQ(f.records(int64_t(i)), int64_t(seqs[i].size()));
    const auto bytes = f.sequence_bytes(int64_t(i));
    const unsigned char* p = bytes.data();
    for (const CacheRecord& want : seqs[i]) {
      CacheRecord got;
      p = decode_cache_record(p, bytes.data() + bytes.size(), 8, 3, got);
      EXPECT_EQ(got.entropy, want.entropy);
      EXPECT_EQ(got.ids, want.ids);
      EXPECT_EQ(got.counts, want.counts);
      EXPECT_EQ(got.topk_ids, want.topk_ids);
      EXPECT_EQ(got.topk_logp, want.topk_logp);
    }
    EXPECT_EQ(p, bytes.data() + bytes.size());
  }
  EXPECT_EQ(read_cache_file_header(path).payload_hash, h.payload_hash);

  // One flipped bit in a record: the header and index still open, the payload hash does not match.
  {
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(kCacheFileHeaderBytes + 6);
    char c = 0;
    io.seekg(kCacheFileHeaderBytes + 6);
    io.get(c);
    io.seekp(kCacheFileHeaderBytes + 6);
    io.put(char(c ^ 0x10));
  }
  EXPECT_NE(CacheFile::open(path).hash_payload(), h.payload_hash);
  // Truncated: the index no longer fits.
  fs::resize_file(path, fs::file_size(path) - 3);
  EXPECT_THROW(CacheFile::open(path), std::runtime_error);
}

TEST(CacheFile, AWriterThatNeverCommitsLeavesNothing) {
  const fs::path dir = test::scratch_dir("CacheFile", "no_commit");
  const std::string path = (dir / "x.cache").string();
  {
    CacheFileWriter w(path, 4, 0, 0);
    w.append_sequence({record(0, {1}, {4})});
    EXPECT_TRUE(fs::exists(path + ".tmp"));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

}  // namespace
}  // namespace deepen
