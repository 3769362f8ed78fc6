// `deepen prep`: text files, folders, JSONL and parquet -> token shards, with a held-out validation split.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"

namespace deepen {

struct PrepOptions {
  int threads = 0;         // tokenizer threads; 0 = every core (std::thread::hardware_concurrency)
  bool overwrite = false;  // replace the shards already in the output folders (else an InputError)
  int progress = -1;       // progress bar on stderr: -1 = only when stderr is a terminal, 0 = off, 1 = on
};

struct PrepSummary {
  int64_t files = 0;           // files read
  int64_t skipped_files = 0;   // binary files (a NUL byte in the first 8 KiB) left out
  int64_t train_docs = 0, valid_docs = 0;
  int64_t train_tokens = 0, valid_tokens = 0;  // EOS included
  int64_t bytes = 0;           // document bytes tokenized
  double seconds = 0;
  int threads = 0;
  bool valid_fallback = false; // no document hashed into the split, so the last one was held out
  std::vector<std::string> train_shards, valid_shards;
  // "prep: 497 documents (5 held out) from 497 files, 2,676,999 tokens (...), 11.0 MB in 2.1 s (5.2 MB/s)"
  std::string line() const;
};

// Reads every document of cfg.sources in a fixed order (sources as listed; a folder's files sorted
// by path, recursively, hidden ones skipped; a *.jsonl file gives one document per non-empty line,
// the string field cfg.jsonl_field; a *.parquet file one document per row, the column
// cfg.parquet_text_column, streamed a row group at a time (data/parquet_source.h); any other file is
// one document), tokenizes them with cfg.tokenizer on opts.threads threads, appends the tokenizer's
// EOS after each document, and writes shards of cfg.shard_tokens tokens to cfg.train/train-NNNNN.bin
// and cfg.valid/valid-NNNNN.bin, each with its document index (data/token_shards.h: where every
// document ends, so data.packing = "documents" reads documents back without re-tokenizing).
// Empty documents (and null parquet texts) are left out.
//
// A document goes to the validation split when is_validation_document() says so for its id (the
// JSONL field or parquet column cfg.id_field, where the record has one) or else for its text: the
// choice is a hash, so it does not depend on order, threads or the file format, and duplicates
// without ids land in the same split. If valid_fraction > 0 but no document hashed into it, the
// last document is held out instead, so a small corpus still has a validation split. The output is
// byte-identical for any thread count, and the same for a JSONL and a parquet file of the same records.
//
// Nothing is written unless everything succeeds: shards are written under temporary names and
// renamed at the end. Errors (missing source, bad JSONL line, a parquet file that is not one or
// lacks the text column, output folder already holding shards without opts.overwrite, ...) are
// InputErrors naming the key or file and the reason, raised before anything is written where
// possible (parquet footers are all read first).
PrepSummary run_prep(const DataConfig& cfg, const PrepOptions& opts = {});

// The validation decision for one document: hash64(key) mapped to [0, 1) is < valid_fraction, where
// the key is the document's id if it has one, else its text.
bool is_validation_document(std::string_view key, double valid_fraction);

}  // namespace deepen
