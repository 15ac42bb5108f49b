// Hierarchical DES-LOC's averagers (regional_averager.hpp).
#include "desloc/sync/regional_averager.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "desloc/core/error.hpp"

namespace desloc::sync {

RegionalAverager::RegionalAverager(Averager& global, Averager& region,
                                   std::vector<int> region_sites)
    : global_(global), region_(region), region_sites_(std::move(region_sites)) {}

void RegionalAverager::set_levels(const SyncDecision& job_wide) {
  levels_ = job_wide;
  levels_step_ = step_;
}

void RegionalAverager::open_step() {
  if (opened_ == step_) return;
  global_.begin_step(step_);
  region_.begin_step(step_);
  opened_ = step_;
}

bool RegionalAverager::job_wide(optim::StateKind kind) const {
  if (levels_step_ != step_)
    throw Error("regional averager: step " + std::to_string(step_) +
                " has averages, and the sync engine did not say which of them are job-wide");
  const SyncDecision& d = levels_;
  switch (kind) {
    case optim::StateKind::kX:
      return d.x;
    case optim::StateKind::kU:
      return d.u;
    case optim::StateKind::kV:
      return d.v;
    default:
      return true;  // the gradient (DDP) has no region level
  }
}

void RegionalAverager::collect_rejections(std::vector<Rejection>& into) {
  for (Rejection r : global_.rejections()) into.push_back(std::move(r));
  global_.clear_rejections();
  for (Rejection r : region_.rejections()) into.push_back(by_job_index(std::move(r)));
  region_.clear_rejections();
}

Rejection RegionalAverager::by_job_index(Rejection r) const {
  if (!region_sites_.empty()) r.site = region_sites_.at(static_cast<std::size_t>(r.site));
  return r;
}

void RegionalAverager::forward_codec(optim::StateKind kind) {
  std::optional<CodecViews>& codec = codec_[static_cast<std::size_t>(kind)];
  if (!codec) return;
  if (!job_wide(kind))
    throw Error("regional averager: step " + std::to_string(step_) +
                " averages a state inside each region, and a region's average is fp32; it "
                "takes no codec");
  global_.set_codec(kind, std::move(*codec));
  codec.reset();
}

void RegionalAverager::average(optim::StateKind kind, std::span<const std::span<float>> local) {
  open_step();
  forward_codec(kind);
  route(kind).average(kind, local);
  collect_rejections(rejections_);
}

void RegionalAverager::average_across_sites(optim::StateKind kind,
                                            std::span<const std::span<float>> local) {
  open_step();
  forward_codec(kind);
  route(kind).average_across_sites(kind, local);
}

void RegionalAverager::complete_average(optim::StateKind kind,
                                        std::span<const std::span<float>> local) {
  open_step();
  route(kind).complete_average(kind, local);
  collect_rejections(rejections_);
}

void RegionalAverager::average_in_regions(std::int64_t t, std::span<const DueAverage> due) {
  if (due.empty()) return;
  region_.begin_step(t);
  region_.exchange_control(due, false);
  for (const DueAverage& d : due) {
    if (d.codec != nullptr)
      throw Error("regional averager: step " + std::to_string(t) +
                  " averages a state inside each region, and a region's average is fp32; it "
                  "takes no codec");
    region_.average(d.kind, d.local);
  }
  for (Rejection r : region_.rejections()) rejections_.push_back(by_job_index(std::move(r)));
  region_.clear_rejections();
}

bool RegionalAverager::exchange_control(std::span<const DueAverage> due, bool stop) {
  open_control(due, stop);
  ControlAnswer answer = close_control();
  record_rejections(answer.rejections);
  if (answer.measure) measure_ = std::move(answer.measure);
  return answer.stop;
}

void RegionalAverager::open_control(std::span<const DueAverage> due, bool stop) {
  open_step();
  std::vector<DueAverage> job, region;
  for (const DueAverage& d : due) (job_wide(d.kind) ? job : region).push_back(d);
  job_open_ = !job.empty();
  region_open_ = !region.empty();
  if (job_open_) global_.open_control(job, stop);
  if (region_open_) region_.open_control(region, false);
}

Averager::ControlAnswer RegionalAverager::close_control() {
  ControlAnswer answer;
  if (job_open_) answer = global_.close_control();
  if (region_open_)
    for (Rejection& r : region_.close_control().rejections)
      answer.rejections.push_back(by_job_index(std::move(r)));
  // What an inner averager recorded itself (GroupedAverager gathers its regions' verdicts into
  // rejections()): nobody else reads those until the thread is joined.
  collect_rejections(answer.rejections);
  job_open_ = region_open_ = false;
  return answer;
}

Traffic RegionalAverager::traffic(int w) const {
  Traffic t = global_.traffic(w);
  Traffic r = region_.traffic(w);
  for (std::size_t k = 0; k < 4; ++k) {  // the region averager's wide-area bytes are the regions'
    r.region_wire[k] += r.wire[k];
    r.wire[k] = 0;
  }
  return t += r;
}

GroupedAverager::GroupedAverager(std::vector<std::vector<int>> groups, int sites,
                                 const ShardMap& map, const PayloadGuard& guard, int lanes,
                                 double lane_share)
    : groups_(std::move(groups)), sites_(sites) {
  averagers_.reserve(groups_.size());
  for (const auto& g : groups_) {
    averagers_.push_back(std::make_unique<VirtualAverager>(
        static_cast<int>(g.size()), SumOrder::kRing, map.subset(g), lanes, lane_share));
    PayloadGuard mine = guard;
    mine.site_names.clear();
    for (int w : g) mine.site_names.push_back(guard.site_name(w));
    averagers_.back()->set_payload_guard(std::move(mine));
  }
}

void GroupedAverager::open_step() {
  if (opened_ == step_) return;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    averagers_[g]->begin_step(step_);
    // Each region weighs its own sites as the job does (set_weights).
    std::vector<double> mine;
    for (int w : groups_[g])
      if (!weights_.empty()) mine.push_back(weights_.at(static_cast<std::size_t>(w)));
    averagers_[g]->set_weights(std::move(mine));
  }
  opened_ = step_;
}

std::vector<std::span<float>> GroupedAverager::subset(
    std::size_t g, std::span<const std::span<float>> local) const {
  if (local.size() != static_cast<std::size_t>(sites_))
    throw Error("grouped averager: got " + std::to_string(local.size()) + " replicas for " +
                std::to_string(sites_) + " sites");
  std::vector<std::span<float>> out;
  for (int w : groups_[g]) out.push_back(local[static_cast<std::size_t>(w)]);
  return out;
}

void GroupedAverager::collect_rejections(std::size_t g) {
  for (Rejection r : averagers_[g]->rejections()) {
    r.site = groups_[g].at(static_cast<std::size_t>(r.site));
    rejections_.push_back(std::move(r));
  }
  averagers_[g]->clear_rejections();
}

void GroupedAverager::average(optim::StateKind kind, std::span<const std::span<float>> local) {
  open_step();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto views = subset(g, local);
    averagers_[g]->average(kind, views);
    collect_rejections(g);
  }
}

bool GroupedAverager::exchange_control(std::span<const DueAverage> due, bool stop) {
  open_step();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    std::vector<std::vector<std::span<float>>> views;
    views.reserve(due.size());
    for (const DueAverage& d : due) views.push_back(subset(g, d.local));
    std::vector<DueAverage> mine;
    for (std::size_t k = 0; k < due.size(); ++k) mine.push_back({due[k].kind, views[k], nullptr});
    averagers_[g]->exchange_control(mine, stop);
    collect_rejections(g);
  }
  return stop;
}

Traffic GroupedAverager::traffic(int w) const {
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (std::size_t i = 0; i < groups_[g].size(); ++i)
      if (groups_[g][i] == w) return averagers_[g]->traffic(static_cast<int>(i));
  throw Error("grouped averager: site " + std::to_string(w) + " is in no region");
}

}  // namespace desloc::sync
