// LogitChannelSender's in-place full logits (logits_buffer + send_logits) between two MPI ranks: the
// teacher side holds at most max_in_flight [rows, V] buffers, reusing finished ones, and every
// message arrives intact with its header (payload dtype: train as channel_dtype, eval as the teacher's).
#include <cstdint>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "dist/communicator.h"
#include "dist/logit_channel.h"
#include "tests/mpi/mpi_test_env.h"

namespace deepen {
namespace {

using test::mpi;
using test::same_bits;

constexpr int kTagHeader = 11, kTagPayload = 12;  // dist/logit_channel.cpp's wire tags
constexpr int64_t kRows = 64, kVocab = 4099;      // 525 KB of bf16: past MPI's eager limit

// Message i's logits: distinct per message, so a buffer overwritten before its send finished shows.
at::Tensor logits_of(int64_t i, at::ScalarType dtype) {
  return (at::arange(kRows * kVocab, at::kFloat).reshape({kRows, kVocab}).fmod(977.0) * 0.25 + static_cast<double>(i))
      .to(dtype);
}

BatchKey key_of(int64_t i) {
  BatchKey k;
  k.kind = i == 5 ? BatchKind::kEval : BatchKind::kTrain;
  k.step = i;
  return k;
}

TEST(LogitChannelInPlace, BuffersAreReusedWithinMaxInFlightAndEveryMessageArrivesIntact) {
  auto world = make_mpi_communicator(mpi());
  if (world->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  constexpr int64_t kMessages = 8, kInFlight = 2;
  ChannelFormat format;
  format.bf16_values = true;    // train batches: bf16 on the wire
  format.teacher_bf16 = false;  // eval batches: fp32, an fp32 teacher's own dtype
  if (world->rank() == 0) {
    LogitChannelSender sender(*world, format, 0, kInFlight);
    EXPECT_EQ(sender.full_logits_dtype(BatchKind::kTrain), at::kBFloat16);
    EXPECT_EQ(sender.full_logits_dtype(BatchKind::kEval), at::kFloat);
    std::set<const void*> train_buffers;
    for (int64_t i = 0; i < kMessages; ++i) {
      const std::vector<Delivery> to{Delivery{0, key_of(i)}};
      at::Tensor buffer = sender.logits_buffer(to, kRows, kVocab);
      ASSERT_EQ(buffer.scalar_type(), i == 5 ? at::kFloat : at::kBFloat16);
      if (i != 5) train_buffers.insert(buffer.data_ptr());
      buffer.copy_(logits_of(i, buffer.scalar_type()));
      sender.send_logits(to, 1000 + static_cast<uint64_t>(i), buffer);
    }
    sender.flush();
    // The train messages went out of kInFlight buffers (+1 after the eval one took a fresh one).
    EXPECT_LE(train_buffers.size(), static_cast<size_t>(kInFlight + 1));
    EXPECT_THROW(sender.send_logits({Delivery{0, key_of(0)}}, 0, at::zeros({kRows, kVocab}, at::kFloat)),
                 std::logic_error);  // fp32 for a bf16 train payload: not a logits_buffer()
  } else {
    for (int64_t i = 0; i < kMessages; ++i) {
      at::Tensor header = at::empty({kHeaderWords}, at::kLong);
      world->recv(header, 0, kTagHeader);
      const int64_t* h = header.data_ptr<int64_t>();
      const at::ScalarType dtype = i == 5 ? at::kFloat : at::kBFloat16;
      EXPECT_EQ(h[2], i);
      EXPECT_EQ(h[5], 1000 + i);
      EXPECT_EQ(h[6], kRows);
      EXPECT_EQ(h[7], i == 5 ? 0 : 1);  // payload: full fp32 (0), full bf16 (1)
      at::Tensor payload = at::empty({kRows, kVocab}, dtype);
      world->recv(payload, 0, kTagPayload);
      EXPECT_TRUE(same_bits(payload, logits_of(i, dtype))) << "message " << i;
    }
  }
}

}  // namespace
}  // namespace deepen
