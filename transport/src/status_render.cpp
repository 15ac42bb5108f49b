// The status endpoint's views of a job (status_http.hpp): a consistent read of the
// coordinator, its links, the Prometheus text exposition and the JSON the dashboard draws.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "desloc/transport/status_http.hpp"

namespace desloc::transport {
namespace {

// A label value in the exposition format: backslash, double quote and line feed escaped.
std::string label(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

// A sample value as the exposition format spells the special ones: a diverged site reports a
// NaN loss, and fmt would write "nan".
std::string prometheus_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

void family(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

std::string rank_labels(const RankProgress& r) {
  return fmt::format("site=\"{}\",rank=\"{}\"", label(r.id.site), r.id.rank);
}

std::string link_labels(const LinkStatus& l) {
  return fmt::format("from=\"{}\",to=\"{}\"", label(l.from), label(l.to));
}

// A finite number for JSON (nlohmann writes NaN as null, which a chart cannot draw either).
nlohmann::json finite(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

// Each site's state: "live" (in the membership), "joining", "dropped", or "waiting" (before the
// first membership).
std::string site_state(const JobStatus& s, const std::string& site) {
  if (!s.membership) return "waiting";
  const Membership& m = *s.membership;
  if (std::find(m.joining.begin(), m.joining.end(), site) != m.joining.end()) return "joining";
  for (const std::uint32_t i : m.ring_order)
    if (m.sites.at(i) == site) return "live";
  return "dropped";
}

}  // namespace

JobStatus read_status(const Coordinator& c, const JobDescription& job, double uptime_s) {
  Coordinator::Snapshot now = c.snapshot();
  JobStatus s;
  s.job = job;
  s.registered = now.registered;
  s.membership = std::move(now.membership);
  s.ranks = std::move(now.progress);
  s.missing = std::move(now.missing);
  s.departed = std::move(now.departed);
  s.history = std::move(now.history);
  s.uptime_s = uptime_s;
  return s;
}

std::vector<LinkStatus> link_status(const JobStatus& s) {
  std::vector<LinkStatus> out;
  std::set<LinkKey> listed;
  auto planned = [&](const LinkKey& k) -> std::optional<double> {
    const auto it = s.job.planned_bytes_per_s.find(k);
    if (it == s.job.planned_bytes_per_s.end()) return std::nullopt;
    return it->second;
  };
  auto bytes = [&](const LinkKey& k) {
    const auto it = s.history.link_bytes().find(k);
    return it == s.history.link_bytes().end() ? std::uint64_t{0} : it->second;
  };
  if (s.membership)
    for (const std::uint32_t i : s.membership->ring_order) {
      const std::string& site = s.membership->sites.at(i);
      const auto [next, previous] = s.history.neighbours(site);
      for (std::size_t lane = 0; lane < 2; ++lane) {
        const std::string& to = lane == 0 ? next : previous;
        if (to.empty()) continue;
        LinkStatus l{site, to, true, bytes({site, to}), 0.0, planned({site, to})};
        // The site's ranks average their shards at once, each on its own connection.
        for (const RankProgress& r : s.ranks)
          if (r.id.site == site) l.recent_bytes_per_s += r.report.lanes[lane].recent_bytes_per_s;
        // Lane 1 exists only with transport.lanes = 2: list it once it carried bytes.
        if (lane == 1 && l.bytes_sent == 0) continue;
        listed.insert({site, to});
        out.push_back(std::move(l));
      }
    }
  // Region rings (job.regions): a link the job-wide ring already lists keeps its ring rate.
  if (s.membership)
    for (const std::string& site : s.membership->sites) {
      const std::string to = s.history.region_next(site);
      if (to.empty() || listed.count({site, to})) continue;
      LinkStatus l{site, to, true, bytes({site, to}), 0.0, planned({site, to})};
      for (const RankProgress& r : s.ranks)
        if (r.id.site == site) l.recent_bytes_per_s += r.report.region_lane.recent_bytes_per_s;
      listed.insert({site, to});
      out.push_back(std::move(l));
    }
  for (const auto& [k, n] : s.history.link_bytes())
    if (!listed.count(k)) out.push_back({k.first, k.second, false, n, 0.0, planned(k)});
  return out;
}

std::string prometheus_text(const JobStatus& s) {
  std::string out;
  const std::set<RankId> missing(s.missing.begin(), s.missing.end());
  family(out, "desloc_up", "gauge", "1 while the coordinator serves this job.");
  out += "desloc_up 1\n";
  family(out, "desloc_uptime_seconds", "gauge", "Seconds since the endpoint started.");
  out += fmt::format("desloc_uptime_seconds {:.3f}\n", s.uptime_s);
  family(out, "desloc_train_steps", "gauge", "The job's train.steps.");
  out += fmt::format("desloc_train_steps {}\n", s.job.steps);
  family(out, "desloc_membership_epoch", "gauge",
         "The membership epoch (0 until every rank has registered).");
  out += fmt::format("desloc_membership_epoch {}\n", s.membership ? s.membership->epoch : 0);
  family(out, "desloc_ranks_expected", "gauge", "Every site's ranks together.");
  out += fmt::format("desloc_ranks_expected {}\n", s.job.ranks_expected());
  family(out, "desloc_ranks_registered", "gauge", "Ranks registered with the coordinator.");
  out += fmt::format("desloc_ranks_registered {}\n", s.registered);
  family(out, "desloc_site_live", "gauge",
         "1 for a site in the current membership, 0 for one dropped or not yet joined.");
  for (const auto& site : s.job.sites) {
    const std::string state = site_state(s, site);
    out += fmt::format("desloc_site_live{{site=\"{}\"}} {}\n", label(site),
                       state == "live" || state == "joining" ? 1 : 0);
  }
  family(out, "desloc_sites_departed_total", "counter", "Sites dropped from the job so far.");
  out += fmt::format("desloc_sites_departed_total {}\n", s.departed.size());
  family(out, "desloc_recoveries_total", "counter",
         "Membership epochs after the first: each began with a recovery (a site lost, or one "
         "rejoining).");
  out += fmt::format("desloc_recoveries_total {}\n",
                     s.membership && s.membership->epoch > 0 ? s.membership->epoch - 1 : 0);
  family(out, "desloc_site_rejoins_total", "counter", "Sites that rejoined the job so far.");
  out += fmt::format("desloc_site_rejoins_total {}\n", s.history.rejoins());

  const auto per_rank = [&](const char* name, const char* type, const char* help,
                            const auto& value) {
    family(out, name, type, help);
    for (const RankProgress& r : s.ranks)
      out += fmt::format("{}{{{}}} {}\n", name, rank_labels(r), value(r));
  };
  per_rank("desloc_rank_step", "gauge", "The last step a rank reported in a heartbeat.",
           [](const RankProgress& r) { return std::to_string(r.step); });
  per_rank("desloc_rank_loss", "gauge",
           "A rank's site's training loss at its last reported step (nats per token).",
           [](const RankProgress& r) { return prometheus_value(r.report.loss); });
  per_rank("desloc_rank_tokens_per_second", "gauge", "A rank's tokens per second, last step.",
           [](const RankProgress& r) { return prometheus_value(r.report.tokens_per_s); });
  per_rank("desloc_rank_wan_bytes_sent_total", "counter",
           "Wide-area bytes a rank has sent (its share of the cross-site averages).",
           [](const RankProgress& r) { return std::to_string(r.report.wan_bytes_sent); });
  per_rank("desloc_rank_connected", "gauge", "1 while a rank's control connection is open.",
           [](const RankProgress& r) { return r.connected ? "1" : "0"; });
  per_rank("desloc_rank_silent_seconds", "gauge", "Seconds since a rank's last frame.",
           [](const RankProgress& r) { return fmt::format("{:.3f}", r.silent.count() / 1e3); });
  per_rank("desloc_rank_heartbeats_missed", "gauge",
           "Heartbeats a rank has missed in a row (its silence over job.heartbeat_ms).",
           [&](const RankProgress& r) {
             const auto period = std::max<std::int64_t>(s.job.heartbeat.count(), 1);
             return std::to_string(std::max<std::int64_t>(r.silent.count() / period - 1, 0));
           });
  per_rank("desloc_rank_missing", "gauge",
           "1 for a registered rank silent past job.heartbeat_timeout_ms.",
           [&](const RankProgress& r) { return missing.count(r.id) ? "1" : "0"; });
  per_rank("desloc_rank_kx", "gauge",
           "The parameter-average period Kx a rank trains with now (sync.replan may change it).",
           [](const RankProgress& r) { return std::to_string(r.report.kx); });
  per_rank("desloc_rank_replans_total", "counter",
           "Period switches re-planning has made at a rank (sync.replan).",
           [](const RankProgress& r) { return std::to_string(r.report.replans); });
  per_rank(
      "desloc_rank_tcp_backlog_seconds", "gauge",
      "Time a rank's unacknowledged TCP data needs to drain at the rate its slowest link "
      "last delivered, sampled at its last heartbeat: seconds behind a slow outbound link.",
      [](const RankProgress& r) { return fmt::format("{:.3f}", r.report.tcp_backlog_ms / 1e3); });
  per_rank("desloc_rank_wait_seconds_total", "counter",
           "Seconds a rank's site waited for the slowest site at its averages (the slowest's "
           "compute since the average before, less its own), summed.",
           [](const RankProgress& r) { return fmt::format("{:.3f}", r.report.wait_seconds); });
  per_rank("desloc_payload_guard_rejections_total", "counter",
           "Sites the payload guard left out of a rank's wide-area averages.",
           [](const RankProgress& r) { return std::to_string(r.report.guard_rejections); });

  family(out, "desloc_sync_duration_seconds", "histogram",
         "Wall time of a rank's wide-area averages of its shard (guard and every lane).");
  for (const RankProgress& r : s.ranks) {
    const std::string labels = rank_labels(r);
    std::uint64_t cumulative = 0;
    for (std::size_t b = 0; b < kSyncBuckets; ++b) {
      cumulative += r.report.sync_buckets[b];
      const std::string le =
          b < kSyncBucketBounds.size() ? fmt::format("{}", kSyncBucketBounds[b]) : "+Inf";
      out += fmt::format("desloc_sync_duration_seconds_bucket{{{},le=\"{}\"}} {}\n", labels, le,
                         cumulative);
    }
    out += fmt::format("desloc_sync_duration_seconds_sum{{{}}} {}\n", labels,
                       prometheus_value(r.report.sync_seconds));
    out += fmt::format("desloc_sync_duration_seconds_count{{{}}} {}\n", labels, cumulative);
  }

  family(out, "desloc_http_requests_total", "counter",
         "Requests the status endpoint answered, by path (the dashboard polls /api/state).");
  for (const auto& [path, n] : s.http_requests)
    out += fmt::format("desloc_http_requests_total{{path=\"{}\"}} {}\n", label(path), n);

  const std::vector<LinkStatus> links = link_status(s);
  family(out, "desloc_link_bytes_sent_total", "counter",
         "Wide-area bytes a site's ranks sent on a link (from -> to), all epochs.");
  for (const LinkStatus& l : links)
    out += fmt::format("desloc_link_bytes_sent_total{{{}}} {}\n", link_labels(l), l.bytes_sent);
  family(out, "desloc_link_achieved_bytes_per_second", "gauge",
         "A ring link's rate over each rank's last syncs, summed over the sending site's ranks.");
  for (const LinkStatus& l : links)
    if (l.in_ring && l.recent_bytes_per_s > 0.0)
      out += fmt::format("desloc_link_achieved_bytes_per_second{{{}}} {}\n", link_labels(l),
                         prometheus_value(l.recent_bytes_per_s));
  family(out, "desloc_link_planned_bytes_per_second", "gauge",
         "A ring link's rate in the topology the job was planned with (--topology).");
  for (const LinkStatus& l : links)
    if (l.in_ring && l.planned_bytes_per_s)
      out += fmt::format("desloc_link_planned_bytes_per_second{{{}}} {}\n", link_labels(l),
                         prometheus_value(*l.planned_bytes_per_s));
  return out;
}

std::size_t JobDescription::ranks_expected() const {
  if (site_ranks.empty()) return sites.size() * ranks_per_site;
  std::size_t all = 0;
  for (const std::uint32_t r : site_ranks) all += r;
  return all;
}

std::string status_json(const JobStatus& s) {
  nlohmann::ordered_json j;
  j["sites"] = s.job.sites;
  j["ranks_per_site"] = s.job.ranks_per_site;
  if (!s.job.site_ranks.empty()) j["site_ranks"] = s.job.site_ranks;
  j["ranks_expected"] = s.job.ranks_expected();
  j["train_steps"] = s.job.steps;
  j["registered"] = s.registered;
  j["uptime_s"] = s.uptime_s;
  j["epoch"] = s.membership ? s.membership->epoch : 0;
  nlohmann::json ring = nlohmann::json::array();
  if (s.membership)
    for (const auto i : s.membership->ring_order) ring.push_back(s.membership->sites.at(i));
  j["ring"] = ring;
  j["epoch_note"] = s.membership ? s.membership->note : "";
  j["departed"] = s.departed;
  nlohmann::ordered_json states = nlohmann::ordered_json::object();
  for (const auto& site : s.job.sites) states[site] = site_state(s, site);
  j["site_state"] = states;
  nlohmann::ordered_json plan = nlohmann::ordered_json::object();
  for (const auto& [k, v] : s.job.plan) plan[k] = v;
  j["plan"] = plan;

  const std::set<RankId> missing(s.missing.begin(), s.missing.end());
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : s.ranks) {
    const RankReport& p = r.report;
    ranks.push_back({{"site", r.id.site},
                     {"rank", r.id.rank},
                     {"step", r.step},
                     {"connected", r.connected},
                     {"silent_s", r.silent.count() / 1e3},
                     {"loss", finite(p.loss)},
                     {"tokens_per_s", finite(p.tokens_per_s)},
                     {"wan_bytes_sent", p.wan_bytes_sent},
                     {"syncs", p.syncs()},
                     {"sync_seconds", finite(p.sync_seconds)},
                     {"guard_rejections", p.guard_rejections},
                     {"kx", p.kx},
                     {"replans", p.replans},
                     {"tcp_backlog_s", p.tcp_backlog_ms / 1e3},
                     {"last_wait_s", p.last_wait_ms / 1e3},
                     {"wait_s", finite(p.wait_seconds)},
                     {"missing", missing.count(r.id) > 0}});
  }
  j["ranks"] = ranks;

  nlohmann::json links = nlohmann::json::array();
  for (const LinkStatus& l : link_status(s))
    links.push_back({{"from", l.from},
                     {"to", l.to},
                     {"in_ring", l.in_ring},
                     {"bytes_sent", l.bytes_sent},
                     {"recent_bytes_per_s", finite(l.recent_bytes_per_s)},
                     {"planned_bytes_per_s",
                      l.planned_bytes_per_s ? finite(*l.planned_bytes_per_s) : nlohmann::json()}});
  j["links"] = links;

  nlohmann::json epochs = nlohmann::json::array();
  for (const EpochEvent& e : s.history.epochs())
    epochs.push_back({{"epoch", e.epoch},
                      {"at_s", e.at_s},
                      {"ring", e.ring},
                      {"joining", e.joining},
                      {"note", e.note}});
  j["epochs"] = epochs;
  nlohmann::json losses = nlohmann::json::object();
  for (const auto& [site, curve] : s.history.losses()) {
    nlohmann::json points = nlohmann::json::array();
    for (const LossPoint& p : curve) points.push_back({p.step, finite(p.loss)});
    losses[site] = points;
  }
  j["losses"] = losses;
  return j.dump();
}

}  // namespace desloc::transport
