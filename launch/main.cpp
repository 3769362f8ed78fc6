// deepen: one binary, one subcommand per job; maps errors to exit codes (InputError -> 2).
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "config/input_error.h"
#include "launch/command_line.h"

int main(int argc, char** argv) {
  CLI::App app{"deepen: distil a Qwen3 teacher into a student that grows in depth"};
  app.require_subcommand(1);
  // One line per subcommand; each is defined in launch/cmd_<name>.cpp.
  deepen::register_inspect_command(app);
  deepen::register_forward_command(app);
  deepen::register_export_command(app);
  deepen::register_train_command(app);
  deepen::register_pretrain_command(app);
  deepen::register_study_command(app);
  deepen::register_group_command(app);
  deepen::register_report_command(app);
  deepen::register_plan_command(app);
  deepen::register_demo_command(app);
  deepen::register_prep_command(app);
  deepen::register_tokenize_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? deepen::kExitOk : deepen::kExitBadInput;
  } catch (const deepen::ExitRequest& e) {
    return e.code;
  } catch (const deepen::InputError& e) {
    std::cerr << "deepen: error: " << e.what() << "\n";
    return deepen::kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "deepen: fatal: " << e.what() << "\n";
    return deepen::kExitFailure;
  }
  return deepen::kExitOk;
}
