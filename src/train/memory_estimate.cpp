// A job's memory from its config (closed forms in double, so absurd sizes cannot overflow),
// what the machine has, and the refusal that names the keys to change.
#include "desloc/train/memory_estimate.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <sstream>

#include "desloc/core/error.hpp"
#include "desloc/model/model.hpp"
#include "desloc/model/param_layout.hpp"

namespace desloc::train {
namespace {

constexpr double kFloat = sizeof(float);
// A checkpoint write holds x, u and v three times: the copy taken from the replicas, the
// serialized payload and the file image (checkpoint.cpp's save_checkpoint).
constexpr double kCheckpointCopies = 3;

// The keys behind the largest term of P = V C + T C + L (12 C^2 + 13 C) + 2 C.
std::string parameter_keys(const model::GptConfig& m) {
  const double V = m.vocab, T = m.context, L = m.layers, C = m.d_model;
  const std::array<std::pair<double, std::string>, 3> terms{{
      {L * (12 * C * C + 13 * C),
       fmt::format("model.layers = {}, model.d_model = {}", m.layers, m.d_model)},
      {V * C, fmt::format("model.vocab = {}, model.d_model = {}", m.vocab, m.d_model)},
      {T * C, fmt::format("model.context = {}, model.d_model = {}", m.context, m.d_model)},
  }};
  return std::max_element(terms.begin(), terms.end(),
                          [](const auto& a, const auto& b) { return a.first < b.first; })
      ->second;
}

// The keys behind the largest term of the activation arena (see cpu_activation_floats): the
// per-layer (B, T, C) tensors, the attention probabilities (B, NH, T, T) or the logits
// (B, T, V).
// The batch is the largest site's (the one the shorthand's data.batch, or a [[job.site]]
// table's batch, gives).
std::string activation_keys(const JobConfig& cfg) {
  const model::GptConfig& m = cfg.model;
  const int batch = cfg.max_batch();
  const std::string key = cfg.job.site.empty() ? fmt::format("data.batch = {}", batch)
                                               : fmt::format("[[job.site]] batch = {}", batch);
  const double B = batch, T = m.context, L = m.layers, C = m.d_model;
  const std::array<std::pair<double, std::string>, 3> terms{{
      {B * T * C * (16 * L + 11),
       fmt::format("{}, model.context = {}, model.layers = {}, model.d_model = {}", key, m.context,
                   m.layers, m.d_model)},
      {B * m.heads * T * T * (L + 1),
       fmt::format("{}, model.heads = {}, model.context = {} (squared), model.layers = {}", key,
                   m.heads, m.context, m.layers)},
      {B * T * m.vocab,
       fmt::format("{}, model.context = {}, model.vocab = {}", key, m.context, m.vocab)},
  }};
  return std::max_element(terms.begin(), terms.end(),
                          [](const auto& a, const auto& b) { return a.first < b.first; })
      ->second;
}

// "MemAvailable:  23456789 kB" -> bytes; negative when absent.
double meminfo_available() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("MemAvailable:")) continue;
    std::istringstream fields(line.substr(13));
    double kb = -1;
    fields >> kb;
    return kb >= 0 ? kb * 1024 : -1;
  }
  return -1;
}

// Headroom (limit - usage) under this process's cgroup memory limit, v2 (memory.max) or v1
// (memory.limit_in_bytes); negative when unlimited or not found. `file` names the limit.
double cgroup_headroom(std::string& file) {
  struct Files {
    std::string limit, usage;
  };
  std::vector<Files> candidates;
  std::ifstream self("/proc/self/cgroup");
  for (std::string line; std::getline(self, line);) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), group = line.substr(b + 1);
    if (controllers.empty())
      candidates.push_back(
          {"/sys/fs/cgroup" + group + "/memory.max", "/sys/fs/cgroup" + group + "/memory.current"});
    else if (("," + controllers + ",").find(",memory,") != std::string::npos)
      candidates.push_back({"/sys/fs/cgroup/memory" + group + "/memory.limit_in_bytes",
                            "/sys/fs/cgroup/memory" + group + "/memory.usage_in_bytes"});
  }
  for (const Files& f : candidates) {
    std::ifstream limit_in(f.limit), usage_in(f.usage);
    std::string limit_text;
    double usage = 0;
    if (!(limit_in >> limit_text) || !(usage_in >> usage) || limit_text == "max") continue;
    std::istringstream number(limit_text);
    double limit = 0;
    if (!(number >> limit)) continue;
    file = f.limit;
    return std::max(0.0, limit - usage);
  }
  return -1;
}

}  // namespace

double MemoryEstimate::bytes() const {
  double steady = 0, transient = 0;
  for (const auto& p : parts) {
    if (p.transient)
      transient = std::max(transient, p.bytes);
    else
      steady += p.bytes;
  }
  return steady + transient;
}

MemoryEstimate estimate_memory(const JobConfig& cfg, ProcessRole role) {
  MemoryEstimate e;
  const double P = model::parameter_count(cfg.model);
  e.parameters = P;
  const std::string pkeys = parameter_keys(cfg.model);
  const bool in_process = role == ProcessRole::kInProcess;
  // Elastic join grows an in-process run to join_workers sites.
  const int sites = in_process ? std::max(cfg.sync.sites, cfg.sync.join_sites) : 1;
  // In one process every rank of every site holds its gradient.
  const int ranks = in_process ? cfg.ranks_of_sites(sites) : 1;
  const bool joins = cfg.sync.join_step > 0 && cfg.sync.join_sites > cfg.sync.sites;
  const std::string site_keys =
      !in_process ? std::string("one site")
                  : fmt::format("{} site{} ({})", sites, sites == 1 ? "" : "s",
                                joins ? "sync.join_workers" : "sync.workers or job.sites");
  e.parts.push_back({fmt::format("the model's parameters and gradients (2 x {:.3g} floats)", P),
                     pkeys, 2 * P * kFloat});
  e.parts.push_back({fmt::format("x, g, u and v of {}", site_keys), pkeys, 4 * P * sites * kFloat});
  if (ranks > sites)
    e.parts.push_back(
        {cfg.job.site.empty()
             ? fmt::format("the gradients of job.ranks_per_site = {} ranks of each "
                           "site",
                           cfg.job.ranks_per_site)
             : fmt::format("the gradients of the sites' {} ranks ([[job.site]])", ranks),
         pkeys, P * ranks * kFloat});
  if (cfg.train.backend == model::Backend::kCpu)
    e.parts.push_back({"activations for the largest site's batch of model.context tokens",
                       activation_keys(cfg),
                       model::cpu_activation_floats(cfg.model, cfg.max_batch()) * kFloat});
  if (!in_process && cfg.job.on_site_failure == train::OnSiteFailure::kContinue &&
      cfg.sync.sites > 1)
    e.parts.push_back({"two recovery snapshots of x, u and v (job.on_site_failure = \"continue\")",
                       pkeys, 2 * 3 * P * kFloat});
  if (cfg.sync.overlaps()) {
    // A delayed average keeps the snapshot and the copy being averaged.
    const std::uint64_t copies = cfg.sync.delays() ? 2 : 1;
    e.parts.push_back(
        {fmt::format("{} of x, u and v of {} for averages that overlap the "
                     "step (sync.overlap = \"{}\")",
                     copies == 2 ? "two copies" : "copies", site_keys, to_string(cfg.sync.overlap)),
         pkeys, copies * 3 * P * sites * kFloat});
  }
  if (cfg.sync.outer != sync::OuterStep::kNone)
    e.parts.push_back(
        {"the outer optimizer's reference and momentum (sync.outer)", pkeys, 2 * P * kFloat});
  e.parts.push_back({fmt::format("a checkpoint write (x, u and v of {}, {} copies)", site_keys,
                                 kCheckpointCopies),
                     pkeys, kCheckpointCopies * 3 * P * sites * kFloat, true});
  std::stable_sort(e.parts.begin(), e.parts.end(),
                   [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  return e;
}

AvailableMemory available_memory() {
  AvailableMemory a;
  a.bytes = meminfo_available();
  a.source = "MemAvailable in /proc/meminfo";
  if (a.bytes < 0) {
    a.bytes = static_cast<double>(::sysconf(_SC_AVPHYS_PAGES)) *
              static_cast<double>(::sysconf(_SC_PAGESIZE));
    a.source = "available pages (sysconf)";
  }
  std::string file;
  const double headroom = cgroup_headroom(file);
  if (headroom >= 0 && (a.bytes <= 0 || headroom < a.bytes)) {
    a.bytes = headroom;
    a.source = "the headroom under " + file;
  }
  return a;
}

void check_memory(const JobConfig& cfg, ProcessRole role, int processes) {
  check_memory(cfg, role, processes, available_memory());
}

void check_memory(const JobConfig& cfg, ProcessRole role, int processes,
                  const AvailableMemory& available) {
  // Unknown (0 or less): nothing to compare with, so no refusal on a guess.
  if (!(available.bytes > 0)) return;
  const MemoryEstimate e = estimate_memory(cfg, role);
  const double need = e.bytes() * std::max(1, processes);
  if (need <= available.bytes) return;
  std::string parts;
  for (std::size_t i = 0; i < e.parts.size() && i < 3; ++i)
    parts += fmt::format("{}{} {} ({})", i == 0 ? "" : "; ", e.parts[i].what,
                         format_bytes(e.parts[i].bytes), e.parts[i].keys);
  const std::string who = processes > 1 ? fmt::format("its {} processes on this machine ({} each)",
                                                      processes, format_bytes(e.bytes()))
                          : role == ProcessRole::kInProcess
                              ? std::string("this process (all sites in one)")
                              : std::string("this rank");
  throw ConfigError(fmt::format(
      "{}: the job needs about {} of memory in {}, {} available ({}). Largest: {}. Reduce one "
      "of {}",
      cfg.source, format_bytes(need), who, format_bytes(available.bytes), available.source, parts,
      e.parts.front().keys));
}

std::string format_bytes(double bytes) {
  constexpr std::array<const char*, 6> kUnits{"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  std::size_t u = 0;
  while (bytes >= 1024 && u + 1 < kUnits.size()) {
    bytes /= 1024;
    ++u;
  }
  if (u == 0) return fmt::format("{:.0f} B", bytes);
  if (bytes >= 1e4) return fmt::format("{:.3g} {}", bytes, kUnits[u]);  // beyond PiB
  return fmt::format("{:.1f} {}", bytes, kUnits[u]);
}

}  // namespace desloc::train
