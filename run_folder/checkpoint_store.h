// CheckpointStore: atomic checkpoint folders (temp + rename), a verified manifest, keep-last-K, fallback.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace deepen {

// Layout under <run dir>/checkpoints/:
//   step_00000120/            one finished checkpoint: payload files + MANIFEST.json (written last)
//   step_00000180.tmp-<pid>/  being written by process <pid>; never read; removed on failure, by the
//                             next save of that step, or at start once <pid> no longer runs
//                             (remove_stale_temporaries: a writer killed by -9 leaves it behind)
// MANIFEST.json lists every payload file with its size and hash64 checksum (config/hash.h), plus the step and
// the config hash. A checkpoint is valid only if the manifest parses and every file matches it, so
// a crash mid-write, a truncated file or a flipped bit all read as "invalid", never as data.
class CheckpointStore {
 public:
  explicit CheckpointStore(std::string run_dir, int64_t keep = 3);

  // Writes one checkpoint. `write_payload(tmp_dir)` writes the payload files into tmp_dir; then the
  // store checksums them, writes the manifest, fsyncs and renames tmp_dir to step_<step>. The newest
  // `keep` valid checkpoints are kept. On any failure (disk full, unwritable folder, a throwing
  // payload writer) the temp folder is removed, older checkpoints stay intact, and the exception
  // names the path. Then the newest `keep` kept (verify_sizes; the one just written always). Returns
  // the final folder.
  std::string save(int64_t step, uint64_t config_hash,
                   const std::function<void(const std::string& tmp_dir)>& write_payload);

  struct Found {
    std::string dir;
    int64_t step = 0;
    uint64_t config_hash = 0;
  };
  // The newest checkpoint that verifies. Each newer one that fails verification is reported on
  // stderr ("checkpoint <dir> is corrupt (<reason>); falling back to the previous one").
  std::optional<Found> latest_valid() const;

  // Step and config hash of a checkpoint folder that verified (reads its manifest).
  static Found read(const std::string& dir);

  // Checks one folder against its manifest (every file's size and hash); returns the reason it is
  // invalid, or nullopt.
  static std::optional<std::string> verify(const std::string& dir);
  // The same without reading the files: the manifest parses and every file has its size.
  static std::optional<std::string> verify_sizes(const std::string& dir);

  // Finished checkpoint folders, oldest first (valid or not).
  std::vector<std::string> list() const;

  // Removes the temporary folders of writers that no longer run (step_N.tmp-<pid> whose <pid> is
  // not a live process on this machine) and returns them; one of a live process (another job
  // writing this folder, or this one) stays. At the paper's size each is tens of GB.
  std::vector<std::string> remove_stale_temporaries() const;

  const std::string& root() const { return root_; }

 private:
  void prune(const std::string& just_written) const;
  static std::optional<std::string> check_manifest(const std::string& dir, bool hashes);
  std::string root_;
  int64_t keep_;
};

// "step_00000120": the folder name of the checkpoint taken after step 120.
std::string checkpoint_folder_name(int64_t step);

// hash64 of a file's bytes (the manifest's checksum); throws std::runtime_error naming the path.
uint64_t file_checksum(const std::string& path);

}  // namespace deepen
