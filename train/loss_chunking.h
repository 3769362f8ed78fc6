// How many rows the distillation loss takes at a time: from the vocabulary and a memory budget.
#pragma once

#include <cstdint>

namespace deepen {

// The row-chunked loss (train/distill_loss.h) holds rows × vocab × bytes_per_element of chunk
// memory. On a CPU 512 MiB: at Qwen3's vocabulary (151,936) that is 883 rows of fp32 logits, enough
// that the head gradient's accumulation, a read and write of the whole [V, H] gradient per chunk,
// stays small beside the chunk's 2·R·V·H multiply-adds (R/4 FLOP per byte moved: ~220 at R = 883,
// where 2 cores do ~10 FLOP per byte of memory bandwidth), and small beside a host's other memory.
// On a GPU 4 GiB: the ATen path there holds about eight chunk-sized fp32 tensors with full targets
// (32 bytes per element, measured), and an H200 needs ~200 FLOP per byte to stay compute-bound:
// 4 GiB gives 883 rows at V = 151,936 too, under 3% of its 141 GB.
inline constexpr int64_t kLossChunkBudgetBytes = int64_t{512} << 20;
inline constexpr int64_t kLossChunkBudgetBytesGpu = int64_t{4} << 30;
inline constexpr int64_t loss_chunk_budget(bool gpu) { return gpu ? kLossChunkBudgetBytesGpu : kLossChunkBudgetBytes; }

// Bytes per chunk element, by what the chunk must hold (see distill_loss.h, "How it is computed"):
//   fused CPU kernel: 4 (fp32 logits, overwritten by dz) + 4 when the teacher's chunk is made or
//     widened (hidden-state targets; bf16 logits) + 2 when the student multiplies in bf16;
//   ATen ops (other devices, fp64, cpu_kernels = "aten"): the same buffers plus the op sequence's
//     temporaries, measured with loss_memory_bench --kernels aten (2,048 rows x 32,768): 20 bytes
//     per element for CE alone or top-k targets (24.2 in all with the logits), 28 with a full
//     teacher chunk, full or hidden-state targets (32.2, 36.2 with the hidden path's teacher buffer);
//     twice that in fp64.
struct LossChunkShape {
  bool fused = true;
  bool full_teacher = false;    // full or hidden-state targets: a teacher chunk [R, V] is read
  bool teacher_buffer = false;  // hidden-state targets, or bf16 logits widened to fp32
  bool low_precision = false;   // bf16 student: the bf16 GEMM's output
  int64_t compute_bytes = 4;    // 4 (fp32), 8 (fp64)
};
int64_t loss_bytes_per_element(const LossChunkShape& shape);

// Rows per chunk for `rows` rows: `configured` when > 0 (capped at rows), else the most rows whose
// buffers fit `budget` (at least 1), evened out over the chunks that takes, so no chunk is a sliver.
// Example: 1,024 rows, V = 151,936, fp32 logits and targets on CPU (4 bytes): 512 MiB / 607,744 B
// = 883 rows, so 2 chunks, of 512 rows each. 16,384 rows: 19 chunks of 863 (the last 850).
int64_t loss_row_chunk(int64_t rows, int64_t vocab, int64_t bytes_per_element, int64_t configured,
                       int64_t budget = kLossChunkBudgetBytes);

}  // namespace deepen
