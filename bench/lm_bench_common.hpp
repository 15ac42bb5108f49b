// Shared pieces of the language-model sync benchmarks: the common small GPT job, the Brown
// corpus on demand, and byte formatting.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "desloc/core/error.hpp"

#include "desloc/data/prepare.hpp"
#include "desloc/train/config.hpp"

namespace desloc::bench {

// A minimal "--name VALUE" parser for the benchmarks: each flag binds to one variable.
class Flags {
 public:
  explicit Flags(std::string usage) : usage_(std::move(usage)) {}
  Flags& add(const char* name, std::string& v) {
    return bind(name, [&v](const char* s) { v = s; });
  }
  Flags& add(const char* name, int& v) {
    return bind(name, [&v](const char* s) { v = std::atoi(s); });
  }
  Flags& add(const char* name, std::int64_t& v) {
    return bind(name, [&v](const char* s) { v = std::atoll(s); });
  }
  Flags& add(const char* name, double& v) {
    return bind(name, [&v](const char* s) {
      char* end = nullptr;
      v = std::strtod(s, &end);
      if (end == s || *end != '\0') throw ConfigError(std::string("bad number '") + s + "'");
    });
  }
  // A comma-separated list of integers, e.g. --kx 16,256.
  Flags& add(const char* name, std::vector<std::int64_t>& v) {
    return bind(name, [&v](const char* s) {
      v.clear();
      for (char* p = const_cast<char*>(s); *p;) {
        v.push_back(std::strtoll(p, &p, 10));
        if (*p == ',')
          ++p;
        else if (*p)
          throw ConfigError(std::string("bad integer list '") + s + "'");
      }
    });
  }
  // A switch without a value, e.g. --codecs.
  Flags& add(const char* name, bool& v) {
    switches_[name] = &v;
    return *this;
  }
  // Throws ConfigError for an unknown flag or a missing value; --help prints the usage and exits.
  void parse(int argc, char** argv) const {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::puts(usage_.c_str());
        std::exit(0);
      }
      if (const auto sw = switches_.find(a); sw != switches_.end()) {
        *sw->second = true;
        continue;
      }
      const auto it = setters_.find(a);
      if (it == setters_.end()) throw ConfigError("unknown option '" + a + "'\n" + usage_);
      if (i + 1 >= argc) throw ConfigError("option " + a + " needs a value");
      it->second(argv[++i]);
    }
  }

 private:
  Flags& bind(const char* name, std::function<void(const char*)> set) {
    setters_[name] = std::move(set);
    return *this;
  }
  std::string usage_;
  std::map<std::string, std::function<void(const char*)>> setters_;
  std::map<std::string, bool*> switches_;
};

// The same small GPT for every method: 2 layers, d_model 64, context 64, byte-level, AdamW
// with global-norm clipping, warmup + cosine. Only [sync] differs between runs.
inline train::JobConfig small_lm_job(const std::string& data_dir, std::int64_t steps,
                                     int eval_every, int threads, int workers) {
  const std::string text = fmt::format(R"([model]
context = 64
layers = 2
heads = 4
d_model = 64
[optim]
name = "adamw"
beta1 = 0.9
beta2 = 0.95
weight_decay = 0.1
clip = "norm"
clip_value = 1.0
[schedule]
kind = "cosine"
lr = 3e-3
warmup = 64
min_lr_ratio = 0.1
[data]
dir = "{}"
batch = 8
seed = 1234
[train]
steps = {}
eval_every = {}
eval_batches = 16
checkpoint_every = 0
log_every = {}
seed = 42
threads = {}
[sync]
workers = {}
)",
                                       data_dir, steps, eval_every,
                                       std::max<std::int64_t>(1, steps / 4), threads, workers);
  return train::parse_config(text, "bench job");
}

inline void ensure_brown(const std::string& dir) {
  if (std::filesystem::exists(std::filesystem::path(dir) / "dataset.toml")) return;
  std::printf("preparing the Brown corpus into %s\n", dir.c_str());
  // Forced: a directory without dataset.toml holds no usable dataset, whatever else is in it.
  data::prepare_corpus({.source = "brown", .out_dir = dir, .force = true});
}

inline std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000.0 && u < 4) {
    b /= 1000.0;
    ++u;
  }
  return fmt::format("{:.3g} {}", b, units[u]);
}

}  // namespace desloc::bench
