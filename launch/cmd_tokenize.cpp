// `deepen tokenize --tokenizer SPEC [--decode]`: stdin text -> ids (or ids -> text), to check a tokenizer.
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "config/input_error.h"
#include "data/tokenizer.h"
#include "launch/command_line.h"

namespace deepen {

void register_tokenize_command(CLI::App& app) {
  struct TokenizeCommand {
    std::string tokenizer;
    bool decode = false;
  };
  auto opts = std::make_shared<TokenizeCommand>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "encode stdin to whitespace-separated token ids on stdout, or decode ids back (--decode)");
  cmd->add_option("--tokenizer", opts->tokenizer, "\"bytes\" or \"qwen3:<path to tokenizer.json>\"")->required();
  cmd->add_flag("--decode", opts->decode, "read ids from stdin and write the text they stand for");
  cmd->callback([opts] {
    const std::unique_ptr<Tokenizer> tok = make_tokenizer(opts->tokenizer);
    std::ios::sync_with_stdio(false);
    const std::string input{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
    if (!opts->decode) {
      const std::vector<int32_t> ids = tok->encode(input);
      std::string out;
      out.reserve(ids.size() * 7);
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ' ';
        out += std::to_string(ids[i]);
      }
      std::cout << out << "\n";
      return;
    }
    std::istringstream in(input);
    std::vector<int32_t> ids;
    std::string word;
    while (in >> word) {
      size_t used = 0;
      long long v = -1;
      try {
        v = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != word.size() || v < 0 || v >= tok->vocab_size())
        throw InputError("stdin: \"" + word + "\" is not a token id of " + tok->name() + " (0 .. " +
                         std::to_string(tok->vocab_size() - 1) + ")");
      ids.push_back(int32_t(v));
    }
    std::cout << tok->decode(ids);
  });
}

}  // namespace deepen
