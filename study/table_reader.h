// TableReader: the keys of one TOML table of a study or group file, each error naming file and key.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "config/input_error.h"

namespace deepen {

// Reads a table's keys ([study], [[run]], [group]) with errors naming file and key; unknown keys
// are refused, naming the known ones.
class TableReader {
 public:
  TableReader(const toml::table& table, std::string source, std::string where)
      : table_(table), source_(std::move(source)), where_(std::move(where)) {}

  void string(const char* key, std::string& out) {
    known_.insert(key);
    if (const toml::node* n = table_.get(key)) {
      if (!n->is_string()) fail(key, "expected a string");
      out = n->as_string()->get();
    }
  }
  void strings(const char* key, std::vector<std::string>& out) {
    known_.insert(key);
    if (const toml::node* n = table_.get(key)) {
      const toml::array* a = n->as_array();
      if (!a) fail(key, "expected an array of strings");
      out.clear();
      for (const auto& item : *a) {
        if (!item.is_string()) fail(key, "expected an array of strings");
        out.push_back(item.as_string()->get());
      }
    }
  }
  void integers(const char* key, std::vector<int64_t>& out) {
    known_.insert(key);
    if (const toml::node* n = table_.get(key)) {
      const toml::array* a = n->as_array();
      if (!a) fail(key, "expected an array of integers");
      out.clear();
      for (const auto& item : *a) {
        if (!item.is_integer()) fail(key, "expected an array of integers");
        out.push_back(item.as_integer()->get());
      }
    }
  }
  void boolean(const char* key, bool& out) {
    known_.insert(key);
    if (const toml::node* n = table_.get(key)) {
      if (!n->is_boolean()) fail(key, "expected true or false");
      out = n->as_boolean()->get();
    }
  }
  // A key read by hand (a type the reader has no method for) still counts as known.
  void known(const char* key) { known_.insert(key); }
  void reject_unknown() const {
    for (const auto& [k, v] : table_) {
      if (!known_.count(std::string(k.str()))) {
        std::string list;
        for (const auto& key : known_) list += " " + key;
        fail(std::string(k.str()), "unknown key (known keys:" + list + ")");
      }
    }
  }
  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw InputError(source_ + ": " + where_ + "." + key + ": " + why);
  }

 private:
  const toml::table& table_;
  std::string source_;
  std::string where_;
  std::set<std::string> known_;
};

}  // namespace deepen
