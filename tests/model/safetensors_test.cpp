// safetensors reading and writing: values equal the Python package's, sharded folders, and every
// malformed file rejected with a message that names the file and what is wrong.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "model/safetensors.h"
#include "tests/test_paths.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;

// A fresh folder per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* t = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("deepen-st-" + std::to_string(getpid()) + "-" + t->test_suite_name() + "-" + t->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

int run(const std::string& command) {
  const int rc = std::system(command.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string reference_script() { return std::string(test::kSourceDir) + "/tests/fixtures/safetensors_reference.py"; }

// Runs the Python reference script; returns its exit code.
int python(const std::string& mode, const std::string& path) {
  return run(std::string(test::kPython) + " " + reference_script() + " " + mode + " '" + path + "' > '" + path +
             ".log' 2>&1");
}

// --- The value formula shared with tests/fixtures/safetensors_reference.py -------------------

struct DTypeCase {
  const char* name;
  DType dtype;
  std::vector<int64_t> shape;
};
const std::vector<DTypeCase> kDTypeCases = {
    {"f32", DType::F32, {2, 3}}, {"f16", DType::F16, {3, 2}}, {"bf16", DType::BF16, {2, 2, 2}},
    {"f64", DType::F64, {5}},    {"i64", DType::I64, {4}},    {"i32", DType::I32, {2, 2}},
    {"i16", DType::I16, {3}},    {"i8", DType::I8, {6}},      {"u8", DType::U8, {7}},
    {"bool", DType::BOOL, {5}},  {"scalar", DType::F32, {}},  {"empty", DType::F32, {0, 4}},
};
const std::map<std::string, std::string> kMetadata = {{"format", "pt"}, {"written_by", "safetensors_reference.py"}};

double formula(DType dtype, int64_t i) {
  switch (dtype) {
    case DType::BOOL: return i % 3 == 0 ? 1 : 0;
    case DType::U8: return static_cast<double>(i);
    case DType::F32: case DType::F16: case DType::BF16: case DType::F64: return (static_cast<double>(i) - 3) * 0.25;
    default: return static_cast<double>(i) - 3;
  }
}

// IEEE binary16 -> float, written out so the test does not depend on the code under test.
float half_to_float(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v = exp == 0 ? std::ldexp(static_cast<float>(mant), -24)
            : exp == 31 ? (mant ? NAN : INFINITY)
                        : std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  return sign ? -v : v;
}

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Element i of little-endian bytes of a dtype, as double.
double element(DType dtype, std::span<const std::byte> bytes, int64_t i) {
  const std::byte* p = bytes.data() + i * static_cast<int64_t>(dtype_size(dtype));
  switch (dtype) {
    case DType::F32: return load<float>(p);
    case DType::F16: return half_to_float(load<uint16_t>(p));
    case DType::BF16: return std::bit_cast<float>(static_cast<uint32_t>(load<uint16_t>(p)) << 16);
    case DType::F64: return load<double>(p);
    case DType::I64: return static_cast<double>(load<int64_t>(p));
    case DType::I32: return load<int32_t>(p);
    case DType::I16: return load<int16_t>(p);
    case DType::I8: return load<int8_t>(p);
    case DType::U8: return load<uint8_t>(p);
    case DType::BOOL: return load<uint8_t>(p);
  }
  return NAN;
}

// Formula values encoded as the dtype's bytes.
std::vector<std::byte> encode(DType dtype, int64_t n) {
  std::vector<std::byte> out(static_cast<size_t>(n) * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) {
    std::byte* p = out.data() + i * static_cast<int64_t>(dtype_size(dtype));
    const double v = formula(dtype, i);
    auto put = [&](auto x) { std::memcpy(p, &x, sizeof(x)); };
    switch (dtype) {
      case DType::F32: put(static_cast<float>(v)); break;
      case DType::F16: {  // the formula's values are k/4 with |k| < 64: exact, normal halves
        if (v == 0) { put(uint16_t{0}); break; }
        int e;
        const double m = std::frexp(std::fabs(v), &e);  // |v| = m * 2^e, m in [0.5, 1)
        const uint16_t bits = static_cast<uint16_t>((v < 0 ? 0x8000 : 0) | ((e - 1 + 15) << 10) |
                                                    static_cast<uint16_t>((m * 2 - 1) * 1024));
        put(bits);
        break;
      }
      case DType::BF16: put(static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(v)) >> 16)); break;
      case DType::F64: put(v); break;
      case DType::I64: put(static_cast<int64_t>(v)); break;
      case DType::I32: put(static_cast<int32_t>(v)); break;
      case DType::I16: put(static_cast<int16_t>(v)); break;
      case DType::I8: put(static_cast<int8_t>(v)); break;
      case DType::U8: case DType::BOOL: put(static_cast<uint8_t>(v)); break;
    }
  }
  return out;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

void expect_formula_values(const SafetensorsFile& f) {
  ASSERT_EQ(f.tensors().size(), kDTypeCases.size());
  for (const auto& c : kDTypeCases) {
    SCOPED_TRACE(c.name);
    const TensorInfo& info = f.at(c.name);
    EXPECT_EQ(info.dtype, c.dtype);
    EXPECT_EQ(info.shape, c.shape);
    ASSERT_EQ(info.numel(), numel(c.shape));
    const auto bytes = f.data(info);
    ASSERT_EQ(bytes.size(), info.numel() * dtype_size(c.dtype));
    for (int64_t i = 0; i < info.numel(); ++i) EXPECT_EQ(element(c.dtype, bytes, i), formula(c.dtype, i)) << "element " << i;
  }
}

void write_formula_file(const std::string& path, const std::map<std::string, std::string>& metadata) {
  std::vector<std::vector<std::byte>> storage;
  std::vector<TensorToWrite> tensors;
  for (const auto& c : kDTypeCases) storage.push_back(encode(c.dtype, numel(c.shape)));
  for (size_t i = 0; i < kDTypeCases.size(); ++i)
    tensors.push_back({kDTypeCases[i].name, kDTypeCases[i].dtype, kDTypeCases[i].shape, storage[i]});
  write_safetensors(path, tensors, metadata);
}

// --- Raw files for the bad-input tests ---------------------------------------------------------

// 8-byte length (or `length_override`), header text, then `data_bytes` zero bytes.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes,
               std::optional<uint64_t> length_override = std::nullopt) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = length_override.value_or(header.size());
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  out << std::string(data_bytes, '\0');
}

std::string open_error(const std::string& path) { return test::error_of([&] { SafetensorsFile::open(path); }); }

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << "message: " << (text)

// --- Round trips ------------------------------------------------------------------------------

TEST(Safetensors, EveryDtypeRoundTripsThroughWriteAndRead) {
  TempDir dir;
  const std::string path = dir / "all.safetensors";
  write_formula_file(path, kMetadata);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  const SafetensorsFile f = SafetensorsFile::open(path);
  expect_formula_values(f);
  EXPECT_EQ(f.metadata(), kMetadata);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.find("absent"), nullptr);
}

TEST(Safetensors, ReadsWhatThePythonPackageWrites) {
  TempDir dir;
  const std::string path = dir / "ref.safetensors";
  ASSERT_EQ(python("write-dtypes", path), 0) << "see " << path << ".log";
  const SafetensorsFile f = SafetensorsFile::open(path);
  expect_formula_values(f);
  EXPECT_EQ(f.metadata(), kMetadata);
}

TEST(Safetensors, ThePythonPackageReadsWhatDeepenWrites) {
  TempDir dir;
  const std::string path = dir / "deepen.safetensors";
  write_formula_file(path, kMetadata);
  EXPECT_EQ(python("check-dtypes", path), 0) << "see " << path << ".log";
}

TEST(Safetensors, DataStartsEightByteAlignedAfterThePaddedHeader) {
  TempDir dir;
  const std::string path = dir / "a.safetensors";
  write_formula_file(path, {});
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
}

TEST(Safetensors, SharedDataKeepsTheMappingAliveAfterTheFileObjectIsGone) {
  TempDir dir;
  const std::string path = dir / "a.safetensors";
  write_formula_file(path, {});
  std::shared_ptr<const std::byte> p;
  {
    const SafetensorsFile f = SafetensorsFile::open(path);
    p = f.shared_data(f.at("f64"));
  }
  EXPECT_EQ(load<double>(p.get() + 8), formula(DType::F64, 1));
}

// --- Sharded checkpoints ----------------------------------------------------------------------

TEST(SafetensorsCheckpoint, ReadsAShardedFolderWrittenByHuggingfaceHub) {
  TempDir dir;
  const std::string folder = dir / "sharded";
  ASSERT_EQ(python("write-sharded", folder), 0) << "see " << folder << ".log";
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(folder);
  ASSERT_EQ(ckpt.names(), (std::vector<std::string>{"model.layers.0.w", "model.layers.1.w", "model.layers.2.w",
                                                     "model.layers.3.w"}));
  EXPECT_TRUE(ckpt.opened_files().empty()) << "no shard is opened before a tensor is asked for";
  std::set<std::string> files;
  for (int layer = 0; layer < 4; ++layer) {
    const std::string name = "model.layers." + std::to_string(layer) + ".w";
    const TensorInfo& info = ckpt.info(name);
    EXPECT_EQ(info.dtype, DType::BF16);
    EXPECT_EQ(info.shape, (std::vector<int64_t>{8, 8}));
    const auto bytes = ckpt.data(name);
    for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(element(DType::BF16, bytes, i), formula(DType::BF16, i) + layer) << name << "[" << i << "]";
    files.insert(ckpt.file_of(name));
  }
  EXPECT_EQ(files.size(), 4u) << "the fixture puts one tensor in each of four shards";
}

// A teacher stage asks only for its layers; the other shards stay closed, even a broken one.
TEST(SafetensorsCheckpoint, OpensOnlyTheShardsHoldingTheTensorsAskedFor) {
  TempDir dir;
  const std::string folder = dir / "sharded";
  ASSERT_EQ(python("write-sharded", folder), 0);
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(folder);
  const std::string last = ckpt.file_of("model.layers.3.w");
  fs::resize_file(last, 3);  // corrupt the shard this "stage" never touches
  ckpt.data("model.layers.0.w");
  EXPECT_EQ(ckpt.opened_files(), (std::vector<std::string>{ckpt.file_of("model.layers.0.w")}));
  try {
    ckpt.info("model.layers.3.w");
    ADD_FAILURE() << "the truncated shard was accepted";
  } catch (const InputError& e) {
    EXPECT_HAS(e.what(), last + ": truncated");
  }
}

TEST(SafetensorsCheckpoint, SingleFileFolderAndLoneFileBothOpen) {
  TempDir dir;
  write_formula_file(dir / "model.safetensors", {});
  for (const std::string& p : {dir.path().string(), dir / "model.safetensors"}) {
    const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(p);
    EXPECT_EQ(ckpt.names().size(), kDTypeCases.size());
    EXPECT_EQ(ckpt.file_of("f32"), dir / "model.safetensors");
    EXPECT_EQ(element(DType::F32, ckpt.data("f32"), 5), formula(DType::F32, 5));
  }
}

// Writes a two-shard folder by hand: a.safetensors holds x, b.safetensors holds y.
void write_two_shards(const TempDir& dir, const nlohmann::json& weight_map) {
  const std::vector<std::byte> bytes = encode(DType::F32, 4);
  write_safetensors(dir / "a.safetensors", {{"x", DType::F32, {4}, bytes}});
  write_safetensors(dir / "b.safetensors", {{"y", DType::F32, {2, 2}, bytes}});
  std::ofstream(dir / "model.safetensors.index.json") << nlohmann::json{{"metadata", {}}, {"weight_map", weight_map}}.dump();
}

std::string checkpoint_error(const std::function<void()>& f) { return test::error_of(f); }

TEST(SafetensorsCheckpoint, MissingTensorIsNamedWithTheFolder) {
  TempDir dir;
  write_two_shards(dir, {{"x", "a.safetensors"}, {"y", "b.safetensors"}});
  const auto ckpt = SafetensorsCheckpoint::open(dir.path().string());
  EXPECT_FALSE(ckpt.contains("z"));
  EXPECT_HAS(checkpoint_error([&] { ckpt.info("z"); }), dir.path().string() + ": tensor z: missing");
  EXPECT_HAS(checkpoint_error([&] { ckpt.data("z"); }), "tensor z: missing");
}

TEST(SafetensorsCheckpoint, TensorListedInTheIndexButAbsentFromItsShardNamesBoth) {
  TempDir dir;
  write_two_shards(dir, {{"x", "a.safetensors"}, {"y", "a.safetensors"}});
  const auto ckpt = SafetensorsCheckpoint::open(dir.path().string());
  const std::string msg = checkpoint_error([&] { ckpt.info("y"); });
  EXPECT_HAS(msg, (dir / "a.safetensors") + ": tensor y: missing (listed in " + (dir / "model.safetensors.index.json") + ")");
}

TEST(SafetensorsCheckpoint, MissingShardFailsOnOpen) {
  TempDir dir;
  write_two_shards(dir, {{"x", "a.safetensors"}, {"y", "c.safetensors"}});
  EXPECT_HAS(checkpoint_error([&] { SafetensorsCheckpoint::open(dir.path().string()); }),
             "model.safetensors.index.json: shard c.safetensors (holding y) does not exist");
}

TEST(SafetensorsCheckpoint, ShardPathLeavingTheFolderIsRejected) {
  TempDir dir;
  write_two_shards(dir, {{"x", "a.safetensors"}, {"y", "../b.safetensors"}});
  EXPECT_HAS(checkpoint_error([&] { SafetensorsCheckpoint::open(dir.path().string()); }),
             "weight_map.y: \"../b.safetensors\" is not a file name in the folder");
}

TEST(SafetensorsCheckpoint, MalformedIndexAndEmptyFolderAreNamed) {
  TempDir dir;
  EXPECT_HAS(checkpoint_error([&] { SafetensorsCheckpoint::open(dir.path().string()); }),
             "not a safetensors checkpoint: neither model.safetensors nor model.safetensors.index.json");
  std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": {";
  EXPECT_HAS(checkpoint_error([&] { SafetensorsCheckpoint::open(dir.path().string()); }),
             "model.safetensors.index.json: malformed JSON");
  EXPECT_HAS(checkpoint_error([&] { SafetensorsCheckpoint::open(dir / "nope"); }), "no such checkpoint folder or file");
}

// --- Bad files --------------------------------------------------------------------------------

TEST(SafetensorsBadInput, TruncatedFile) {
  TempDir dir;
  const std::string path = dir / "t.safetensors";
  std::ofstream(path) << "abc";
  EXPECT_HAS(open_error(path), path + ": truncated: 3 bytes");
  // A whole header whose data section was cut short.
  write_formula_file(path, {});
  fs::resize_file(path, fs::file_size(path) - 5);
  EXPECT_HAS(open_error(path), "truncated");
}

TEST(SafetensorsBadInput, HeaderLengthPastEndOfFile) {
  TempDir dir;
  const std::string path = dir / "h.safetensors";
  write_raw(path, "{}", 0, 4096);
  EXPECT_HAS(open_error(path), path + ": truncated or corrupt: header length 4096 runs past the end of the file (10 bytes)");
}

TEST(SafetensorsBadInput, HeaderOver100MB) {
  TempDir dir;
  const std::string path = dir / "h.safetensors";
  write_raw(path, "{}", 0, 100'000'001);
  EXPECT_HAS(open_error(path), "header length 100000001 exceeds the 100 MB limit");
}

TEST(SafetensorsBadInput, OverlappingOffsets) {
  TempDir dir;
  const std::string path = dir / "o.safetensors";
  write_raw(path,
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
            24);
  EXPECT_HAS(open_error(path), path + ": tensors a [0, 16] and b [8, 24] overlap");
}

TEST(SafetensorsBadInput, OutOfRangeOffsets) {
  TempDir dir;
  const std::string path = dir / "r.safetensors";
  write_raw(path, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[1000,1016]}})", 16);
  EXPECT_HAS(open_error(path), path + ": tensor a: data_offsets [1000, 1016] out of range: the data section is 16 bytes");
  write_raw(path, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8);
  EXPECT_HAS(open_error(path), "tensor a: data_offsets [8, 4]: end before begin");
  write_raw(path, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 0);
  EXPECT_HAS(open_error(path), "tensor a: data_offsets: expected a non-negative integer, got -4");
}

TEST(SafetensorsBadInput, HoleBetweenTensors) {
  TempDir dir;
  const std::string path = dir / "g.safetensors";
  write_raw(path,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
            20);
  EXPECT_HAS(open_error(path), path + ": hole of 4 bytes in the data section before tensor b [12, 20]");
}

TEST(SafetensorsBadInput, TrailingBytesAfterTheLastTensor) {
  TempDir dir;
  const std::string path = dir / "g.safetensors";
  write_raw(path, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12);
  EXPECT_HAS(open_error(path), path + ": file size inconsistent with the header: tensors cover 8 bytes of a 12-byte data section");
}

TEST(SafetensorsBadInput, NumelTimesDtypeSizeMismatch) {
  TempDir dir;
  const std::string path = dir / "n.safetensors";
  write_raw(path, R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,24]}})", 24);
  EXPECT_HAS(open_error(path), path + ": tensor w: data_offsets [0, 24] hold 24 bytes, but shape [2, 3] x BF16 needs 12");
}

TEST(SafetensorsBadInput, UnknownDtype) {
  TempDir dir;
  const std::string path = dir / "d.safetensors";
  write_raw(path, R"({"w":{"dtype":"F8_E9M0","shape":[2],"data_offsets":[0,2]}})", 2);
  EXPECT_HAS(open_error(path), path + ": tensor w: unknown dtype \"F8_E9M0\"");
}

TEST(SafetensorsBadInput, NegativeShapeEntry) {
  TempDir dir;
  const std::string path = dir / "s.safetensors";
  write_raw(path, R"({"w":{"dtype":"F32","shape":[-1,2],"data_offsets":[0,8]}})", 8);
  EXPECT_HAS(open_error(path), path + ": tensor w: shape: expected a non-negative integer, got -1");
}

TEST(SafetensorsBadInput, MalformedJsonHeader) {
  TempDir dir;
  const std::string path = dir / "j.safetensors";
  write_raw(path, R"({"w":{"dtype":"F32",)", 0);
  EXPECT_HAS(open_error(path), path + ": malformed JSON header");
  write_raw(path, R"([1, 2])", 0);
  EXPECT_HAS(open_error(path), path + ": malformed header: expected a JSON object");
  write_raw(path, R"({"w":{"dtype":"F32","shape":[1]}})", 0);
  EXPECT_HAS(open_error(path), path + ": tensor w: data_offsets: missing");
  write_raw(path, R"({"__metadata__":{"a":1}})", 0);
  EXPECT_HAS(open_error(path), path + ": __metadata__.a: expected a string");
}

TEST(SafetensorsBadInput, MissingFileIsNamed) {
  EXPECT_HAS(open_error("/nonexistent/x.safetensors"), "/nonexistent/x.safetensors: cannot open");
}

// --- Writing ------------------------------------------------------------------------------------

TEST(SafetensorsWrite, BadArgumentsAreRejectedAndNothingIsWritten) {
  TempDir dir;
  const std::string path = dir / "w.safetensors";
  const std::vector<std::byte> bytes(12);
  auto error_of = [&](const std::vector<TensorToWrite>& t) {
    return checkpoint_error([&] { write_safetensors(path, t); });
  };
  EXPECT_HAS(error_of({{"a", DType::F32, {2}, bytes}}), "tensor a: 12 bytes given, shape [2] x F32 needs 8");
  EXPECT_HAS(error_of({{"a", DType::F32, {3}, bytes}, {"a", DType::F32, {3}, bytes}}), "tensor a: written twice");
  EXPECT_HAS(error_of({{"a", DType::F32, {-3}, bytes}}), "tensor a: invalid shape [-3]");
  EXPECT_HAS(error_of({{"__metadata__", DType::F32, {3}, bytes}}), "invalid tensor name \"__metadata__\"");
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(SafetensorsWrite, UnwritableFolderThrowsNamingThePathAndLeavesNoTempFile) {
  TempDir dir;
  const std::string path = dir / "missing-folder/w.safetensors";
  try {
    write_safetensors(path, {});
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_HAS(e.what(), path + ": cannot create");
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(SafetensorsWrite, ReplacesAnExistingFileAtomically) {
  TempDir dir;
  const std::string path = dir / "w.safetensors";
  write_formula_file(path, {});
  const auto old = SafetensorsFile::open(path);  // a reader holding the old mapping
  write_safetensors(path, {{"only", DType::U8, {3}, encode(DType::U8, 3)}});
  EXPECT_EQ(SafetensorsFile::open(path).tensors().size(), 1u);
  expect_formula_values(old);  // the old file's inode stays valid under its reader
}

TEST(SafetensorsWrite, EmptyFileIsValid) {
  TempDir dir;
  const std::string path = dir / "e.safetensors";
  write_safetensors(path, {}, {{"k", "v"}});
  const auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.metadata().at("k"), "v");
}

TEST(DType, NamesAndSizesFollowTheFormat) {
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_name(DType::BF16), "BF16");
  for (const auto& c : kDTypeCases) EXPECT_EQ(parse_dtype(dtype_name(c.dtype)), c.dtype);
  EXPECT_THROW(parse_dtype("bf16"), InputError);
  EXPECT_TRUE(is_floating(DType::F16));
  EXPECT_FALSE(is_floating(DType::I32));
}

}  // namespace
}  // namespace deepen
