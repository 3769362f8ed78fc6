// Parquet sources for `deepen prep` through Apache Arrow's C++ Parquet reader (the pinned pyarrow wheel's).
#include "data/parquet_source.h"

#include <arrow/array.h>
#include <arrow/memory_pool.h>
#include <arrow/record_batch.h>
#include <arrow/type.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>
#include <parquet/schema.h>

#include <cctype>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

#include "config/input_error.h"

namespace deepen {
namespace {

// Rows per batch and bytes per read: a FineWeb-Edu row is ~3-5 KB of text, so a batch is a few MB,
// and a 1 MiB buffered stream keeps Arrow from loading a whole column chunk (hundreds of MB in a
// large row group) before decoding its first page.
constexpr int64_t kBatchRows = 1024;
constexpr int64_t kReadBufferBytes = int64_t(1) << 20;

[[noreturn]] void unreadable(const std::string& path, std::string why) {
  // Arrow ends some messages with "\n".
  while (!why.empty() && std::isspace(static_cast<unsigned char>(why.back()))) why.pop_back();
  throw InputError(path + ": not a readable parquet file: " + why);
}

void check(const std::string& path, const ::arrow::Status& st) {
  if (!st.ok()) unreadable(path, st.ToString());
}

// Opening failed: say whether the file is parquet cut short (its leading magic is there, the footer
// is not: an interrupted download or copy) or not parquet at all, before Arrow's own words.
[[noreturn]] void unopenable(const std::string& path, const std::string& why) {
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  in.read(magic, 4);
  if (in.gcount() == 4 && std::memcmp(magic, "PAR1", 4) == 0)
    unreadable(path, "truncated or damaged: it starts as parquet but has no valid footer (" + why + ")");
  unreadable(path, "not parquet: it does not start with the magic \"PAR1\" (" + why + ")");
}

// The file opened for the Arrow reader; Arrow allocates through malloc like the rest of prep (not
// the wheel's jemalloc/mimalloc pool, whose retained arenas would blur the flat-memory measure).
std::unique_ptr<parquet::arrow::FileReader> open_reader(const std::string& path) {
  parquet::ReaderProperties props(::arrow::system_memory_pool());
  props.enable_buffered_stream();
  props.set_buffer_size(kReadBufferBytes);
  parquet::ArrowReaderProperties arrow_props;
  arrow_props.set_batch_size(kBatchRows);
  arrow_props.set_pre_buffer(false);  // pre-buffering reads whole column chunks ahead
  arrow_props.set_use_threads(false); // prep's own workers tokenize; reading stays one thread, in order
  parquet::arrow::FileReaderBuilder builder;
  std::unique_ptr<parquet::arrow::FileReader> reader;
  try {
    const ::arrow::Status opened = builder.OpenFile(path, /*memory_map=*/false, props);
    if (!opened.ok()) unopenable(path, opened.ToString());
    builder.memory_pool(::arrow::system_memory_pool());
    builder.properties(arrow_props);
    check(path, builder.Build(&reader));
  } catch (const parquet::ParquetException& e) {
    unopenable(path, e.what());
  }
  return reader;
}

std::string column_names(const parquet::SchemaDescriptor& schema) {
  std::string names;
  for (int i = 0; i < schema.num_columns() && i < 16; ++i)
    names += (i ? ", " : "") + schema.Column(i)->path()->ToDotString();
  if (schema.num_columns() > 16) names += ", ...";
  return names;
}

bool readable_as_text(const ::arrow::DataType& t, bool integers_allowed) {
  using ::arrow::Type;
  switch (t.id()) {
    case Type::STRING: case Type::BINARY: case Type::LARGE_STRING: case Type::LARGE_BINARY:
    case Type::STRING_VIEW: case Type::BINARY_VIEW:
      return true;
    case Type::DICTIONARY:
      return readable_as_text(*static_cast<const ::arrow::DictionaryType&>(t).value_type(), integers_allowed);
    case Type::INT8: case Type::INT16: case Type::INT32: case Type::INT64:
    case Type::UINT8: case Type::UINT16: case Type::UINT32: case Type::UINT64:
      return integers_allowed;
    default:
      return false;
  }
}

// The leaf index of a top-level column `name`, -1 if the file has none; throws if it is nested or
// of a type prep cannot read as text (as Arrow will read it: a string, maybe dictionary-encoded).
int find_column(const std::string& path, const parquet::SchemaDescriptor& schema, const ::arrow::Schema& arrow_schema,
                const std::string& name, const std::string& key, bool integers_allowed) {
  const int index = schema.ColumnIndex(name);
  if (index < 0) return -1;
  const parquet::ColumnDescriptor* col = schema.Column(index);
  const std::string where = path + ": column \"" + name + "\" (" + key + "): ";
  const std::shared_ptr<::arrow::Field> field = arrow_schema.GetFieldByName(name);
  if (col->max_repetition_level() > 0 || col->path()->ToDotVector().size() != 1 || !field)
    throw InputError(where + "is nested or repeated; prep reads a top-level column with one value per row");
  if (!readable_as_text(*field->type(), integers_allowed))
    throw InputError(where + "has type " + field->type()->ToString() + "; expected " +
                     (integers_allowed ? "a string, binary or integer column" : "a string or binary column"));
  return index;
}

// Row i of a column as bytes: strings and binaries as they are, dictionary values looked up,
// integers in decimal (into `scratch`). Null is "".
std::string_view cell(const ::arrow::Array& a, int64_t i, std::string& scratch) {
  if (a.IsNull(i)) return {};
  using ::arrow::Type;
  auto decimal = [&](auto v) -> std::string_view {
    scratch = std::to_string(v);
    return scratch;
  };
  switch (a.type_id()) {
    case Type::STRING:
    case Type::BINARY:
      return static_cast<const ::arrow::BinaryArray&>(a).GetView(i);
    case Type::LARGE_STRING:
    case Type::LARGE_BINARY:
      return static_cast<const ::arrow::LargeBinaryArray&>(a).GetView(i);
    case Type::STRING_VIEW:
    case Type::BINARY_VIEW:
      return static_cast<const ::arrow::BinaryViewArray&>(a).GetView(i);
    case Type::DICTIONARY: {
      const auto& d = static_cast<const ::arrow::DictionaryArray&>(a);
      return cell(*d.dictionary(), d.GetValueIndex(i), scratch);
    }
    case Type::INT8: return decimal(static_cast<const ::arrow::Int8Array&>(a).Value(i));
    case Type::INT16: return decimal(static_cast<const ::arrow::Int16Array&>(a).Value(i));
    case Type::INT32: return decimal(static_cast<const ::arrow::Int32Array&>(a).Value(i));
    case Type::INT64: return decimal(static_cast<const ::arrow::Int64Array&>(a).Value(i));
    case Type::UINT8: return decimal(static_cast<const ::arrow::UInt8Array&>(a).Value(i));
    case Type::UINT16: return decimal(static_cast<const ::arrow::UInt16Array&>(a).Value(i));
    case Type::UINT32: return decimal(static_cast<const ::arrow::UInt32Array&>(a).Value(i));
    case Type::UINT64: return decimal(static_cast<const ::arrow::UInt64Array&>(a).Value(i));
    default:  // read_parquet_layout admitted only the types above
      throw std::logic_error("parquet: column of Arrow type " + a.type()->ToString() + " read as text");
  }
}

}  // namespace

bool parquet_supported() { return true; }

ParquetLayout read_parquet_layout(const std::string& path, const std::string& text_column,
                                  const std::string& id_column) {
  const std::unique_ptr<parquet::arrow::FileReader> reader = open_reader(path);
  const std::shared_ptr<parquet::FileMetaData> meta = reader->parquet_reader()->metadata();
  const parquet::SchemaDescriptor& schema = *meta->schema();
  std::shared_ptr<::arrow::Schema> arrow_schema;
  try {
    check(path, reader->GetSchema(&arrow_schema));
  } catch (const parquet::ParquetException& e) {
    unreadable(path, e.what());
  }
  ParquetLayout layout;
  layout.rows = meta->num_rows();
  layout.row_groups = meta->num_row_groups();
  layout.text_column = find_column(path, schema, *arrow_schema, text_column, "data.parquet_text_column", false);
  if (layout.text_column < 0)
    throw InputError(path + ": no column \"" + text_column + "\" (data.parquet_text_column); the file has: " +
                     column_names(schema));
  if (!id_column.empty()) layout.id_column = find_column(path, schema, *arrow_schema, id_column, "data.id_field", true);
  return layout;
}

void read_parquet_documents(const std::string& path, const ParquetLayout& layout,
                            const std::function<bool(std::string_view text, std::string_view id)>& document,
                            const std::function<void(int64_t rows)>& progress) {
  const std::unique_ptr<parquet::arrow::FileReader> reader = open_reader(path);
  const std::shared_ptr<parquet::FileMetaData> meta = reader->parquet_reader()->metadata();
  if (meta->num_rows() != layout.rows || meta->num_row_groups() != layout.row_groups)
    unreadable(path, "the file changed while prep was running");
  const parquet::SchemaDescriptor& schema = *meta->schema();
  const std::string text_name = schema.Column(layout.text_column)->name();
  const std::string id_name = layout.id_column >= 0 ? schema.Column(layout.id_column)->name() : "";
  std::vector<int> columns = {layout.text_column};
  if (layout.id_column >= 0) columns.push_back(layout.id_column);

  int64_t rows = 0;
  std::string scratch_text, scratch_id;
  auto check_here = [&](const ::arrow::Status& st) {
    if (!st.ok()) unreadable(path, "row " + std::to_string(rows) + ": " + st.ToString());
  };
  try {
    for (int group = 0; group < layout.row_groups; ++group) {
      // One row group at a time: Arrow's reader then holds only this group's column readers.
      auto batches = reader->GetRecordBatchReader({group}, columns);
      check_here(batches.status());
      for (;;) {
        std::shared_ptr<::arrow::RecordBatch> batch;
        check_here((*batches)->ReadNext(&batch));
        if (!batch) break;
        const std::shared_ptr<::arrow::Array> text = batch->GetColumnByName(text_name);
        const std::shared_ptr<::arrow::Array> id = id_name.empty() ? nullptr : batch->GetColumnByName(id_name);
        if (!text || (!id_name.empty() && !id)) unreadable(path, "a batch lacks the selected columns");
        for (int64_t i = 0; i < batch->num_rows(); ++i) {
          const std::string_view doc = cell(*text, i, scratch_text);
          const std::string_view key = id ? cell(*id, i, scratch_id) : std::string_view{};
          if (!document(doc, key)) return;
        }
        rows += batch->num_rows();
        progress(rows);
      }
    }
  } catch (const parquet::ParquetException& e) {
    unreadable(path, "row " + std::to_string(rows) + ": " + e.what());
  }
  if (rows != layout.rows)
    unreadable(path, "read " + std::to_string(rows) + " rows, the footer says " + std::to_string(layout.rows));
}

}  // namespace deepen
