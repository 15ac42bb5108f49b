// Capture and restore of the training state (replica.hpp).
#include "train/replica.hpp"

#include <fmt/format.h>

#include "desloc/core/error.hpp"

namespace desloc::train {

ReplicaState SiteReplica::capture() const {
  ReplicaState s;
  s.x = x;
  s.u = opt.state().u;
  s.v = opt.state().v;
  s.optim_t = opt.state().t;
  for (const auto& l : loaders) s.loaders.push_back(l.state());
  return s;
}

void SiteReplica::restore(ReplicaState s) {
  if (s.loaders.size() != loaders.size())
    throw DataError(fmt::format("a replica state with {} data loaders given to a replica with {}",
                                s.loaders.size(), loaders.size()));
  x = std::move(s.x);
  opt.state().u = std::move(s.u);
  opt.state().v = std::move(s.v);
  opt.state().t = s.optim_t;
  for (std::size_t i = 0; i < loaders.size(); ++i) loaders[i].restore(s.loaders[i]);
}

std::vector<sync::Replica> views_of(std::vector<SiteReplica>& sites) {
  std::vector<sync::Replica> out;
  out.reserve(sites.size());
  for (auto& s : sites) out.push_back(s.view());
  return out;
}

TrainState capture_state(std::int64_t step, std::uint64_t tokens_seen,
                         const std::vector<SiteReplica>& sites, const sync::OuterNesterov* outer) {
  TrainState st;
  st.step = step;
  st.tokens_seen = tokens_seen;
  for (const auto& s : sites) st.replicas.push_back(s.capture());
  if (outer != nullptr) {
    st.outer_ref = outer->reference();
    st.outer_momentum = outer->momentum();
  }
  return st;
}

std::uint64_t restore_state(TrainState state, std::vector<SiteReplica>& sites,
                            sync::OuterNesterov* outer) {
  if (state.replicas.size() != sites.size())
    throw DataError(fmt::format("a training state of {} replicas given to {}",
                                state.replicas.size(), sites.size()));
  for (std::size_t i = 0; i < sites.size(); ++i) sites[i].restore(std::move(state.replicas[i]));
  if (outer != nullptr) {
    outer->reference() = std::move(state.outer_ref);
    outer->momentum() = std::move(state.outer_momentum);
  }
  return state.tokens_seen;
}

Checkpoint to_checkpoint(const TrainState& state, std::uint64_t config_hash,
                         const std::string& writer) {
  Checkpoint ck;
  ck.config_hash = config_hash;
  ck.writer = writer;
  ck.step = state.step;
  ck.tokens_seen = state.tokens_seen;
  for (const ReplicaState& r : state.replicas) {
    for (const auto& l : r.loaders)
      if (l.epoch != r.loaders[0].epoch || l.cursor != r.loaders[0].cursor)
        throw Error(fmt::format(
            "checkpoint at step {}: the ranks of one site disagree on the data position; "
            "their partitions differ in size (report this with the dataset and batch)",
            state.step));
    ck.workers.push_back({r.optim_t, r.loaders.at(0), r.x, r.u, r.v});
  }
  ck.outer_ref = state.outer_ref;
  ck.outer_momentum = state.outer_momentum;
  return ck;
}

TrainState from_checkpoint(Checkpoint ck, std::size_t loaders) {
  TrainState st;
  st.step = ck.step;
  st.tokens_seen = ck.tokens_seen;
  for (WorkerState& w : ck.workers) {
    ReplicaState r;
    r.x = std::move(w.params);
    r.u = std::move(w.u);
    r.v = std::move(w.v);
    r.optim_t = w.optim_t;
    r.loaders.assign(loaders, w.loader);
    st.replicas.push_back(std::move(r));
  }
  st.outer_ref = std::move(ck.outer_ref);
  st.outer_momentum = std::move(ck.outer_momentum);
  return st;
}

}  // namespace desloc::train
