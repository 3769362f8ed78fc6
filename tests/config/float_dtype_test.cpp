// FloatDtype: the one "fp32" / "bf16" parser, directly and through the config's three dtype keys.
#include <gtest/gtest.h>

#include "config/config.h"
#include "config/float_dtype.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

TEST(FloatDtype, ParsesTheTwoNamesAndPrintsThemBack) {
  EXPECT_EQ(parse_float_dtype("fp32", "k"), FloatDtype::kFp32);
  EXPECT_EQ(parse_float_dtype("bf16", "k"), FloatDtype::kBf16);
  for (FloatDtype d : {FloatDtype::kFp32, FloatDtype::kBf16}) EXPECT_EQ(parse_float_dtype(float_dtype_name(d), "k"), d);
  EXPECT_EQ(float_dtype_bytes(FloatDtype::kFp32), 4);
  EXPECT_EQ(float_dtype_bytes(FloatDtype::kBf16), 2);
  EXPECT_EQ(test::error_of([] { parse_float_dtype("fp16", "x.toml: student.dtype"); }),
            "x.toml: student.dtype: must be \"fp32\" | \"bf16\", got \"fp16\"");
}

TEST(FloatDtype, EveryDtypeKeyOfTheConfigGoesThroughIt) {
  const Config cfg = parse_config("", "d.toml", {"teacher.dtype=bf16", "distill.channel_dtype=bf16",
                                                 "parallel.activation_dtype=bf16"});
  EXPECT_EQ(cfg.teacher.dtype, FloatDtype::kBf16);
  EXPECT_EQ(cfg.distill.channel_dtype, FloatDtype::kBf16);
  EXPECT_EQ(cfg.parallel.activation_dtype, FloatDtype::kBf16);
  EXPECT_EQ(parse_config(to_toml(cfg), "again.toml").teacher.dtype, FloatDtype::kBf16);
  EXPECT_EQ(parse_config("", "d.toml").teacher.dtype, FloatDtype::kFp32);
  for (const char* key : {"teacher.dtype", "distill.channel_dtype", "parallel.activation_dtype"}) {
    EXPECT_EQ(test::error_of([&] { parse_config("", "d.toml", {std::string(key) + "=fp16"}); }),
              std::string("--set ") + key + ": must be \"fp32\" | \"bf16\", got \"fp16\"");
  }
  EXPECT_NE(test::error_of([] { parse_config("[teacher]\ndtype = 16\n", "d.toml"); }).find("d.toml: teacher.dtype: expected a string"),
            std::string::npos);
}

// student.dtype became student.precision: an old config fails naming the key and what to write.
TEST(StudentPrecision, TheOldStudentDtypeKeySaysWhatToWriteInstead) {
  const std::string e = test::error_of([] { parse_config("[student]\ndtype = \"bf16\"\n", "old.toml"); });
  EXPECT_NE(e.find("old.toml: student.dtype: replaced by student.precision"), std::string::npos) << e;
  EXPECT_NE(e.find("precision = \"bf16-pure\" for dtype = \"bf16\""), std::string::npos) << e;
  EXPECT_NE(e.find("precision = \"bf16-mixed\""), std::string::npos) << e;
}

TEST(StudentPrecision, TakesTheThreeNamesAndRejectsOthers) {
  for (const char* p : {"fp32", "bf16-mixed", "bf16-pure"})
    EXPECT_EQ(option_name(parse_config("", "p.toml", {std::string("student.precision=") + p}).student.precision), std::string(p));
  EXPECT_EQ(parse_config("", "p.toml").student.precision, StudentPrecision::kFp32);
  const std::string e = test::error_of([] { parse_config("", "p.toml", {"student.precision=fp16"}); });
  EXPECT_NE(e.find("--set student.precision"), std::string::npos) << e;
  EXPECT_NE(e.find("bf16-mixed"), std::string::npos) << e;
}

}  // namespace
}  // namespace deepen
