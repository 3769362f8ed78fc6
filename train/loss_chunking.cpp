// Row chunking of the distillation loss: a pure function of the shapes (see loss_chunking.h).
#include "train/loss_chunking.h"

#include <algorithm>

namespace deepen {

int64_t loss_bytes_per_element(const LossChunkShape& s) {
  const int64_t buffers = s.compute_bytes + (s.teacher_buffer ? s.compute_bytes : 0) + (s.low_precision ? 2 : 0);
  return s.fused ? buffers : buffers + (s.full_teacher ? 7 : 5) * s.compute_bytes;
}

int64_t loss_row_chunk(int64_t rows, int64_t vocab, int64_t bytes_per_element, int64_t configured, int64_t budget) {
  rows = std::max<int64_t>(rows, 1);
  if (configured > 0) return std::min(configured, rows);
  const int64_t per_row = std::max<int64_t>(1, vocab * bytes_per_element);
  const int64_t most = std::clamp<int64_t>(budget / per_row, 1, rows);
  const int64_t chunks = (rows + most - 1) / most;
  return (rows + chunks - 1) / chunks;
}

}  // namespace deepen
