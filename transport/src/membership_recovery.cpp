// The membership state machine's time and recovery (membership.hpp): silence, pauses of the
// coordinator, slow links and the rebuild after a restart; and the recovery epochs (who is
// dropped, who rejoins, where the next epoch resumes).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iterator>
#include <tuple>

#include "membership_step.hpp"

namespace desloc::transport {

using namespace membership_detail;

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
    const std::size_t ranks = rules_.ranks_of(site);
    if (back == ranks)
      m.sites.push_back(site);
    else
      s_.departed[site] =
          fmt::format("not back after the coordinator restarted ({} of {} ranks)", back, ranks);
    if (back > 0 && back < ranks) partial.push_back(site);
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
  // the other sender. Each rank's heartbeats carry its backlog too (what the slow-link watch
  // judges): the longest of its Recover, its latest heartbeat and the heartbeats it sent while
  // the failed operation ran (the longest operation any report names, before the recovery
  // began) is the evidence.
  std::map<RankId, Recover> seen = s_.reports;
  std::chrono::milliseconds operation = rules_.heartbeat_timeout;
  for (const auto& [id, rep] : seen)
    operation = std::max(operation, std::chrono::milliseconds(rep.operation_ms));
  const Clock::time_point since = s_.recovery_start - operation;
  for (auto& [id, rep] : seen) {
    const auto r = s_.ranks.find(id);
    if (r == s_.ranks.end() || r->second.silent) continue;
    auto take = [&rep](std::uint32_t ms, IpAddress peer) {
      if (ms <= rep.backlog_ms) return;
      rep.backlog_ms = ms;
      rep.backlog_peer = peer;
    };
    take(r->second.report.tcp_backlog_ms, r->second.report.tcp_backlog_peer);
    for (const RankRecord::Backlog& b : r->second.backlogs)
      if (b.at >= since) take(b.ms, b.peer);
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
    if (n == rules_.ranks_of(site)) joining.insert(site);
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

}  // namespace desloc::transport
