// SyncPolicy: the DES-LOC schedule of a job's [sync] settings.
#include "desloc/sync/sync_policy.hpp"

#include <fmt/format.h>

#include "desloc/core/error.hpp"

namespace desloc::sync {

SyncSchedule SyncConfig::schedule() const {
  SyncSchedule s;
  s.method = method;
  s.kx = kx;
  s.ku = effective_ku();
  s.kv = effective_kv();
  s.phase_x = phase_x;
  // favg, favg_reset and local_adam average at x's phase; only desloc has its own u and v.
  s.phase_u = method == SyncMethod::kDesloc ? phase_u : phase_x;
  s.phase_v = method == SyncMethod::kDesloc ? phase_v : phase_x;
  s.fragments = fragments;
  s.fragments_u = fragments_u;
  s.fragments_v = fragments_v;
  return s;
}

SyncSchedule SyncConfig::region_schedule() const {
  SyncSchedule s = schedule();
  s.kx = region_kx;
  s.ku = effective_region_ku();
  s.kv = effective_region_kv();
  // A region's links are fast: its averages carry whole states (fragments stream the job-wide
  // ones).
  s.fragments = 1;
  s.fragments_u = s.fragments_v = 0;
  return s;
}

SyncSchedule SyncConfig::schedule_after(const PeriodSwitch& sw) const {
  SyncSchedule s = schedule();
  const bool desloc = method == SyncMethod::kDesloc;
  s.kx = sw.kx;
  s.ku = !desloc ? sw.kx : sw.ku > 0 ? sw.ku : 3 * sw.kx;
  s.kv = !desloc ? sw.kx : sw.kv > 0 ? sw.kv : 6 * sw.kx;
  s.phase_x = sw.after % s.kx;
  s.phase_u = sw.after % s.ku;
  s.phase_v = sw.after % s.kv;
  return s;
}

CompressionConfig SyncConfig::compression() const {
  CompressionConfig c;
  c.codec[static_cast<std::size_t>(optim::StateKind::kX)] =
      parse_codec(codec_x).value_or(Codec::kFp32);
  c.codec[static_cast<std::size_t>(optim::StateKind::kU)] =
      parse_codec(codec_u).value_or(Codec::kFp32);
  constexpr std::string_view kSqrt = "sqrt-";
  c.sqrt_v = std::string_view(codec_v).starts_with(kSqrt);
  c.codec[static_cast<std::size_t>(optim::StateKind::kV)] =
      parse_codec(c.sqrt_v ? std::string_view(codec_v).substr(kSqrt.size()) : codec_v)
          .value_or(Codec::kFp32);
  if (c.codec[static_cast<std::size_t>(optim::StateKind::kV)] == Codec::kFp32) c.sqrt_v = false;
  c.block = static_cast<std::size_t>(codec_block);
  c.error_feedback = error_feedback;
  return c;
}

SyncPolicy::SyncPolicy(SyncConfig cfg) : cfg_(std::move(cfg)), schedule_(cfg_.schedule()) {
  if (cfg_.regional()) region_ = cfg_.region_schedule();
  for (const PeriodSwitch& sw : cfg_.switches) add_switch(sw);
}

const SyncSchedule& SyncPolicy::schedule_at(std::int64_t t) const {
  // The last switch with after < t; switches are few (kMaxPeriodSwitches).
  for (std::size_t i = switches_.size(); i-- > 0;)
    if (switches_[i].after < t) return after_[i];
  return schedule_;
}

void SyncPolicy::add_switch(const PeriodSwitch& sw) {
  if (switches_.size() >= kMaxPeriodSwitches)
    throw Error(
        fmt::format("a switch of periods after step {} is one more than the {} a "
                    "job keeps",
                    sw.after, kMaxPeriodSwitches));
  if (!switches_.empty() && sw.after <= switches_.back().after)
    throw Error(
        fmt::format("a switch of periods after step {} does not follow the last "
                    "one (after step {})",
                    sw.after, switches_.back().after));
  if (sw.kx < 1 || sw.ku < 0 || sw.kv < 0)
    throw Error(fmt::format("the switch after step {} has periods {}, {}, {}", sw.after, sw.kx,
                            sw.ku, sw.kv));
  if (!schedule_at(sw.after).at(sw.after).x)
    throw Error(
        fmt::format("periods can switch only at a parameter average, and step {} "
                    "has none",
                    sw.after));
  switches_.push_back(sw);
  after_.push_back(cfg_.schedule_after(sw));
}

void SyncPolicy::restore_switches(const std::vector<PeriodSwitch>& switches) {
  const std::vector<PeriodSwitch>& configured = cfg_.switches;
  for (std::size_t i = 0; i < configured.size() && i < switches.size(); ++i)
    if (!(switches[i] == configured[i]))
      throw DataError(fmt::format(
          "the checkpoint's period switch {} (after step {}, kx {}) differs from sync.switches "
          "(after step {}, kx {})",
          i + 1, switches[i].after, switches[i].kx, configured[i].after, configured[i].kx));
  switches_.clear();
  after_.clear();
  for (const PeriodSwitch& sw : switches) add_switch(sw);
  for (std::size_t i = switches.size(); i < configured.size(); ++i) add_switch(configured[i]);
}

SyncDecision SyncPolicy::at(std::int64_t t) const {
  SyncDecision d = schedule_at(t).at(t);
  if (region_) {
    const SyncDecision r = region_->at(t);
    d.x = d.x || r.x;
    d.u = d.u || r.u;
    d.v = d.v || r.v;
  }
  return d;
}

}  // namespace desloc::sync
