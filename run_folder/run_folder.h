// RunFolder: the file names of a run folder (run.out_dir), the only code that knows them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace deepen {

// A run folder, as the trainer writes it and the study runner, the report and the planner read it:
//   config.toml              the resolved config (every key), written when the run starts
//   run.json                 tokenizer, teacher, students, schedule, config hash, device
//   metrics.jsonl            one record per optimizer step (run_folder/run_records.h)
//   eval.jsonl               one record per eval point (validation CE and KL)
//   diagnostics.jsonl        one record per diagnostic point (residual RMS, block-boundary RMS per
//                            token type, block removal, identity mapping)
//   final_token_rms.json     every token's RMS at every block boundary of the finished student (the
//                            paper's distribution figure), written at the run's last step
//   active_layer_tokens.json the active-layer-token record (run_folder/active_layer_tokens.h)
//   cpu_kernels/rank<R>.json which fp32 CPU kernels "auto" chose on world rank R (model/cpu_kernel_choice.h);
//                            a resumed rank takes them again, so its rounding repeats the first run's
//   guard.jsonl              what the divergence guard did: skips, rollbacks, stops (run_folder/guard_events.h)
//   verified_shards.json     the token shards (and teacher cache files) this run has verified in full (run_folder/verified_shards.h)
//   control.secret           the control plane's per-job secret (mode 0600), when generated
//   train.log                the run's output when a study or the demo runs it with --log
//   events.out.tfevents.<seconds>.<host>   TensorBoard event files of metrics and eval records, one
//                            per start of the run, with run.tensorboard = true (run_folder/tensorboard_events.h)
//   checkpoints/step_<8 digits>/  student.safetensors, optimizer.safetensors, progress.json and
//                            MANIFEST.json (run_folder/checkpoint_store.h)
//   final/student.safetensors, final/hf/   the finished student and its Hugging Face export
class RunFolder {
 public:
  explicit RunFolder(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }

  std::string config_toml() const { return file("config.toml"); }
  std::string run_json() const { return file("run.json"); }
  std::string metrics_jsonl() const { return file("metrics.jsonl"); }
  std::string eval_jsonl() const { return file("eval.jsonl"); }
  std::string diagnostics_jsonl() const { return file("diagnostics.jsonl"); }
  std::string final_token_rms_json() const { return file("final_token_rms.json"); }
  std::string active_layer_tokens_json() const { return file("active_layer_tokens.json"); }
  std::string control_secret() const { return file("control.secret"); }
  std::string guard_jsonl() const { return file("guard.jsonl"); }
  std::string verified_shards_json() const { return file("verified_shards.json"); }
  std::string lock_file() const { return file(".lock"); }  // run_folder/run_folder_lock.h
  // cpu_kernels/student<S>.json (student S of the run; a single process is student 0) and
  // cpu_kernels/teacher_p<P>_s<S>.json (a teacher stage, in the job's folder): keyed by role, not
  // world rank, so a resumed rank finds its own choices when a study regroups the runs that are left.
  std::string cpu_kernel_choices_student(int64_t student) const;
  std::string cpu_kernel_choices_teacher(int64_t pipeline, int64_t stage) const;
  std::string step_time_jsonl(int world_rank) const;  // step_time/rank<R>.jsonl (run_folder/step_time.h)
  std::string train_log() const { return file("train.log"); }
  // events.out.tfevents.<Unix seconds, 10 digits>.<host>: TensorBoard's own naming (it finds event
  // files by "tfevents" in the name and reads a folder's files in name order).
  std::string tensorboard_events(int64_t unix_seconds, const std::string& host) const;
  static bool is_tensorboard_events(const std::string& file_name);
  // The seconds in such a name; nullopt for any other name.
  static std::optional<int64_t> tensorboard_events_seconds(const std::string& file_name);
  std::string checkpoints() const { return file("checkpoints"); }
  std::string final_dir() const { return file("final"); }
  std::string final_student() const { return file("final/student.safetensors"); }
  std::string final_hf() const { return file("final/hf"); }

  // The payload files of one checkpoint folder (`checkpoint_dir` = checkpoints/step_XXXXXXXX or its
  // temporary twin while it is written).
  static std::string checkpoint_student(const std::string& checkpoint_dir);
  static std::string checkpoint_optimizer(const std::string& checkpoint_dir);
  // Student `rank`'s optimizer shard of a sharded run (parallel.sharding = "grad_op"):
  // optimizer.shard-00001-of-00004.safetensors.
  static std::string checkpoint_optimizer_shard(const std::string& checkpoint_dir, int64_t rank, int64_t ranks);
  static std::string checkpoint_progress(const std::string& checkpoint_dir);

  // Folder names that are never run folders themselves (the report does not descend into them).
  static bool is_inner_folder(const std::string& name) { return name == "checkpoints" || name == "final"; }

 private:
  std::string file(const char* name) const;
  std::string dir_;
};

}  // namespace deepen
