// TensorBoard event files: a run's scalars written as `tensorboard --logdir` reads them, live.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "run_folder/append_file.h"

namespace deepen {

// No C++ TensorBoard writer is packaged for Debian, and the format is small: an event file is a
// sequence of TFRecords, each holding one `Event` protobuf (tensorflow/core/util/event.proto),
// encoded here by hand. What TensorBoard's reader needs, and all that is written:
//   TFRecord  uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes |
//             data | uint32 masked CRC-32C of the data
//   Event     wall_time (1, double), step (2, int64), and one of file_version (3, string),
//             summary (5) or session_log (7)
//   Summary   value (1, repeated): tag (1, string), simple_value (2, float)
//   SessionLog status (1, enum): START = 1

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum TFRecord frames carry.
// Check value: crc32c("123456789") = 0xE3069283.
uint32_t crc32c(std::string_view bytes);
// TFRecord's masked form: rotated right by 15 bits plus 0xa282ead8 (TensorFlow masks stored CRCs so
// that a CRC of data that itself holds CRCs stays a good check).
uint32_t masked_crc32c(std::string_view bytes);
// One record framed as above.
std::string tfrecord(std::string_view data);

struct Scalar {
  std::string tag;  // e.g. "train/loss"
  double value;     // written as a float: simple_value is 32-bit in the protobuf
};

// Serialized Event protobufs:
// the first event of every file: file_version "brain.Event:2" (version 2 is what makes TensorBoard
// honour SessionLog START, below).
std::string file_version_event(double wall_time);
// SessionLog START at `step`, written at every start of a run. A START after the first one in a
// folder is a restart: TensorBoard drops every event it has read with a step >= `step`, as the run
// folder's JSONL records drop the steps a resumed run redoes. (Its Python loader, `--load_fast=false`,
// takes a run's first START for the initial one and purges only from the second on; its Rust loader
// purges at every START. A START at every start serves both.)
std::string session_start_event(double wall_time, int64_t step);
// A summary of simple_value scalars at `step`.
std::string scalars_event(double wall_time, int64_t step, const std::vector<Scalar>& scalars);

// The numeric fields of a JSON record as scalars tagged "<prefix>/<field>", in the record's order;
// nested objects flatten ("time": {"compute": 0.5} -> "<prefix>/time/compute"); "step" (the event's
// own step), strings, booleans, nulls and arrays are left out.
// Example: {"step": 3, "loss": 2.5, "stage_end": true, "val_kl": null} with prefix "eval" ->
// [{"eval/loss", 2.5}].
std::vector<Scalar> numeric_fields(const nlohmann::json& record, const std::string& prefix);

// Removes every TensorBoard event file directly in `dir` (a fresh run's folder shows only its own
// curves, as its metrics.jsonl does).
void remove_tensorboard_events(const std::string& dir);

// One event file of a run folder, appended to and flushed record by record, so that TensorBoard
// reading the folder live sees each step as it is written. Every start of the run (fresh or
// resumed) opens a new file (RunFolder::tensorboard_events), named so that it sorts after the
// folder's older ones: TensorBoard reads a folder's files in name order.
class TensorBoardEvents {
 public:
  // `resume_at_step`: nullopt for a fresh run, else the first step this start trains (the one after
  // the checkpoint's). The file begins with file_version and a SessionLog START at the first step
  // this start trains (0 when fresh). Every event is one checked write (run_folder/append_file.h):
  // a failure throws std::runtime_error naming the file and the OS's reason, and takes back the
  // event's partial bytes, so TensorBoard never meets a torn record.
  TensorBoardEvents(const std::string& dir, std::optional<int64_t> resume_at_step);

  // One event with the scalars at `step`, written at once.
  void scalars(int64_t step, const std::vector<Scalar>& values);
  const std::string& path() const { return out_.path(); }

 private:
  static std::string new_file_name(const std::string& dir);
  void write(const std::string& event);
  AppendFile out_;
};

}  // namespace deepen
