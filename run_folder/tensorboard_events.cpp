// TensorBoard event files: CRC-32C, TFRecord framing, hand-encoded Event protobufs, the file writer.
#include "run_folder/tensorboard_events.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "run_folder/run_folder.h"

namespace deepen {
namespace fs = std::filesystem;

// The protobuf and TFRecord encodings below write numbers in the machine's byte order.
static_assert(std::endian::native == std::endian::little, "the event encoding assumes a little-endian machine");

namespace {

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

template <class T>
void put_fixed(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// A field's key: its number and wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
void put_key(std::string& out, int field, int wire_type) { put_varint(out, static_cast<uint64_t>(field << 3 | wire_type)); }

void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event's fields 1 (wall_time) and 2 (step), which every event carries.
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_key(e, 1, 1);
  put_fixed(e, wall_time);
  put_key(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));  // int64: a negative step would take 10 bytes, as protobuf writes it
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

void add_fields(const nlohmann::json& object, const std::string& prefix, std::vector<Scalar>& out) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string tag = prefix + "/" + it.key();
    if (it.value().is_object())
      add_fields(it.value(), tag, out);
    else if (it.value().is_number())  // booleans are not numbers in nlohmann::json
      out.push_back({tag, it.value().get<double>()});
  }
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  uint32_t c = 0xFFFFFFFFu;
  for (const char ch : bytes) c = table[(c ^ static_cast<uint8_t>(ch)) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t c = crc32c(bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string length;
  put_fixed(length, static_cast<uint64_t>(data.size()));
  std::string record = length;
  put_fixed(record, masked_crc32c(length));
  record.append(data);
  put_fixed(record, masked_crc32c(data));
  return record;
}

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string log;
  put_key(log, 1, 0);
  put_varint(log, 1);  // SessionLog.START
  std::string e = event_head(wall_time, step);
  put_bytes(e, 7, log);
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<Scalar>& scalars) {
  std::string summary;
  for (const Scalar& s : scalars) {
    std::string value;
    put_bytes(value, 1, s.tag);
    put_key(value, 2, 5);
    put_fixed(value, static_cast<float>(s.value));
    put_bytes(summary, 1, value);
  }
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

std::vector<Scalar> numeric_fields(const nlohmann::json& record, const std::string& prefix) {
  nlohmann::json fields = record;
  fields.erase("step");
  std::vector<Scalar> out;
  add_fields(fields, prefix, out);
  return out;
}

void remove_tensorboard_events(const std::string& dir) {
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec))
    if (entry.is_regular_file() && RunFolder::is_tensorboard_events(entry.path().filename().string()))
      fs::remove(entry.path());
}

// A name that sorts after every event file already in the folder, even when this start comes
// within the same second as the last one (a quick resume).
std::string TensorBoardEvents::new_file_name(const std::string& dir) {
  int64_t seconds = static_cast<int64_t>(now_seconds());
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec))
    if (const auto s = RunFolder::tensorboard_events_seconds(entry.path().filename().string()))
      seconds = std::max(seconds, *s + 1);
  return RunFolder(dir).tensorboard_events(seconds, host_name());
}

TensorBoardEvents::TensorBoardEvents(const std::string& dir, std::optional<int64_t> resume_at_step)
    : out_(new_file_name(dir), "a TensorBoard event") {
  write(file_version_event(now_seconds()));
  write(session_start_event(now_seconds(), resume_at_step.value_or(0)));
}

void TensorBoardEvents::scalars(int64_t step, const std::vector<Scalar>& values) {
  write(scalars_event(now_seconds(), step, values));
}

void TensorBoardEvents::write(const std::string& event) { out_.append(tfrecord(event)); }

}  // namespace deepen
