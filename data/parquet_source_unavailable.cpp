// Parquet sources in a build configured without pyarrow: every entry point says how to get them.
#include "data/parquet_source.h"

#include "config/input_error.h"

namespace deepen {
namespace {

[[noreturn]] void unavailable(const std::string& path) {
  throw InputError(path + ": this deepen was built without Apache Parquet (python3 could not import pyarrow "
                          "when CMake ran); run scripts/setup.sh (pip install -r requirements.txt) and rebuild");
}

}  // namespace

bool parquet_supported() { return false; }

ParquetLayout read_parquet_layout(const std::string& path, const std::string&, const std::string&) {
  unavailable(path);
}

void read_parquet_documents(const std::string& path, const ParquetLayout&,
                            const std::function<bool(std::string_view, std::string_view)>&,
                            const std::function<void(int64_t)>&) {
  unavailable(path);
}

}  // namespace deepen
