// One site's replica as this process holds it, and the training state as values: what a
// checkpoint stores, what an elastic rollback restores, what a rejoining site receives. The
// list of replica fields lives here and nowhere else.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "desloc/data/loader.hpp"
#include "desloc/optim/optimizer.hpp"
#include "desloc/sync/compression.hpp"
#include "desloc/sync/outer_optimizer.hpp"
#include "desloc/sync/sync_engine.hpp"
#include "desloc/train/checkpoint.hpp"

namespace desloc::train {

// x, u, v (and the optimizer's step counter) and the data positions of one replica.
struct ReplicaState {
  std::vector<float> x, u, v;
  std::int64_t optim_t = 0;
  std::vector<data::LoaderState> loaders;            // one per rank of the site held here
  std::array<std::vector<float>, 3> codec_feedback;  // x, u, v: error feedback (or empty)
};

// Everything a step changes, for the replicas this process holds.
struct TrainState {
  std::int64_t step = 0;          // optimizer steps completed
  std::uint64_t tokens_seen = 0;  // per site
  std::vector<ReplicaState> replicas;
  std::vector<float> outer_ref, outer_momentum;  // empty without an outer optimizer
  std::array<std::vector<float>, 3> codec_ref;   // x, u, v: compressed states' references
  std::vector<sync::PeriodSwitch> switches;      // the period switches in force
};

// One site: its parameters x, its gradient g, its optimizer (u, v) and the loaders of the
// site's ranks held in this process (R in-process, 1 for a networked rank), with one
// gradient buffer per rank when there are several.
struct SiteReplica {
  std::vector<float> x, g;
  optim::Optimizer opt;
  std::vector<data::DataLoader> loaders;
  std::vector<std::vector<float>> micro_g;  // per-rank gradients when R > 1 in-process

  // Into `s`, reusing its buffers (copy-assignment keeps a vector's memory when it fits).
  void capture(ReplicaState& s) const;
  // Throws DataError when the state's loaders do not match this replica's.
  void restore(ReplicaState state);
  sync::Replica view() { return {x, g, &opt}; }
};

std::vector<sync::Replica> views_of(std::vector<SiteReplica>& sites);

// What travels with the replicas besides x, u and v: the outer optimizer and the compressed
// states' references and error feedback (either may be absent).
struct SharedState {
  sync::OuterNesterov* outer = nullptr;
  sync::CompressionState* compression = nullptr;  // an inactive one is left out
  sync::SyncPolicy* policy = nullptr;             // its period switches (nullptr: left alone)
  // The run's identity (Checkpoint::run_id): a rejoining site takes its donor's. Not part of a
  // captured state: a rollback stays in the same run.
  std::uint64_t* run_id = nullptr;
};

// `reuse`: a state no longer needed (an elastic rollback point about to be dropped), whose
// buffers take the copies: a point kept before every cross-site step is then copied into
// memory already mapped, not into fresh pages the kernel must fault in and clear (3 sites on
// 5 Mbit, streaming int4: about 5 ms a step of copies and page faults on each rank's main
// thread).
TrainState capture_state(std::int64_t step, std::uint64_t tokens_seen,
                         const std::vector<SiteReplica>& sites, SharedState shared,
                         TrainState reuse = {});
// Restores every replica of `state` (sites.size() must equal its replica count), the outer
// optimizer, the compression state and the period switches; returns the state's tokens_seen. Throws
// DataError when the state holds no references for a compressed state (a checkpoint written without
// codecs).
std::uint64_t restore_state(TrainState state, std::vector<SiteReplica>& sites, SharedState shared);

// A checkpoint stores one loader position per replica: a site's ranks read the same number of
// windows per step from equal-sized partitions, so one cursor describes them all (checked:
// throws Error when they differ).
Checkpoint to_checkpoint(const TrainState& state, std::uint64_t config_hash,
                         const std::string& writer);
// `loaders[i]`: replica i's loader count; its loader state is given to each of them.
TrainState from_checkpoint(Checkpoint ck, std::span<const std::size_t> loaders);

}  // namespace desloc::train
