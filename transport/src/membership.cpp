// The coordinator's membership rules (see membership.hpp): admission, loss, recovery epochs,
// rejoin and the rebuild after a coordinator restart, as one deterministic state machine.
#include "desloc/transport/membership.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iterator>
#include <tuple>

namespace desloc::transport {
namespace {

constexpr std::size_t kMaxListedMissing = 16;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string site_of(const std::string& rank_name) {
  return rank_name.substr(0, rank_name.rfind('/'));
}

// The ring positions 0..n-1: the ring follows the site table's order.
std::vector<std::uint32_t> ring_of(std::size_t n) {
  std::vector<std::uint32_t> ring(n);
  for (std::uint32_t i = 0; i < n; ++i) ring[i] = i;
  return ring;
}

}  // namespace

MembershipRules MembershipRules::of(const CoordinatorOptions& o) {
  MembershipRules r;
  r.num_sites = o.num_sites;
  r.ranks_per_site = o.ranks_per_site;
  r.site_names = o.site_names;
  r.elastic = o.elastic;
  r.min_sites = o.min_sites;
  r.heartbeat_timeout = o.heartbeat_timeout;
  r.recovery_timeout = o.recovery_timeout;
  r.straggler_ratio = o.straggler_ratio;
  return r;
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

// One event's worth of work on the roster: the old handlers' logic, writing into `out`.
class Roster::Step {
 public:
  Step(Roster& roster, Clock::time_point now)
      : rules_(roster.rules_), s_(roster.state_), roster_(roster), now_(now) {}

  MembershipDecision out;

  void hello(const HelloEvent& e);
  void heartbeat(const HeartbeatEvent& e);
  void bye(const ByeEvent& e);
  void recover(const RecoverEvent& e);
  void closed(const ClosedEvent& e);
  void tick();

 private:
  void forgive_pause();
  void say(log::Level level, std::string text) { out.log.push_back({level, std::move(text)}); }
  void send(std::vector<RankId> to, decltype(Outgoing::message) message) {
    if (!to.empty()) out.sends.push_back({std::move(to), std::move(message)});
  }
  // The record of `id` if `connection` is the one it registered on.
  RankRecord* current(const RankId& id, std::uint64_t connection) {
    const auto it = s_.ranks.find(id);
    return it == s_.ranks.end() || it->second.connection != connection ? nullptr : &it->second;
  }

  std::optional<Reject> admit(const HelloEvent& e);
  void welcome(const HelloEvent& e);
  void form_first_epoch();
  void broadcast_lost();
  void begin_recovery(const std::string& reason, const std::string& site);
  void try_finish_recovery(bool timed_out);
  bool drop_lost_and_late(bool timed_out);
  void drop_straggler();
  void watch_slow_links();
  std::set<std::string> joining_sites() const;
  Membership next_membership(const std::set<std::string>& joining);
  void close_recovery(Membership m, const std::set<std::string>& joining);
  void rebuild_if_quiet();

  const MembershipRules& rules_;
  MembershipState& s_;
  Roster& roster_;
  Clock::time_point now_;
};

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
                                       here, rules_.ranks_per_site));
    send({id}, roster_.status());
    if (here == rules_.ranks_per_site) begin_recovery(fmt::format("site {} rejoins", id.site), "");
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

// ---------------------------------------------------------------------------- time

// A pause of the coordinator (its own ticks stopped): the ranks' silence, a recovery's wait
// and a rebuild's quiet all include the time it did not run, which tells nothing about them.
// Each timer moves on by the gap; a rank silent before the pause keeps that silence.
void Roster::Step::forgive_pause() {
  const Clock::time_point last = s_.last_tick;
  s_.last_tick = now_;
  if (last == Clock::time_point{}) return;
  const auto gap = now_ - last;
  if (gap <= std::max<Clock::duration>(kPauseGap, rules_.heartbeat_timeout / 2)) return;
  const auto shift = [&](Clock::time_point& t) {
    if (t != Clock::time_point{}) t = std::min(t + gap, now_);
  };
  for (auto& [id, r] : s_.ranks) shift(r.last_seen);
  shift(s_.recovery_start);
  shift(s_.last_rebuild_registration);
  shift(s_.slow_since);
  say(log::Level::kWarn,
      fmt::format("this coordinator did not run for {:.1f} s (stopped, or its host suspended); "
                  "the ranks' silence over that time is not counted against them",
                  std::chrono::duration<double>(gap).count()));
}

void Roster::Step::tick() {
  forgive_pause();
  std::vector<RankId> newly_silent;
  for (auto& [id, r] : s_.ranks) {
    if (r.silent || r.finished || now_ - r.last_seen <= rules_.heartbeat_timeout) continue;
    r.silent = true;
    newly_silent.push_back(id);
    say(log::Level::kWarn,
        fmt::format("{} ({}) silent for {:.1f} s (timeout {} ms); listing it missing", id.str(),
                    r.peer, seconds_between(r.last_seen, now_), rules_.heartbeat_timeout.count()));
  }
  // While the world fills up, tell waiting ranks who is still absent, so their timeout errors
  // can name them. Only on change, to keep this O(ranks) per tick.
  if (!s_.membership && s_.ranks.size() != s_.status_sent_for) {
    s_.status_sent_for = s_.ranks.size();
    std::vector<RankId> waiting;
    for (const auto& [id, r] : s_.ranks)
      if (r.connected()) waiting.push_back(id);
    send(std::move(waiting), roster_.status());
  }
  if (!newly_silent.empty()) {
    broadcast_lost();
    std::vector<RankId> silent;  // collected first: a recovery that ends drops records
    for (const auto& [id, r] : s_.ranks)
      if (r.silent && !r.finished) silent.push_back(id);
    for (const auto& id : silent)
      begin_recovery(
          fmt::format("{} silent for more than {} ms", id.str(), rules_.heartbeat_timeout.count()),
          id.site);
  }
  rebuild_if_quiet();
  try_finish_recovery(s_.recovering && now_ - s_.recovery_start > rules_.recovery_timeout);
  watch_slow_links();
}

// A link slow enough to stretch an average but not past the deadline fails nothing, so the
// straggler rule never runs: the heartbeats' TCP backlogs show it instead. A site whose backlog
// stands out (find_straggler's test) for a heartbeat timeout is named once, until it stops.
void Roster::Step::watch_slow_links() {
  std::optional<Straggler> slow;
  if (s_.membership && !s_.recovering) {
    std::map<RankId, Recover> seen;
    for (const auto& [id, r] : s_.ranks)
      if (r.connected() && !r.silent && !r.finished && !r.joining) {
        Recover e;
        e.backlog_ms = r.report.tcp_backlog_ms;
        e.backlog_peer = r.report.tcp_backlog_peer;
        seen[id] = e;
      }
    slow =
        find_straggler(seen, rules_.straggler_ratio > 0.0 ? rules_.straggler_ratio : kSlowLinkRatio,
                       site_addresses(s_.ranks));
  }
  if (!slow || slow->site != s_.slow_site) {
    if (s_.slow_warned)
      say(log::Level::kInfo,
          s_.slow_inbound
              ? fmt::format("the TCP backlog toward site {} is back in line with the others'",
                            s_.slow_site)
              : fmt::format("site {}'s TCP backlog is back in line with the others'",
                            s_.slow_site));
    s_.slow_site = slow ? slow->site : std::string();
    s_.slow_inbound = slow && slow->inbound;
    s_.slow_since = now_;
    s_.slow_warned = false;
  }
  if (!slow || s_.slow_warned || now_ - s_.slow_since < rules_.heartbeat_timeout) return;
  s_.slow_warned = true;
  say(log::Level::kWarn,
      fmt::format(
          "site {}'s {} link is slow: {} has stood out for {:.1f} s and needs {:.2f} s "
          "to drain, the other links' at most {:.2f} s. Nothing failed, so the job "
          "runs at its pace: transport.deadline_s bounds one average, and sync.replan "
          "adapts the periods",
          slow->site, slow->inbound ? "inbound" : "outbound",
          slow->inbound ? "the TCP backlog of the data other sites send it" : "its TCP backlog",
          seconds_between(s_.slow_since, now_), slow->evidence.count() / 1e3,
          slow->others.count() / 1e3));
}

// After the membership: every rank that disconnected or went silent, so that the others can
// name the failed peer when a collective stalls. Sent to every connected rank.
void Roster::Step::broadcast_lost() {
  if (!s_.membership) return;
  Status st;
  st.expected = static_cast<std::uint32_t>(rules_.world());
  std::vector<RankId> to;
  for (const auto& [id, r] : s_.ranks) {
    if (r.finished) continue;
    if (!r.connected())
      st.missing.push_back(id.str() + " (disconnected)");
    else if (r.silent)
      st.missing.push_back(id.str() + " (silent)");
    else
      to.push_back(id);
  }
  st.registered = static_cast<std::uint32_t>(to.size());
  if (!st.missing.empty()) send(std::move(to), std::move(st));
}

// After a restart: once reconnecting ranks stop arriving (for heartbeat_timeout), the
// membership is the sites whose every rank came back, at the newest epoch they reported.
// Nothing is broadcast: the ranks already train in it.
void Roster::Step::rebuild_if_quiet() {
  if (s_.membership || s_.rebuild_epoch == 0 ||
      now_ - s_.last_rebuild_registration < rules_.heartbeat_timeout)
    return;
  Membership m;
  m.epoch = s_.rebuild_epoch;
  std::vector<std::string> order = rules_.site_names;
  for (const auto& [id, r] : s_.ranks)
    if (!contains(order, id.site)) order.push_back(id.site);
  std::vector<std::string> partial;
  for (const auto& site : order) {
    std::size_t back = 0;
    for (const auto& [id, r] : s_.ranks)
      if (id.site == site) ++back;
    if (back == rules_.ranks_per_site)
      m.sites.push_back(site);
    else
      s_.departed[site] = fmt::format("not back after the coordinator restarted ({} of {} ranks)",
                                      back, rules_.ranks_per_site);
    if (back > 0 && back < rules_.ranks_per_site) partial.push_back(site);
  }
  for (const auto& [id, r] : s_.ranks)
    if (contains(m.sites, id.site)) m.members.push_back({id.site, id.rank, r.worker_address});
  m.ring_order = ring_of(m.sites.size());
  m.note = "rebuilt from the ranks after a coordinator restart";
  std::erase_if(s_.ranks, [&](const auto& kv) { return !contains(m.sites, kv.first.site); });
  say(log::Level::kWarn,
      fmt::format("rebuilt membership epoch {} from the ranks: {} site(s) [{}]{}", m.epoch,
                  m.sites.size(), fmt::join(m.sites, ", "),
                  partial.empty()
                      ? std::string()
                      : fmt::format("; incomplete, left out: [{}]", fmt::join(partial, ", "))));
  s_.membership = std::move(m);
}

// ---------------------------------------------------------------------------- recovery

// Elastic recovery: begins once (idempotent; `site`, when non-empty, joins the dropped set),
// then waits for the survivors' reports.
void Roster::Step::begin_recovery(const std::string& reason, const std::string& site) {
  if (!s_.membership || !rules_.elastic || s_.membership->sites.empty()) return;
  if (!site.empty() && !s_.departed.contains(site)) s_.failing_sites.insert(site);
  if (s_.recovering) {
    say(log::Level::kWarn, "also during this recovery: " + reason);
    return;
  }
  s_.recovering = true;
  s_.recovery_start = now_;
  s_.recovery_reason = reason;
  say(log::Level::kWarn,
      fmt::format("closing membership epoch {}: {}; collecting the survivors' rollback points "
                  "(timeout {} ms)",
                  s_.membership->epoch, reason, rules_.recovery_timeout.count()));
  std::vector<RankId> to;
  for (const auto& [id, r] : s_.ranks)
    if (r.connected() && !r.finished) to.push_back(id);
  send(std::move(to), Recovery{s_.membership->epoch, reason});
  try_finish_recovery(false);
}

// A site with any lost rank leaves whole; every rank of the others must report, or at the
// timeout its site leaves too. False while reports are still awaited.
bool Roster::Step::drop_lost_and_late(bool timed_out) {
  for (const auto& [id, r] : s_.ranks)
    if (!s_.failing_sites.contains(id.site) && (!r.connected() || r.silent)) {
      say(log::Level::kWarn, fmt::format("{} is {}; dropping site {}", id.str(),
                                         r.connected() ? "silent" : "disconnected", id.site));
      s_.failing_sites.insert(id.site);
    }
  std::vector<std::string> late;
  for (const auto& [id, r] : s_.ranks)
    if (!s_.failing_sites.contains(id.site) && !r.joining && !s_.reports.contains(id))
      late.push_back(id.str());
  if (late.empty()) return true;
  if (!timed_out) return false;
  for (const auto& name : late) {
    say(log::Level::kWarn, fmt::format("{} sent no Recover within {} ms; dropping site {}", name,
                                       rules_.recovery_timeout.count(), site_of(name)));
    s_.failing_sites.insert(site_of(name));
  }
  return true;
}

// A failure that lost no site: every site is alive, and without the straggler rule the same
// sites would fail the same step again until the ranks give up.
void Roster::Step::drop_straggler() {
  if (!s_.failing_sites.empty()) return;
  // A Recover's backlog is the longest its rank saw while an operation waited, and a rank
  // whose operations were short saw none: with one site's ingress throttled, the sender that
  // happened to finish its sends reported no backlog toward it, and the straggler rule named
  // the other sender. Each rank's latest heartbeat carries its backlog too (what the slow-link
  // watch judges); the longer of the two is the evidence.
  std::map<RankId, Recover> seen = s_.reports;
  for (auto& [id, rep] : seen) {
    const auto r = s_.ranks.find(id);
    if (r == s_.ranks.end() || r->second.silent ||
        r->second.report.tcp_backlog_ms <= rep.backlog_ms)
      continue;
    rep.backlog_ms = r->second.report.tcp_backlog_ms;
    rep.backlog_peer = r->second.report.tcp_backlog_peer;
  }
  const std::optional<Straggler> s =
      find_straggler(seen, rules_.straggler_ratio, site_addresses(s_.ranks));
  if (!s) return;
  const auto secs = [](std::chrono::milliseconds d) { return d.count() / 1000.0; };
  const std::string evidence =
      s->inbound ? fmt::format(
                       "the TCP data other sites sent to site {} needs {:.2f} s to reach it at "
                       "the rate its link last delivered, the other links' evidence at most "
                       "{:.2f} s",
                       s->site, secs(s->evidence), secs(s->others))
      : s->backlog
          ? fmt::format(
                "site {}'s unacknowledged TCP data needs {:.2f} s to reach its peers at the rate "
                "its link last delivered, the other sites' evidence at most {:.2f} s",
                s->site, secs(s->evidence), secs(s->others))
          : fmt::format(
                "site {}'s sends to its ring successor waited {:.2f} s, the other sites' "
                "evidence at most {:.2f} s",
                s->site, secs(s->evidence), secs(s->others));
  const std::size_t min_sites = std::max<std::size_t>(rules_.min_sites, 1);
  if (s_.membership->sites.size() - 1 < min_sites) {
    say(log::Level::kWarn, fmt::format("{}, but dropping it would leave {} site(s), below the "
                                       "job's minimum of {}: keeping it",
                                       evidence, s_.membership->sites.size() - 1, min_sites));
    return;
  }
  say(log::Level::kWarn, fmt::format("{}: its {} link is the straggler; dropping site {}", evidence,
                                     s->inbound ? "inbound" : "outbound", s->site));
  s_.failing_sites.insert(s->site);
  s_.recovery_reason += "; " + evidence + " (the straggler)";
}

// Restarted sites with every rank registered, and members that offer no rollback point (they
// lost their state, e.g. in an interrupted transfer). Each gets the state from a peer in the
// new epoch.
std::set<std::string> Roster::Step::joining_sites() const {
  std::set<std::string> joining;
  std::map<std::string, std::size_t> back;
  for (const auto& [id, r] : s_.ranks)
    if (r.joining && r.connected() && !s_.failing_sites.contains(id.site)) ++back[id.site];
  for (const auto& [site, n] : back)
    if (n == rules_.ranks_per_site) joining.insert(site);
  for (const auto& [id, rep] : s_.reports)
    if (rep.snapshots.empty() && !s_.failing_sites.contains(id.site)) joining.insert(id.site);
  return joining;
}

// The next epoch's sites, in ring order, and where they resume; no sites = the job ends.
Membership Roster::Step::next_membership(const std::set<std::string>& joining) {
  Membership m;
  m.epoch = s_.membership->epoch + 1;
  std::vector<std::string> order = rules_.site_names;
  for (const auto& site : s_.membership->sites)
    if (!contains(order, site)) order.push_back(site);
  for (const auto& site : order)
    if (!s_.failing_sites.contains(site) &&
        (joining.contains(site) || contains(s_.membership->sites, site)))
      m.sites.push_back(site);
  // The newest step every survivor holds. A survivor that has not stepped yet offers its start
  // (step 0 on a fresh start), so a site lost before the first step leaves a common point.
  std::vector<std::vector<std::int64_t>> offers;
  std::vector<std::string> offered;
  for (const auto& [id, rep] : s_.reports) {
    if (s_.failing_sites.contains(id.site) || joining.contains(id.site)) continue;
    offers.push_back(rep.snapshots);
    offered.push_back(fmt::format("{} [{}]", id.str(), fmt::join(rep.snapshots, ", ")));
  }
  const std::optional<std::int64_t> common = common_rollback_step(offers);
  const std::vector<std::string> dropped(s_.failing_sites.begin(), s_.failing_sites.end());
  const std::size_t min_sites = std::max<std::size_t>(rules_.min_sites, 1);
  m.note = s_.recovery_reason;
  if (!dropped.empty()) m.note += fmt::format("; dropped site(s) [{}]", fmt::join(dropped, ", "));
  if (!joining.empty()) m.note += fmt::format("; joining [{}]", fmt::join(joining, ", "));
  if (m.sites.size() < min_sites) {
    m.note += fmt::format("; only {} site(s) remain, below the job's minimum of {}: the job ends",
                          m.sites.size(), min_sites);
    m.sites.clear();
  } else if (!common) {
    m.note += offered.empty() ? "; no surviving site holds its state: the job ends"
                              : fmt::format(
                                    "; the survivors share no rollback step ({}): the "
                                    "job ends",
                                    fmt::join(offered, ", "));
    m.sites.clear();
  } else {
    m.resume_step = *common;
  }
  return m;
}

// Opens epoch m: its members, the joining list, the departed sites; everyone connected
// (dropped sites' ranks too, so they learn it) is told.
void Roster::Step::close_recovery(Membership m, const std::set<std::string>& joining) {
  std::vector<RankId> to;
  for (const auto& [id, r] : s_.ranks) {
    if (r.connected()) to.push_back(id);
    if (m.sites.empty() || s_.failing_sites.contains(id.site)) continue;
    if (r.joining && !joining.contains(id.site)) continue;  // not all its ranks are back
    const auto report = s_.reports.find(id);
    m.members.push_back(
        {id.site, id.rank,
         report != s_.reports.end() ? report->second.worker_address : r.worker_address});
  }
  for (const auto& site : m.sites)
    if (joining.contains(site)) m.joining.push_back(site);
  m.ring_order = ring_of(m.sites.size());
  for (const auto& site : s_.failing_sites)
    s_.departed[site] = fmt::format("dropped at epoch {}: {}", m.epoch, s_.recovery_reason);
  std::erase_if(s_.ranks, [&](const auto& kv) { return s_.failing_sites.contains(kv.first.site); });
  for (auto& [id, r] : s_.ranks) {
    if (const auto it = s_.reports.find(id); it != s_.reports.end())
      r.worker_address = it->second.worker_address;
    if (r.joining && joining.contains(id.site) && !m.sites.empty()) {
      r.joining = false;
      s_.departed.erase(id.site);
    }
  }
  const double took = seconds_between(s_.recovery_start, now_);
  if (m.sites.empty())
    say(log::Level::kError, fmt::format("recovery of epoch {} failed after {:.2f} s: {}",
                                        s_.membership->epoch, took, m.note));
  else
    say(log::Level::kWarn,
        fmt::format("opening membership epoch {} with {} site(s) [{}], resuming from step {} "
                    "({:.2f} s after the failure): {}",
                    m.epoch, m.sites.size(), fmt::join(m.sites, ", "), m.resume_step, took,
                    m.note));
  s_.membership = m;
  s_.recovering = false;
  s_.reports.clear();
  s_.failing_sites.clear();
  send(std::move(to), std::move(m));
}

// Opens the next epoch once every survivor reported, or at the timeout without the late ones.
void Roster::Step::try_finish_recovery(bool timed_out) {
  if (!s_.recovering || !drop_lost_and_late(timed_out)) return;
  drop_straggler();
  const std::set<std::string> joining = joining_sites();
  close_recovery(next_membership(joining), joining);
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
    for (std::uint32_t r = 0; r < rules_.ranks_per_site; ++r)
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
