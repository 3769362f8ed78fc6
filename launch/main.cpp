// deepen: one binary, one subcommand per job; maps errors to exit codes (config/input_error.h).
#include <algorithm>
#include <exception>
#include <iostream>
#include <vector>

#include <CLI/CLI.hpp>

#include "config/input_error.h"
#include "dist/control/stop_signals.h"
#include "launch/command_line.h"
#include "train/large_buffer_allocator.h"

namespace {

// Runs before the initializers of every shared library deepen loads (ELF runs an executable's
// .preinit_array first): LibTorch's take about a second, and a SIGTERM or SIGUSR1 in that second
// used to kill a rank (exit 143) instead of becoming a coordinated stop. From here on a stop signal
// is kept (dist/control/stop_signals.h); a training job's control plane acts on it, every other
// command gets the default action back as soon as the command line says which it is.
extern "C" void catch_stop_signals_before_libraries_load(int, char**, char**) {
  deepen::control::catch_early_stop_signals();
}
__attribute__((section(".preinit_array"), used)) void (*const preinit_stop_signals)(int, char**, char**) =
    catch_stop_signals_before_libraries_load;

}  // namespace

int main(int argc, char** argv) {
  // Before any tensor: large CPU buffers from kept huge-page mappings (train/large_buffer_allocator.h).
  deepen::install_large_buffer_allocator();
  CLI::App app{"deepen: distil a Qwen3 teacher into a student that grows in depth"};
  app.require_subcommand(1);
  // One line per subcommand; each is defined in launch/cmd_<name>.cpp.
  deepen::register_inspect_command(app);
  deepen::register_forward_command(app);
  deepen::register_export_command(app);
  CLI::App* train = deepen::register_train_command(app);
  CLI::App* pretrain = deepen::register_pretrain_command(app);
  deepen::register_study_command(app);
  deepen::register_group_command(app);
  deepen::register_report_command(app);
  deepen::register_plan_command(app);
  deepen::register_demo_command(app);
  deepen::register_prep_command(app);
  deepen::register_tokenize_command(app);
  deepen::register_cache_command(app);
  // Runs after parsing, before the chosen subcommand's callback: only the training jobs (train,
  // pretrain, and group, the runs sharing one teacher) have a control plane to turn a stop signal
  // into a coordinated stop.
  const std::vector<CLI::App*> jobs = {train, pretrain, app.get_subcommand("group")};
  app.parse_complete_callback([jobs] {
    if (std::none_of(jobs.begin(), jobs.end(), [](const CLI::App* job) { return job->parsed(); }))
      deepen::control::release_early_stop_signals();
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    deepen::control::release_early_stop_signals();
    const int rc = app.exit(e);
    return rc == 0 ? deepen::kExitOk : deepen::kExitBadInput;
  } catch (const deepen::ExitRequest& e) {
    return e.code;
  } catch (const deepen::InputError& e) {
    std::cerr << "deepen: error: " << e.what() << "\n";
    return deepen::kExitBadInput;
  } catch (const deepen::ExitError& e) {
    std::cerr << "deepen: error: " << e.what() << "\n";
    return e.code();
  } catch (const std::exception& e) {
    std::cerr << "deepen: fatal: " << e.what() << "\n";
    return deepen::kExitFailure;
  }
  return deepen::kExitOk;
}
