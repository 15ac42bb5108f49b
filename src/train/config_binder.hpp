// The config's reading machinery, shared by its parts: config_keys.cpp declares every key
// through a Binder, config_checks.cpp checks the keys against each other, config.cpp reads
// TOML files and config_fingerprint.cpp lists the values that identify a job.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <toml++/toml.h>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/core/toml_number.hpp"
#include "desloc/train/config.hpp"

namespace desloc::train {

// "file:line:column", or just the name for a value that no file holds (a command-line flag).
inline std::string where(const std::string& file, const toml::source_region& r) {
  if (r.begin.line == 0) return file;
  return fmt::format("{}:{}:{}", file, r.begin.line, r.begin.column);
}

// One section ([model], [optim], ...). In read mode it pulls each key out of the table; in
// describe mode it appends "key = default  # doc" lines; in fingerprint mode it lists every
// key's value with its scope (config.hpp's ConfigEntry). Whatever the mode, each key is
// declared exactly once, in config_keys.cpp's bind_* functions.
class Binder {
 public:
  Binder(std::string file, std::string section, const toml::table* table, std::ostream* describe)
      : file_(std::move(file)), section_(std::move(section)), table_(table), describe_(describe) {}
  Binder(std::string section, std::vector<ConfigEntry>* entries)
      : section_(std::move(section)), table_(nullptr), describe_(nullptr), entries_(entries) {}

  void integer(const char* key, int& out, const char* doc, std::int64_t min = INT32_MIN,
               std::int64_t max = INT32_MAX) {
    std::int64_t v = out;
    integer64(key, v, doc, min, max);
    out = static_cast<int>(v);
  }
  void integer64(const char* key, std::int64_t& out, const char* doc, std::int64_t min = INT64_MIN,
                 std::int64_t max = INT64_MAX) {
    if (describe(key, fmt::format("{}", out), doc)) return;
    if (const toml::node* n = take(key)) {
      if (!n->is_integer()) type_error(key, *n, "an integer");
      const std::int64_t v = n->as_integer()->get();
      if (v < min || v > max) range_error(key, *n, fmt::format("{}", v), min, max);
      out = v;
    }
  }
  void unsigned64(const char* key, std::uint64_t& out, const char* doc) {
    std::int64_t v = static_cast<std::int64_t>(out);
    integer64(key, v, doc, 0);
    out = static_cast<std::uint64_t>(v);
  }
  void real(const char* key, float& out, const char* doc, double min = -1e300, double max = 1e300,
            bool min_exclusive = false) {
    if (describe(key, fmt::format("{}", out), doc)) return;
    if (const toml::node* n = take(key)) {
      const std::optional<double> number = toml_number(*n);
      if (!number) type_error(key, *n, "a number");
      const double v = *number;
      // The bounds hold for the float that is stored: 1e-50 is > 0 but becomes 0.0f.
      const double stored = static_cast<float>(v);
      if (!(v >= min && v <= max) || (min_exclusive && (v == min || stored == min))) {
        throw ConfigError(fmt::format("{}: {}.{} = {} is out of range: must be {} {} and <= {}",
                                      where(file_, n->source()), section_, key, v,
                                      min_exclusive ? ">" : ">=", min, max));
      }
      out = static_cast<float>(v);
    }
  }
  void boolean(const char* key, bool& out, const char* doc) {
    if (describe(key, out ? "true" : "false", doc)) return;
    if (const toml::node* n = take(key)) {
      if (!n->is_boolean()) type_error(key, *n, "a boolean (true or false)");
      out = n->as_boolean()->get();
    }
  }
  void string(const char* key, std::string& out, const char* doc,
              std::initializer_list<const char*> choices = {}) {
    if (describe(key, fmt::format("\"{}\"", out), doc)) return;
    if (const toml::node* n = take(key)) {
      if (!n->is_string()) type_error(key, *n, "a string");
      std::string v = n->as_string()->get();
      if (choices.size() > 0) {
        bool ok = false;
        std::string list;
        for (const char* c : choices) {
          ok = ok || v == c;
          list += (list.empty() ? "\"" : ", \"") + std::string(c) + "\"";
        }
        if (!ok)
          throw ConfigError(fmt::format("{}: {}.{} = \"{}\" is not one of {}",
                                        where(file_, n->source()), section_, key, v, list));
      }
      out = std::move(v);
    }
  }

  // One of a few names, bound to the enum value it names (`names`: each name with its value);
  // described, and fingerprinted, by its name.
  template <typename E>
  void choice(const char* key, E& out, const char* doc,
              std::initializer_list<std::pair<const char*, E>> names) {
    std::string current, list;
    for (const auto& [name, value] : names) {
      if (value == out) current = name;
      list += (list.empty() ? "\"" : ", \"") + std::string(name) + "\"";
    }
    if (describe(key, fmt::format("\"{}\"", current), doc)) return;
    const toml::node* n = take(key);
    if (n == nullptr) return;
    if (!n->is_string()) type_error(key, *n, "a string");
    const std::string& v = n->as_string()->get();
    for (const auto& [name, value] : names)
      if (v == name) {
        out = value;
        return;
      }
    throw ConfigError(fmt::format("{}: {}.{} = \"{}\" is not one of {}", where(file_, n->source()),
                                  section_, key, v, list));
  }

  void string_lists(const char* key, std::vector<std::vector<std::string>>& out, const char* doc) {
    std::string text;
    for (const auto& list : out)
      text += fmt::format("{}[{}]", text.empty() ? "" : ", ", fmt::join(list, ", "));
    if (describe(key, "[" + text + "]", doc)) return;
    if (const toml::node* n = take(key)) {
      const toml::array* a = n->as_array();
      if (a == nullptr) type_error(key, *n, "an array of arrays of strings");
      out.clear();
      for (const toml::node& e : *a) {
        const toml::array* inner = e.as_array();
        if (inner == nullptr) type_error(key, e, "an array of arrays of strings");
        out.emplace_back();
        for (const toml::node& s : *inner) {
          if (!s.is_string()) type_error(key, s, "an array of arrays of strings");
          out.back().push_back(s.as_string()->get());
        }
      }
    }
  }

  // An array of inline tables { after = t, kx = k, ku = k, kv = k } (ku and kv optional).
  void period_switches(const char* key, std::vector<sync::PeriodSwitch>& out, const char* doc) {
    std::string text;
    for (const sync::PeriodSwitch& sw : out)
      text += fmt::format("{}{{ after = {}, kx = {}, ku = {}, kv = {} }}", text.empty() ? "" : ", ",
                          sw.after, sw.kx, sw.ku, sw.kv);
    if (describe(key, "[" + text + "]", doc)) return;
    const toml::node* n = take(key);
    if (n == nullptr) return;
    constexpr const char* kShape = "an array of tables such as { after = 96, kx = 64 }";
    const toml::array* a = n->as_array();
    if (a == nullptr) type_error(key, *n, kShape);
    out.clear();
    for (const toml::node& e : *a) {
      const toml::table* t = e.as_table();
      if (t == nullptr) type_error(key, e, kShape);
      sync::PeriodSwitch sw;
      for (auto&& [k, v] : *t) {
        const std::string name(k.str());
        std::int64_t* field = name == "after" ? &sw.after
                              : name == "kx"  ? &sw.kx
                              : name == "ku"  ? &sw.ku
                              : name == "kv"  ? &sw.kv
                                              : nullptr;
        if (field == nullptr)
          throw ConfigError(fmt::format("{}: {}.{}[{}] has an unknown key '{}' (after, kx, ku, kv)",
                                        where(file_, k.source()), section_, key, out.size() + 1,
                                        name));
        if (!v.is_integer()) type_error(key, v, "an integer (after, kx, ku, kv)");
        *field = v.as_integer()->get();
        if (*field < (name == "after" || name == "kx" ? 1 : 0) || *field > INT64_MAX / 6)
          throw ConfigError(fmt::format("{}: {}.{}[{}].{} = {} is out of range [{}, {}]",
                                        where(file_, v.source()), section_, key, out.size() + 1,
                                        name, *field, name == "after" || name == "kx" ? 1 : 0,
                                        INT64_MAX / 6));
      }
      if (sw.after == 0 || sw.kx == 0)
        throw ConfigError(fmt::format("{}: {}.{}[{}] needs both 'after' and 'kx'",
                                      where(file_, e.source()), section_, key, out.size() + 1));
      out.push_back(sw);
    }
  }

  // An array of tables ([[job.site]]) { name = "A", ranks = 2, batch = 8 }, each key required.
  void site_specs(const char* key, std::vector<SiteSpec>& out, const char* doc) {
    std::string text;
    for (const SiteSpec& sp : out)
      text += fmt::format("{}{{ name = \"{}\", ranks = {}, batch = {} }}", text.empty() ? "" : ", ",
                          sp.name, sp.ranks, sp.batch);
    if (describe(key, "[" + text + "]", doc)) return;
    const toml::node* n = take(key);
    if (n == nullptr) return;
    constexpr const char* kShape =
        "an array of tables: [[job.site]] with name = \"A\", ranks = 2, batch = 8";
    const toml::array* a = n->as_array();
    if (a == nullptr) type_error(key, *n, kShape);
    out.clear();
    for (const toml::node& e : *a) {
      const toml::table* t = e.as_table();
      if (t == nullptr) type_error(key, e, kShape);
      const std::size_t i = out.size() + 1;
      SiteSpec sp;
      bool has_name = false, has_ranks = false, has_batch = false;
      for (auto&& [k, v] : *t) {
        const std::string name(k.str());
        if (name == "name") {
          if (!v.is_string()) type_error(key, v, "a string (name)");
          sp.name = v.as_string()->get();
          has_name = true;
          continue;
        }
        int* field = name == "ranks" ? &sp.ranks : name == "batch" ? &sp.batch : nullptr;
        if (field == nullptr)
          throw ConfigError(
              fmt::format("{}: {}.{}[{}] has an unknown key '{}' (name, ranks, batch)",
                          where(file_, k.source()), section_, key, i, name));
        if (!v.is_integer()) type_error(key, v, "an integer (ranks, batch)");
        const std::int64_t value = v.as_integer()->get();
        const std::int64_t most = name == "ranks" ? 1024 : INT32_MAX;
        if (value < 1 || value > most)
          throw ConfigError(fmt::format("{}: {}.{}[{}].{} = {} is out of range [1, {}]",
                                        where(file_, v.source()), section_, key, i, name, value,
                                        most));
        *field = static_cast<int>(value);
        (name == "ranks" ? has_ranks : has_batch) = true;
      }
      if (!has_name || !has_ranks || !has_batch)
        throw ConfigError(fmt::format("{}: {}.{}[{}] needs name, ranks and batch (missing {})",
                                      where(file_, e.source()), section_, key, i,
                                      !has_name    ? "name"
                                      : !has_ranks ? "ranks"
                                                   : "batch"));
      out.push_back(std::move(sp));
    }
  }

  void strings(const char* key, std::vector<std::string>& out, const char* doc) {
    if (describe(key, fmt::format("[{}]", fmt::join(out, ", ")), doc)) return;
    if (const toml::node* n = take(key)) {
      const toml::array* a = n->as_array();
      if (a == nullptr) type_error(key, *n, "an array of strings");
      out.clear();
      for (const toml::node& e : *a) {
        if (!e.is_string()) type_error(key, e, "an array of strings");
        out.push_back(e.as_string()->get());
      }
    }
  }

  // The next key is documented as a comment: it is valid only in some combinations (e.g.
  // desloc-only periods), so the defaults document must not set it.
  void comment_next() { comment_next_ = true; }
  // The next key's scope, when it shapes no number training computes (KeyScope::kTrajectory
  // is every key's unless said otherwise).
  void scope_next(KeyScope scope) { scope_next_ = scope; }

  bool has(const char* key) const { return table_ != nullptr && table_->get(key) != nullptr; }

  // Location of a key that was read, for cross-field errors.
  std::string location_of(const char* key) const {
    if (table_ == nullptr) return file_;
    if (const toml::node* n = table_->get(key)) return where(file_, n->source());
    return file_;
  }

  void reject_unknown_keys() const {
    if (table_ == nullptr) return;
    for (auto&& [k, v] : *table_) {
      if (!used_.contains(std::string(k.str())))
        throw ConfigError(fmt::format(
            "{}: unknown key '{}.{}' (see `desloc config --defaults` for the valid keys)",
            where(file_, k.source()), section_, k.str()));
    }
  }

 private:
  // True in describe and fingerprint modes, after the key's line or entry is written.
  bool describe(const char* key, const std::string& value, const char* doc) {
    const KeyScope scope = std::exchange(scope_next_, KeyScope::kTrajectory);
    if (entries_ != nullptr) {
      entries_->push_back({section_ + "." + key, value, scope});
      return true;
    }
    if (describe_ == nullptr) return false;
    *describe_ << fmt::format("{}{:<18} = {:<18} # {}\n", comment_next_ ? "# " : "", key, value,
                              doc);
    comment_next_ = false;
    return true;
  }
  const toml::node* take(const char* key) {
    used_.insert(key);
    return table_ ? table_->get(key) : nullptr;
  }
  [[noreturn]] void type_error(const char* key, const toml::node& n, const char* expected) const {
    throw ConfigError(
        fmt::format("{}: {}.{} must be {}, got {}", where(file_, n.source()), section_, key,
                    expected, toml::impl::node_type_friendly_names[static_cast<int>(n.type())]));
  }
  [[noreturn]] void range_error(const char* key, const toml::node& n, const std::string& v,
                                std::int64_t min, std::int64_t max) const {
    throw ConfigError(fmt::format("{}: {}.{} = {} is out of range [{}, {}]",
                                  where(file_, n.source()), section_, key, v, min, max));
  }

  std::string file_;
  std::string section_;
  const toml::table* table_;
  std::ostream* describe_;
  std::vector<ConfigEntry>* entries_ = nullptr;
  std::set<std::string> used_;
  bool comment_next_ = false;
  KeyScope scope_next_ = KeyScope::kTrajectory;
};

// One table of the config ([model], [optim], ...) and the function that declares its keys.
struct ConfigSection {
  const char* name;
  std::function<void(Binder&, JobConfig&)> bind;
};
// Every table, in the order of a config file and of `desloc config --defaults`.
const std::vector<ConfigSection>& config_sections();

}  // namespace desloc::train
