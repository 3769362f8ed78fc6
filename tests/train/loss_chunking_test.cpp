// The loss's rows per chunk: bounded by the memory budget, evened out, configured values honoured.
#include <gtest/gtest.h>

#include "train/loss_chunking.h"

namespace deepen {
namespace {

constexpr int64_t kQwen3Vocab = 151936;

TEST(LossChunking, AutoFitsTheBudgetAndEvensTheChunks) {
  // The header's examples: fp32 logits on CPU, 4 bytes per element.
  EXPECT_EQ(loss_row_chunk(1024, kQwen3Vocab, 4, 0), 512);
  EXPECT_EQ(loss_row_chunk(16384, kQwen3Vocab, 4, 0), 863);
  for (int64_t rows : {1, 7, 883, 884, 1024, 16384, 100000}) {
    for (int64_t bytes : {4, 8, 10, 24, 36}) {
      const int64_t r = loss_row_chunk(rows, kQwen3Vocab, bytes, 0);
      EXPECT_GE(r, 1);
      EXPECT_LE(r, rows);
      EXPECT_LE(r * kQwen3Vocab * bytes, kLossChunkBudgetBytes) << rows << " rows, " << bytes << " B";
      // Evened out: the chunks it takes hold rows to within one of each other.
      const int64_t chunks = (rows + r - 1) / r;
      EXPECT_LE(chunks * r - rows, chunks - 1) << rows << " rows, " << bytes << " B";
    }
  }
  // A budget below one row still takes one row at a time.
  EXPECT_EQ(loss_row_chunk(100, kQwen3Vocab, 4, 0, 1000), 1);
}

TEST(LossChunking, AConfiguredChunkIsTakenAsIs) {
  EXPECT_EQ(loss_row_chunk(1024, kQwen3Vocab, 4, 100), 100);
  EXPECT_EQ(loss_row_chunk(50, kQwen3Vocab, 4, 100), 50);
}

TEST(LossChunking, BytesPerElementFollowTheBuffersTheChunkNeeds) {
  EXPECT_EQ(loss_bytes_per_element({}), 4);                                      // fp32 logits in place
  EXPECT_EQ(loss_bytes_per_element({.full_teacher = true, .teacher_buffer = true}), 8);  // hidden or bf16 targets
  EXPECT_EQ(loss_bytes_per_element({.full_teacher = true, .teacher_buffer = true, .low_precision = true}), 10);
  EXPECT_EQ(loss_bytes_per_element({.fused = false}), 24);                      // ATen ops, CE or top-k
  EXPECT_EQ(loss_bytes_per_element({.fused = false, .full_teacher = true}), 32);  // ATen ops, full targets
  EXPECT_EQ(loss_bytes_per_element({.fused = false, .full_teacher = true, .teacher_buffer = true}), 36);
}

}  // namespace
}  // namespace deepen
