// The memory a job needs in one process, estimated from its config before anything is
// allocated, and the check that refuses a job this machine cannot hold.
#pragma once

#include <string>
#include <vector>

#include "desloc/train/config.hpp"

namespace desloc::train {

// Which process an estimate is for.
enum class ProcessRole {
  kInProcess,  // `desloc train`: every site, and each site's ranks, in this one process
  kRank,       // one networked rank (`desloc worker`); `desloc launch` starts sites x ranks
};

// One kind of buffer, with the config keys that size it.
struct MemoryPart {
  std::string what;        // "x, g, u and v of 2 sites (4 P floats each)"
  std::string keys;        // "model.layers = 100000, model.d_model = 128"
  double bytes = 0;        // double: an absurd config gives a huge figure, never an overflow
  bool transient = false;  // held only while it runs (a checkpoint write)
};

struct MemoryEstimate {
  double parameters = 0;          // P, the model's parameter count
  std::vector<MemoryPart> parts;  // largest first
  // The buffers held throughout plus the largest transient one: the peak.
  double bytes() const;
};

// Host memory, in bytes, of the model's parameters and gradients (2 P floats), the replicas
// (x, g, u, v per site held: 4 P each), per-rank gradients of in-process ranks, the activations
// (CPU backend: model::cpu_activation_floats), a networked rank's two recovery snapshots
// (3 P each), the outer optimizer's two buffers, and, at its peak, a checkpoint write
// (3 copies of x, u and v per site: the copy taken, the payload and the file image).
// Small things (the program, token shards, scratch vectors) are left out.
MemoryEstimate estimate_memory(const JobConfig& cfg, ProcessRole role);

struct AvailableMemory {
  double bytes = 0;
  std::string source;  // where the figure came from, for messages
};

// What this process can allocate now: MemAvailable in /proc/meminfo (else sysconf's available
// pages), lowered to the headroom of a cgroup v2 memory.max when one is set.
AvailableMemory available_memory();

// Throws ConfigError naming cfg.source, the figures and the keys of the largest parts when
// `processes` processes of `role` need more than is available. The CLI calls it before
// anything allocates (train, site, launch, profile, config --check); run_training may call
// it again at its start.
void check_memory(const JobConfig& cfg, ProcessRole role, int processes = 1);
void check_memory(const JobConfig& cfg, ProcessRole role, int processes,
                  const AvailableMemory& available);

// "41.2 GiB", "512.0 MiB", "3.1 TiB".
std::string format_bytes(double bytes);

}  // namespace desloc::train
