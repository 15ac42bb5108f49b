// Capture and restore of the training state (replica.hpp).
#include "train/replica.hpp"

#include <fmt/format.h>

#include "desloc/core/error.hpp"

namespace desloc::train {

void SiteReplica::capture(ReplicaState& s) const {
  s.x = x;
  s.u = opt.state().u;
  s.v = opt.state().v;
  s.optim_t = opt.state().t;
  s.loaders.clear();
  for (const auto& l : loaders) s.loaders.push_back(l.state());
  for (auto& f : s.codec_feedback) f.clear();
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

namespace {
constexpr std::array<optim::StateKind, 3> kStates = {optim::StateKind::kX, optim::StateKind::kU,
                                                     optim::StateKind::kV};
}  // namespace

TrainState capture_state(std::int64_t step, std::uint64_t tokens_seen,
                         const std::vector<SiteReplica>& sites, SharedState shared,
                         TrainState reuse) {
  TrainState st = std::move(reuse);
  st.step = step;
  st.tokens_seen = tokens_seen;
  st.replicas.resize(sites.size());
  for (std::size_t w = 0; w < sites.size(); ++w) sites[w].capture(st.replicas[w]);
  st.switches.clear();
  if (shared.policy != nullptr) st.switches = shared.policy->switches();
  st.outer_ref.clear();
  st.outer_momentum.clear();
  if (shared.outer != nullptr) {
    st.outer_ref = shared.outer->reference();
    st.outer_momentum = shared.outer->momentum();
  }
  for (auto& r : st.codec_ref) r.clear();
  const sync::CompressionState* c = shared.compression;
  if (c != nullptr && c->active())
    for (std::size_t k = 0; k < kStates.size(); ++k) {
      st.codec_ref[k] = c->reference(kStates[k]);
      if (!st.codec_ref[k].empty() && c->config().error_feedback)
        for (std::size_t w = 0; w < st.replicas.size(); ++w)
          st.replicas[w].codec_feedback[k] = c->feedback(kStates[k], static_cast<int>(w));
    }
  return st;
}

std::uint64_t restore_state(TrainState state, std::vector<SiteReplica>& sites, SharedState shared) {
  if (state.replicas.size() != sites.size())
    throw DataError(fmt::format("a training state of {} replicas given to {}",
                                state.replicas.size(), sites.size()));
  sync::CompressionState* c = shared.compression;
  if (c != nullptr && c->active()) {
    c->resize(static_cast<int>(sites.size()));
    for (std::size_t k = 0; k < kStates.size(); ++k) {
      std::vector<float>& ref = c->reference(kStates[k]);
      if (ref.empty()) continue;
      if (state.codec_ref[k].size() != ref.size())
        throw DataError(
            fmt::format("the saved state holds no shared reference for the compressed '{}' average "
                        "(written with sync.codec_{} = \"fp32\"?)",
                        optim::to_string(kStates[k]), optim::to_string(kStates[k])));
      ref = std::move(state.codec_ref[k]);
      if (!c->config().error_feedback) continue;
      for (std::size_t w = 0; w < sites.size(); ++w) {
        std::vector<float>& ef = state.replicas[w].codec_feedback[k];
        if (ef.size() != ref.size())
          throw DataError(
              fmt::format("the saved state holds no error feedback for the compressed '{}' average",
                          optim::to_string(kStates[k])));
        c->feedback(kStates[k], static_cast<int>(w)) = std::move(ef);
      }
    }
  }
  for (std::size_t i = 0; i < sites.size(); ++i) sites[i].restore(std::move(state.replicas[i]));
  if (shared.policy != nullptr) shared.policy->restore_switches(state.switches);
  if (shared.outer != nullptr) {
    shared.outer->reference() = std::move(state.outer_ref);
    shared.outer->momentum() = std::move(state.outer_momentum);
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
    ck.sites.push_back({r.optim_t, r.loaders.at(0), r.x, r.u, r.v, r.codec_feedback});
  }
  ck.outer_ref = state.outer_ref;
  ck.outer_momentum = state.outer_momentum;
  ck.codec_ref = state.codec_ref;
  ck.switches = state.switches;
  return ck;
}

TrainState from_checkpoint(Checkpoint ck, std::span<const std::size_t> loaders) {
  if (loaders.size() < ck.sites.size())
    throw DataError(fmt::format("a checkpoint of {} sites given to {} replicas", ck.sites.size(),
                                loaders.size()));
  TrainState st;
  st.step = ck.step;
  st.tokens_seen = ck.tokens_seen;
  for (std::size_t i = 0; i < ck.sites.size(); ++i) {
    SiteState& w = ck.sites[i];
    ReplicaState r;
    r.x = std::move(w.params);
    r.u = std::move(w.u);
    r.v = std::move(w.v);
    r.optim_t = w.optim_t;
    r.loaders.assign(loaders[i], w.loader);
    r.codec_feedback = std::move(w.codec_feedback);
    st.replicas.push_back(std::move(r));
  }
  st.outer_ref = std::move(ck.outer_ref);
  st.outer_momentum = std::move(ck.outer_momentum);
  st.codec_ref = std::move(ck.codec_ref);
  st.switches = std::move(ck.switches);
  return st;
}

}  // namespace desloc::train
