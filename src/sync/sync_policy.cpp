// SyncPolicy: the DES-LOC schedule of a job's [sync] settings.
#include "desloc/sync/sync_policy.hpp"

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
}

SyncDecision SyncPolicy::at(std::int64_t t) const {
  SyncDecision d = schedule_.at(t);
  if (region_) {
    const SyncDecision r = region_->at(t);
    d.x = d.x || r.x;
    d.u = d.u || r.u;
    d.v = d.v || r.v;
  }
  return d;
}

}  // namespace desloc::sync
