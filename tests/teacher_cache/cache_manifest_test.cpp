// The teacher cache's manifest (JSON round trip, the differences a run is refused for) and the
// teacher's identity (fingerprint and weights hash) on real files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "teacher_cache/cache_manifest.h"
#include "tests/test_support.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

CacheManifest example() {
  CacheManifest m;
  m.teacher_checkpoint = "/models/t";
  m.teacher_fingerprint = 0x1234;
  m.teacher_weights_hash = 0xabcd;
  m.teacher_dtype = FloatDtype::kBf16;
  m.vocab = 151936;
  m.tokenizer = "qwen3:tok.json";
  m.tokenizer_fingerprint = 77;
  m.packing = Packing::kDocuments;
  m.max_len = 8192;
  m.train_shards = {{"00000.bin", 5, 100}, {"00001.bin", 6, 40}};
  m.valid_shards = {{"00000.bin", 9, 20}};
  m.train_sequences = 12;
  m.valid_sequences = 3;
  m.train_records = 130;
  m.valid_records = 17;
  m.samples = 64;
  m.topk = 8;
  m.seed = 42;
  m.train_temperature = 2;
  m.files = {{"train/00000.cache", 0, 0, 10, 100, 2000, 0xfeed}, {"valid/00000.cache", 1, 0, 3, 17, 300, 0xbeef}};
  return m;
}

TEST(CacheManifest, RoundTripsThroughJson) {
  const CacheManifest m = example();
  const CacheManifest back = parse_cache_manifest(cache_manifest_json(m), "m.json");
  EXPECT_TRUE(manifest_differences(m, back).empty());
  EXPECT_EQ(back.files.size(), 2u);
  EXPECT_EQ(back.files[1].hash, 0xbeefu);
  EXPECT_EQ(back.files[1].split, 1);
  EXPECT_EQ(back.bytes(), 2300);
  EXPECT_EQ(back.teacher_weights_hash, 0xabcdu);
  EXPECT_NE(test::error_of([] { parse_cache_manifest("{\"format\": \"x\"}", "m.json"); }).find("not a teacher cache manifest"),
            std::string::npos);
}

// Each thing a run must share with its cache, changed alone, is named with both values.
TEST(CacheManifest, EveryDifferenceIsNamedWithTheKeyToChange) {
  const CacheManifest a = example();
  const std::vector<std::pair<std::function<void(CacheManifest&)>, std::string>> cases = {
      {[](CacheManifest& m) { m.teacher_fingerprint = 0x999; }, "teacher fingerprint (teacher.checkpoint)"},
      {[](CacheManifest& m) { m.teacher_dtype = FloatDtype::kFp32; }, "teacher dtype (teacher.dtype): bf16 vs fp32"},
      {[](CacheManifest& m) { m.tokenizer_fingerprint = 78; }, "tokenizer (data.tokenizer)"},
      {[](CacheManifest& m) { m.packing = Packing::kWindows; }, "packing (data.packing): documents vs windows"},
      {[](CacheManifest& m) { m.max_len = 4096; }, "max_len (data.max_len): 8192 vs 4096"},
      {[](CacheManifest& m) { m.train_shards[1].payload_hash = 7; }, "train shards (data.train)"},
      {[](CacheManifest& m) { m.valid_shards[0].name = "x.bin"; }, "validation shards (data.valid)"},
      {[](CacheManifest& m) { m.samples = 8; }, "samples (cache.samples): 64 vs 8"},
      {[](CacheManifest& m) { m.seed = 1; }, "seed (cache.seed): 42 vs 1"},
      {[](CacheManifest& m) { m.train_temperature = 1; }, "temperature (distill.temperature): 2 vs 1"}};
  for (const auto& [change, want] : cases) {
    CacheManifest b = a;
    change(b);
    const std::vector<std::string> d = manifest_differences(a, b);
    ASSERT_EQ(d.size(), 1u) << want;
    EXPECT_NE(d[0].find(want), std::string::npos) << d[0];
  }
}

TEST(CacheManifest, TheTeacherFingerprintSeesOneChangedWeightAndIgnoresTheFolder) {
  const fs::path a = test::scratch_dir("CacheManifest", "teacher_a"), b = test::scratch_dir("CacheManifest", "teacher_b");
  std::ofstream(a / "config.json") << "{\"vocab_size\": 10}";
  {
    std::ofstream f(a / "model.safetensors", std::ios::binary);
    const std::string header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[300000],\"data_offsets\":[0,1200000]}}";
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header;
    for (int i = 0; i < 1200000; ++i) f.put(static_cast<char>(i * 7));
  }
  fs::copy(a, b, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  EXPECT_EQ(teacher_fingerprint(a.string()), teacher_fingerprint(b.string()));
  EXPECT_EQ(teacher_weights_hash(a.string()), teacher_weights_hash(b.string()));
  {
    std::fstream f(b / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(600000);
    f.put('\x55');
  }
  EXPECT_NE(teacher_fingerprint(a.string()), teacher_fingerprint(b.string()));
  EXPECT_NE(teacher_weights_hash(a.string()), teacher_weights_hash(b.string()));
  fs::remove(b / "model.safetensors");
  EXPECT_NE(test::error_of([&] { teacher_fingerprint(b.string()); }).find("no *.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace deepen
