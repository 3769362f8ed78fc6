// Padding documents into a micro-batch and weighting micro-batches by their real targets.
#include "train/document_batch.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>

#include "train/micro_batch.h"

namespace deepen {

PaddedDocuments pad_documents(const std::vector<std::vector<int64_t>>& documents, int64_t max_len, int64_t pad_id,
                              int64_t pad_to) {
  if (documents.empty()) throw std::invalid_argument("pad_documents: no documents");
  int64_t longest = 0;
  for (size_t b = 0; b < documents.size(); ++b) {
    const int64_t m = std::min<int64_t>(int64_t(documents[b].size()), max_len);
    if (m < 2)
      throw std::invalid_argument("pad_documents: document " + std::to_string(b) + " has " +
                                  std::to_string(documents[b].size()) + " token(s) (max_len " + std::to_string(max_len) +
                                  "): nothing to predict");
    longest = std::max(longest, m - 1);
  }
  const int64_t rows = int64_t(documents.size()), cols = std::max(longest, pad_to);
  PaddedDocuments out;
  out.inputs = at::full({rows, cols}, pad_id, at::kLong);
  out.labels = at::full({rows, cols}, kIgnoreLabel, at::kLong);
  int64_t* in = out.inputs.data_ptr<int64_t>();
  int64_t* lab = out.labels.data_ptr<int64_t>();
  for (int64_t b = 0; b < rows; ++b) {
    const std::vector<int64_t>& d = documents[size_t(b)];
    const int64_t n = std::min<int64_t>(int64_t(d.size()), max_len) - 1;
    std::copy(d.begin(), d.begin() + n, in + b * cols);
    std::copy(d.begin() + 1, d.begin() + n + 1, lab + b * cols);
  }
  return out;
}

int64_t target_tokens(const at::Tensor& labels) { return labels.ne(kIgnoreLabel).sum().item<int64_t>(); }

double micro_batch_loss_divisor(int64_t tokens, int64_t students, int64_t step_tokens) {
  if (tokens <= 0 || students <= 0 || step_tokens <= 0)
    throw std::invalid_argument("micro_batch_loss_divisor: tokens " + std::to_string(tokens) + ", students " +
                                std::to_string(students) + ", step tokens " + std::to_string(step_tokens));
  return static_cast<double>(step_tokens) / static_cast<double>(tokens * students);
}

}  // namespace deepen
