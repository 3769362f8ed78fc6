// Parquet sources for `deepen prep`: one document per row from a string column, read a row group at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace deepen {

// False in a build configured without pyarrow (data/parquet_source_unavailable.cpp): then the
// functions below throw an InputError that says how to get parquet support.
bool parquet_supported();

// What prep learns from a parquet file's footer before it writes anything.
struct ParquetLayout {
  int64_t rows = 0;
  int row_groups = 0;
  int text_column = -1;  // leaf column index of the documents
  int id_column = -1;    // leaf column index of the document ids; -1 when the file has none
};

// Reads the footer of `path` and finds `text_column` (a top-level string or binary column) and, if
// the file has it, `id_column` (a top-level string, binary or integer column; "" = never look).
// Throws InputError naming the file, and the column and config key where one is at fault, when the
// file is not a readable parquet file (not parquet, truncated, bad footer) or a column does not fit.
ParquetLayout read_parquet_layout(const std::string& path, const std::string& text_column,
                                  const std::string& id_column);

// Calls `document(text, id)` for every row of `path` in file order. `id` is the row's id as text
// (integers in decimal), empty when the file has no id column or the row's id is null; a null text
// comes as "". Reads one row group at a time, in batches of rows, through a buffered stream, so
// memory stays flat however large the file or its row groups. `progress(rows)` is told the rows read
// so far after each batch. Stops early when `document` returns false. Throws InputError naming the
// file when the data turns out to be unreadable (a corrupt page, a file changed since its layout).
void read_parquet_documents(const std::string& path, const ParquetLayout& layout,
                            const std::function<bool(std::string_view text, std::string_view id)>& document,
                            const std::function<void(int64_t rows)>& progress);

}  // namespace deepen
