// `deepen cache CONFIG --out DIR`: the teacher once over a run's data, its draws written as a teacher
// cache that later runs train from with no teacher (teacher_cache/cache_writer.h, docs/cache.md).
#include <cstdio>
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "config/input_error.h"
#include "data/tokenizer.h"
#include "dist/run_device.h"
#include "launch/command_line.h"
#include "launch/job_parts.h"
#include "teacher_cache/cache_writer.h"
#include "train/compute_threads.h"

namespace deepen {

void register_cache_command(CLI::App& app) {
  struct CacheCommand {
    ConfigOptions config;
    std::string out;
    std::string part = "0/1";
    bool quiet = false;
  };
  auto opts = std::make_shared<CacheCommand>();
  CLI::App* cmd = app.add_subcommand(
      "cache", "run the teacher over the config's train and validation data once and write a teacher cache "
               "(K draws per token, RS-KD) that runs with distill.source = \"cache\" train from");
  add_config_options(*cmd, opts->config);
  cmd->add_option("--out", opts->out, "the cache folder (default: cache.dir)");
  cmd->add_option("--part", opts->part,
                  "I/N: write only files f with f mod N == I (a Slurm array task: --part $SLURM_ARRAY_TASK_ID/N); "
                  "the part that completes the set writes manifest.json");
  cmd->add_flag("--quiet", opts->quiet, "no progress lines");
  cmd->callback([opts] {
    const Config cfg = load_config(opts->config);
    if (opts->config.dry_run) return;
    CacheWriteOptions w;
    w.out_dir = opts->out.empty() ? cfg.cache.dir : opts->out;
    if (w.out_dir.empty()) throw InputError("deepen cache: give --out DIR (or cache.dir)");
    long long part = 0, parts = 0;
    char tail = 0;
    if (std::sscanf(opts->part.c_str(), "%lld/%lld%c", &part, &parts, &tail) != 2)
      throw InputError("deepen cache: --part " + opts->part + ": expected I/N, e.g. 3/8");
    w.part = part;
    w.parts = parts;
    w.print_progress = !opts->quiet;
    set_compute_threads_checked(cfg.run.threads, "deepen cache");
    const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(cfg.data.tokenizer);
    at::Device device = at::kCPU;
    if (resolve_run_device(cfg.run.device, visible_cuda_devices(), cfg.source) == RunDevice::kCuda) {
      device = at::Device(at::kCUDA, 0);  // a cache task sees its GPU (one task per GPU)
      c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(device);
    }
    if (!opts->quiet) std::cerr << "deepen cache: teacher on " << device.str() << ", writing " << w.out_dir << "\n";
    write_cache(cfg, *tokenizer, w, device);
  });
}

}  // namespace deepen
