// Unpacked documents as a micro-batch (right padding, kIgnoreLabel), and the loss weight that makes
// an optimizer step's loss the mean over its real target tokens however they are split.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace deepen {

// Documents (token ids, EOS included) -> inputs and labels [B, T], row b = document b cut to its
// first max_len tokens m_b: inputs its first m_b − 1 tokens, labels its last m_b − 1, then right
// padding to T = max_b(m_b − 1) (or to `pad_to` when that is larger: tests pad further) with
// inputs `pad_id` and labels kIgnoreLabel. A document of fewer than 2 tokens has nothing to
// predict: std::invalid_argument (prep never writes one: every document is text + EOS).
// Example: max_len 4, documents [5 6 7 0] and [8 0], pad_id 0:
//   inputs [[5 6 7], [8 0 0]]   labels [[6 7 0], [0 -1 -1]]
struct PaddedDocuments {
  at::Tensor inputs, labels;  // int64, CPU
};
PaddedDocuments pad_documents(const std::vector<std::vector<int64_t>>& documents, int64_t max_len, int64_t pad_id,
                              int64_t pad_to = 0);

// Positions of `labels` that are targets (label != kIgnoreLabel).
int64_t target_tokens(const at::Tensor& labels);

// The factor a micro-batch's mean loss is multiplied by before backward, so that after the
// students average their gradients the step's gradient is that of the mean loss over all the
// step's real target tokens: tokens_in_micro_batch × students / step_tokens, where step_tokens
// counts every target of the step over all micro-batches and students. Returned as a divisor
// (step_tokens / (tokens × students)) so that packed windows, where every micro-batch holds the same
// count, divide by exactly grad_accum, as before documents existed.
// Example: 2 students, micro-batches of 30 and 10 targets on student 0 and 20, 20 on student 1:
//   step_tokens 80; divisors 80/60, 80/20, 80/40, 80/40; after averaging over the 2 students the
//   weights are 30/80, 10/80, 20/80, 20/80: the token mean. Windows, grad_accum 4: divisor 4.
double micro_batch_loss_divisor(int64_t tokens, int64_t students, int64_t step_tokens);

}  // namespace deepen
