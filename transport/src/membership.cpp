// The coordinator's membership rules (see membership.hpp), as one deterministic state machine:
// its rules, admission, the ranks' frames and the queries. Time and the recovery epochs are in
// membership_recovery.cpp.
#include "desloc/transport/membership.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iterator>
#include <tuple>

#include "membership_step.hpp"

namespace desloc::transport {

using namespace membership_detail;

MembershipRules MembershipRules::of(const CoordinatorOptions& o) {
  MembershipRules r;
  r.num_sites = o.num_sites;
  r.ranks_per_site = o.ranks_per_site;
  r.site_names = o.site_names;
  r.site_ranks = o.site_ranks;
  r.elastic = o.elastic;
  r.min_sites = o.min_sites;
  r.heartbeat_timeout = o.heartbeat_timeout;
  r.recovery_timeout = o.recovery_timeout;
  r.straggler_ratio = o.straggler_ratio;
  return r;
}

std::size_t MembershipRules::ranks_of(const std::string& site) const {
  return site_rank_count(site_names, site_ranks, ranks_per_site, site);
}

std::size_t MembershipRules::world() const {
  if (site_ranks.empty()) return num_sites * ranks_per_site;
  std::size_t all = 0;
  for (const std::size_t r : site_ranks) all += r;
  return all;
}

std::optional<Straggler> find_straggler(const std::map<RankId, Recover>& reports, double ratio,
                                        const std::map<IpAddress, std::string>& site_at) {
  using std::chrono::milliseconds;
  if (!(ratio > 0.0)) return std::nullopt;
  struct Item {
    std::string from, to;  // `to` empty: the evidence names the sender only
    milliseconds ms{0};
    bool backlog = false;
  };
  std::vector<Item> items;
  std::map<std::string, milliseconds> inside;  // per site, its ranks' longest in the operation
  for (const auto& [id, rep] : reports) {
    milliseconds& in = inside[id.site];
    in = std::max(in, milliseconds(rep.operation_ms));
    std::string to;
    if (const auto it = site_at.find(rep.backlog_peer);
        rep.backlog_peer != kNoAddress && it != site_at.end() && it->second != id.site)
      to = it->second;
    items.push_back({id.site, to, milliseconds(rep.backlog_ms), true});
    items.push_back({id.site, "", milliseconds(rep.send_wait_ms), false});
  }
  if (inside.size() < 2) return std::nullopt;
  std::vector<Straggler> standing;
  for (const auto& [site, unused] : inside) {
    Straggler s{site};
    milliseconds backlog{0};
    for (const Item& i : items) {
      if (i.from != site && i.to != site) {
        s.others = std::max(s.others, i.ms);
        continue;
      }
      if (i.backlog) backlog = std::max(backlog, i.ms);
      // The longest item; at equal lengths the site's own sends before others' to it.
      const bool in = i.from != site;
      if (i.ms > s.evidence || (i.ms == s.evidence && s.inbound && !in)) {
        s.evidence = i.ms;
        s.inbound = in;
      }
    }
    s.backlog = backlog >= kStragglerFloor;
    if (s.evidence < kStragglerFloor ||
        static_cast<double>(s.others.count()) * ratio > static_cast<double>(s.evidence.count()))
      continue;
    bool late = false;  // a send's wait against a site that others entered too late to read
    for (const auto& [other, in] : inside)
      if (other != site && !s.backlog && 2 * in < s.evidence) late = true;
    if (!late) standing.push_back(s);
  }
  if (standing.empty()) return std::nullopt;
  // Both ends of one slow link stand out on the same evidence. At 1% one direction of a link
  // also starves the other's ACKs, so its backlog says little about which end is slow; a
  // backlog on another link of one end does: a throttled ingress also slows the data a third
  // site sends there, a throttled egress what it sends to a third site. So the end with such
  // a backlog (at least kStragglerFloor, and longer than the other end's), else the sender.
  const auto corroboration = [&](const Straggler& s) {
    milliseconds most{0};
    for (const Item& i : items) {
      if (!i.backlog || i.to.empty() || (i.from != s.site && i.to != s.site)) continue;
      const std::string& far = i.from == s.site ? i.to : i.from;
      const bool far_stands = std::any_of(standing.begin(), standing.end(),
                                          [&](const Straggler& o) { return o.site == far; });
      if (!far_stands) most = std::max(most, i.ms);
    }
    return most >= kStragglerFloor ? most : milliseconds{0};
  };
  for (Straggler& s : standing) s.corroboration = corroboration(s);
  return *std::min_element(standing.begin(), standing.end(), [](const auto& a, const auto& b) {
    return std::tie(b.evidence, b.corroboration, a.inbound) <
           std::tie(a.evidence, a.corroboration, b.inbound);
  });
}

std::map<IpAddress, std::string> site_addresses(const std::map<RankId, RankRecord>& ranks) {
  std::map<IpAddress, std::string> out;
  std::set<IpAddress> shared;
  for (const auto& [id, r] : ranks) {
    if (r.address == kNoAddress) continue;
    const auto [it, fresh] = out.emplace(r.address, id.site);
    if (!fresh && it->second != id.site) shared.insert(r.address);
  }
  for (const IpAddress& a : shared) out.erase(a);
  return out;
}

std::optional<std::int64_t> common_rollback_step(
    const std::vector<std::vector<std::int64_t>>& offers) {
  std::optional<std::set<std::int64_t>> common;
  for (const auto& offer : offers) {
    std::set<std::int64_t> mine(offer.begin(), offer.end());
    if (!common) {
      common = std::move(mine);
      continue;
    }
    std::set<std::int64_t> both;
    std::set_intersection(common->begin(), common->end(), mine.begin(), mine.end(),
                          std::inserter(both, both.end()));
    common = std::move(both);
  }
  if (!common || common->empty()) return std::nullopt;
  return *common->rbegin();
}

MembershipDecision Roster::on(const MembershipEvent& event) {
  const Clock::time_point now = std::visit([](const auto& e) { return e.now; }, event);
  Step step(*this, now);
  std::visit(
      [&](const auto& e) {
        using E = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<E, HelloEvent>) step.hello(e);
        if constexpr (std::is_same_v<E, HeartbeatEvent>) step.heartbeat(e);
        if constexpr (std::is_same_v<E, ByeEvent>) step.bye(e);
        if constexpr (std::is_same_v<E, RecoverEvent>) step.recover(e);
        if constexpr (std::is_same_v<E, ClosedEvent>) step.closed(e);
        if constexpr (std::is_same_v<E, TickEvent>) step.tick();
      },
      event);
  return std::move(step.out);
}

// ---------------------------------------------------------------------------- admission

void Roster::Step::hello(const HelloEvent& e) {
  out.reject = admit(e);
  if (!out.reject) welcome(e);
}

std::optional<Reject> Roster::Step::admit(const HelloEvent& e) {
  const RankId& id = e.id;
  RankRecord fresh{e.peer, e.worker_address, e.connection, e.now, e.address};
  if (e.epoch > 0) {
    // A rank that trains in epoch e.epoch lost its coordinator and reconnects.
    if (s_.membership) {
      const auto it = s_.ranks.find(id);
      if (it != s_.ranks.end() && !it->second.connected() && !s_.failing_sites.contains(id.site) &&
          !it->second.joining) {
        auto& r = it->second;  // a broken connection to this same coordinator
        r.peer = e.peer;
        r.address = e.address;
        r.connection = e.connection;
        r.last_seen = e.now;
        r.silent = false;
        return std::nullopt;
      }
      return Reject{RejectCode::kWorldSize,
                    fmt::format("{} reconnects at epoch {}, but it is not a live member of this "
                                "coordinator's epoch {}",
                                id.str(), e.epoch, s_.membership->epoch)};
    }
    if (s_.ranks.contains(id))
      return Reject{RejectCode::kDuplicate, fmt::format("{} is already registered", id.str())};
    // A restarted coordinator: the membership is rebuilt from the ranks that come back.
    fresh.rebuilt_epoch = e.epoch;
    s_.ranks[id] = std::move(fresh);
    s_.rebuild_epoch = std::max(s_.rebuild_epoch, e.epoch);
    s_.last_rebuild_registration = e.now;
    return std::nullopt;
  }
  if (s_.rebuild_epoch > 0)
    return Reject{RejectCode::kWorldSize,
                  fmt::format("{} registers afresh, but this coordinator is rebuilding the "
                              "membership of a running job (epoch {})",
                              id.str(), s_.rebuild_epoch)};
  if (const auto d = s_.departed.find(id.site); d != s_.departed.end()) {
    // A restarted site rejoins: once all its ranks are here, the next epoch takes it in.
    if (!rules_.elastic)
      return Reject{RejectCode::kWorldSize,
                    fmt::format("site '{}' left this job ({}) and the job does not take sites "
                                "back (job.on_site_failure = \"stop\")",
                                id.site, d->second)};
    if (const auto it = s_.ranks.find(id); it != s_.ranks.end())
      return Reject{RejectCode::kDuplicate,
                    fmt::format("{} is already rejoining from {}", id.str(), it->second.peer)};
    fresh.joining = true;
    s_.ranks[id] = std::move(fresh);
    return std::nullopt;
  }
  std::set<std::string> sites;
  for (const auto& [k, v] : s_.ranks) sites.insert(k.site);
  if (!rules_.site_names.empty() && !contains(rules_.site_names, id.site))
    return Reject{RejectCode::kWorldSize,
                  fmt::format("site '{}' is not one of the job's sites ({})", id.site,
                              fmt::join(rules_.site_names, ", "))};
  if (!sites.contains(id.site) && sites.size() >= rules_.num_sites)
    return Reject{RejectCode::kWorldSize,
                  fmt::format("site '{}' would be site number {} but the job expects {} sites "
                              "({}); check the world size in the config",
                              id.site, sites.size() + 1, rules_.num_sites, fmt::join(sites, ", "))};
  if (s_.membership && !s_.ranks.contains(id))
    return Reject{RejectCode::kWorldSize,
                  fmt::format("{} cannot join: the job already runs (membership epoch {})",
                              id.str(), s_.membership->epoch)};
  if (const auto it = s_.ranks.find(id); it != s_.ranks.end())
    return Reject{RejectCode::kDuplicate,
                  fmt::format("{} is already registered from {}; each (site, rank) must be "
                              "unique",
                              id.str(), it->second.peer)};
  s_.ranks[id] = std::move(fresh);
  return std::nullopt;
}

// After admission: the Welcome, then what the registration changes.
void Roster::Step::welcome(const HelloEvent& e) {
  const RankId& id = e.id;
  const RankRecord& r = s_.ranks.at(id);
  send({id}, Welcome{fmt::format("registered {}", id.str())});
  if (e.epoch > 0) {
    say(log::Level::kInfo, fmt::format("{} reconnected from {} at epoch {}", id.str(), r.peer,
                                       s_.membership ? s_.membership->epoch : r.rebuilt_epoch));
  } else if (r.joining) {
    std::size_t here = 0;
    for (const auto& [k, v] : s_.ranks)
      if (k.site == id.site && v.joining && v.connected()) ++here;
    say(log::Level::kInfo, fmt::format("{} rejoins from {} ({}/{} of its site)", id.str(), r.peer,
                                       here, rules_.ranks_of(id.site)));
    send({id}, roster_.status());
    if (here == rules_.ranks_of(id.site))
      begin_recovery(fmt::format("site {} rejoins", id.site), "");
  } else if (s_.ranks.size() < rules_.world() || s_.membership) {
    say(log::Level::kInfo, fmt::format("registered {} from {} ({}/{})", id.str(), r.peer,
                                       s_.ranks.size(), rules_.world()));
    send({id}, roster_.status());
  } else {
    form_first_epoch();
  }
}

// Every rank is here: epoch 1. The ring follows the configured site order (the planner's
// choice); without one, the names sorted.
void Roster::Step::form_first_epoch() {
  Membership m;
  m.epoch = 1;
  if (!rules_.site_names.empty()) {
    m.sites = rules_.site_names;
  } else {
    std::set<std::string> sites;
    for (const auto& [k, v] : s_.ranks) sites.insert(k.site);
    m.sites.assign(sites.begin(), sites.end());
  }
  std::vector<RankId> to;
  for (const auto& [k, v] : s_.ranks) {
    m.members.push_back({k.site, k.rank, v.worker_address});
    if (v.connected()) to.push_back(k);
  }
  m.ring_order = ring_of(m.sites.size());
  s_.membership = m;
  say(log::Level::kInfo,
      fmt::format("all {} ranks registered; broadcasting membership epoch 1", rules_.world()));
  send(std::move(to), std::move(m));
}

// ---------------------------------------------------------------------------- rank frames

void Roster::Step::heartbeat(const HeartbeatEvent& e) {
  RankRecord* r = current(e.id, e.connection);
  if (r == nullptr) return;  // its site left the job; it learns so from the membership
  r->last_seen = e.now;
  r->step = e.step;
  r->report = e.report;
  if (std::chrono::milliseconds(e.report.tcp_backlog_ms) >= kStragglerFloor)
    r->backlogs.push_back({e.now, e.report.tcp_backlog_ms, e.report.tcp_backlog_peer});
  while (!r->backlogs.empty() && (r->backlogs.size() > kMaxBacklogSamples ||
                                  e.now - r->backlogs.front().at > kBacklogMemory))
    r->backlogs.pop_front();
  if (r->silent) {
    say(log::Level::kInfo, fmt::format("{} is heartbeating again (step {})", e.id.str(), e.step));
    r->silent = false;
  }
  const auto& m = s_.membership;
  if (m && e.epoch != 0 && e.epoch != m->epoch && !s_.recovering && e.epoch + 1 != m->epoch)
    say(log::Level::kWarn, fmt::format("{} reports membership epoch {} but the current one is {}",
                                       e.id.str(), e.epoch, m->epoch));
}

void Roster::Step::bye(const ByeEvent& e) {
  RankRecord* r = current(e.id, e.connection);
  if (r == nullptr) return;
  r->finished = true;
  r->step = e.step;
  r->last_seen = e.now;
  say(log::Level::kInfo, fmt::format("{} finished at step {}", e.id.str(), e.step));
}

void Roster::Step::recover(const RecoverEvent& e) {
  if (!s_.membership) {
    out.protocol_error = "Recover before the membership";
    return;
  }
  if (!rules_.elastic) {
    say(log::Level::kWarn,
        fmt::format("{} asked to recover, but this job stops on a failure", e.id.str()));
    return;
  }
  if (e.report.epoch != s_.membership->epoch) {
    say(log::Level::kInfo, fmt::format("ignoring {}'s Recover for epoch {} (current epoch {})",
                                       e.id.str(), e.report.epoch, s_.membership->epoch));
    return;
  }
  say(log::Level::kInfo,
      fmt::format("{} can roll back to step(s) [{}] ({}; in the operation {} ms, sends waited "
                  "{} ms, TCP backlog {} ms to {})",
                  e.id.str(), fmt::join(e.report.snapshots, ", "), e.report.reason,
                  e.report.operation_ms, e.report.send_wait_ms, e.report.backlog_ms,
                  ip_text(e.report.backlog_peer)));
  const bool first = !s_.recovering;
  s_.reports[e.id] = e.report;
  if (first) begin_recovery(fmt::format("{} reported: {}", e.id.str(), e.report.reason), "");
  try_finish_recovery(false);
}

void Roster::Step::closed(const ClosedEvent& e) {
  RankRecord* r = current(e.id, e.connection);
  if (r == nullptr) return;
  r->connection = 0;
  if (r->finished) return;  // the end of its work, not a failure
  if (!e.reason.empty())
    say(log::Level::kWarn,
        fmt::format("{} disconnected: {}{}", e.peer, e.reason,
                    rules_.elastic ? ""
                                   : fmt::format("; it will be listed missing after {} ms",
                                                 rules_.heartbeat_timeout.count())));
  broadcast_lost();
  begin_recovery(
      fmt::format("{} disconnected ({})", e.id.str(), e.reason.empty() ? "closed" : e.reason),
      e.id.site);
}

// ---------------------------------------------------------------------------- queries

std::vector<RankProgress> Roster::progress(Clock::time_point now) const {
  std::vector<RankProgress> out;
  for (const auto& [id, r] : state_.ranks)
    out.push_back({id, r.step, r.connected(),
                   std::chrono::duration_cast<std::chrono::milliseconds>(now - r.last_seen),
                   r.report, r.finished});
  return out;
}

std::vector<RankId> Roster::missing(Clock::time_point now) const {
  std::vector<RankId> out;
  for (const auto& [id, r] : state_.ranks)
    if (now - r.last_seen > rules_.heartbeat_timeout) out.push_back(id);
  return out;
}

std::vector<std::string> Roster::departed() const {
  std::vector<std::string> out;
  for (const auto& [site, why] : state_.departed) out.push_back(site + " (" + why + ")");
  return out;
}

std::vector<std::string> Roster::unregistered() const {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& [k, v] : state_.ranks) seen.insert(k.site);
  std::vector<std::string> known(seen.begin(), seen.end());
  for (const auto& s : rules_.site_names)
    if (!seen.contains(s)) known.push_back(s);
  for (const auto& site : known)
    for (std::uint32_t r = 0; r < rules_.ranks_of(site); ++r)
      if (!state_.ranks.contains(RankId{site, r})) out.push_back(RankId{site, r}.str());
  if (known.size() < rules_.num_sites)
    out.push_back(fmt::format("{} more site(s) x {} rank(s) not yet seen",
                              rules_.num_sites - known.size(), rules_.ranks_per_site));
  return out;
}

Status Roster::status() const {
  Status st;
  st.registered = static_cast<std::uint32_t>(state_.ranks.size());
  st.expected = static_cast<std::uint32_t>(rules_.world());
  st.missing = unregistered();
  if (st.missing.size() > kMaxListedMissing) {
    const auto more = st.missing.size() - kMaxListedMissing;
    st.missing.resize(kMaxListedMissing);
    st.missing.push_back(fmt::format("... and {} more", more));
  }
  return st;
}

}  // namespace desloc::transport
