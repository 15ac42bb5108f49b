// The coordinator's read-only HTTP endpoint (issue 17), on Boost.Beast:
//   GET /metrics     the job in the Prometheus text exposition format (version 0.0.4)
//   GET /api/state   the same as JSON
//   GET /            a live dashboard (the ring and its links' rates, the epochs, the loss
//                    curves, the plan), refreshing itself from /api/state
// Nothing on it can change the job: other methods are refused (405). It binds to loopback by
// default; bound elsewhere, every request must carry the job token, as `Authorization: Bearer
// <token>` or as the password of HTTP Basic authentication (what a browser asks for), or is
// refused with 401.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "desloc/transport/auth.hpp"
#include "desloc/transport/control_plane.hpp"
#include "desloc/transport/job_history.hpp"

namespace desloc::transport {

// The job as the endpoint describes it, besides what the coordinator knows.
struct JobDescription {
  std::vector<std::string> sites;  // job.sites, in ring order
  std::uint32_t ranks_per_site = 0;
  // Sites of unequal rank counts ([[job.site]]): each site's, in ring order; empty when alike.
  std::vector<std::uint32_t> site_ranks;
  // Every site's ranks together.
  std::size_t ranks_expected() const;
  std::int64_t steps = 0;  // train.steps
  // job.heartbeat_ms: a silent rank's heartbeats missed are its silence over this.
  std::chrono::milliseconds heartbeat{500};
  // The sync settings shown as the plan, in order: ("method", "desloc"), ("kx", "32"), ...
  std::vector<std::pair<std::string, std::string>> plan;
  // Each link's planned rate (bytes/s), from a topology (--topology); empty without one.
  std::map<LinkKey, double> planned_bytes_per_s;
};

// What the endpoint shows: a consistent read of the coordinator's state.
struct JobStatus {
  JobDescription job;
  std::size_t registered = 0;
  std::optional<Membership> membership;
  std::vector<RankProgress> ranks;
  std::vector<RankId> missing;
  std::vector<std::string> departed;  // "site: dropped at epoch N: why"
  JobHistory history;
  double uptime_s = 0.0;
  // Requests the endpoint answered so far, by path (filled by the server).
  std::vector<std::pair<std::string, std::uint64_t>> http_requests;
};

JobStatus read_status(const Coordinator& coordinator, const JobDescription& job, double uptime_s);

// One directed wide-area link, as the ranks of its sending site report it.
struct LinkStatus {
  std::string from, to;
  bool in_ring = false;                       // a link of the current membership's ring
  std::uint64_t bytes_sent = 0;               // all epochs
  double recent_bytes_per_s = 0.0;            // over the last syncs (0 before one); in_ring only
  std::optional<double> planned_bytes_per_s;  // from the topology, when given
};
// The links of the current ring (both lanes), then links of earlier epochs that carried bytes.
std::vector<LinkStatus> link_status(const JobStatus& s);

// The Prometheus text exposition of a status (checked by `promtool check metrics` in
// tests/integration/status_http_test.cpp).
std::string prometheus_text(const JobStatus& s);
// The same as a JSON object, with the history (epochs, loss curves) the dashboard draws.
std::string status_json(const JobStatus& s);
// The dashboard served at `/`: one self-contained page that polls /api/state.
std::string_view dashboard_html();

struct StatusServerOptions {
  std::string bind = "127.0.0.1";
  std::uint16_t port = 0;  // 0 = any
  JobDescription job;
  // Needed to bind anywhere but loopback: requests must then present it.
  std::optional<JobToken> token;
  // Connections served at once; more are answered 503 and closed at once, so clients that
  // open many and send nothing (each held up to the 10 s read deadline) cannot take the
  // coordinator's file descriptors.
  std::size_t max_connections = 64;
};

class StatusServer {
 public:
  // ConfigError when `bind` is not a loopback address and there is no token.
  StatusServer(const Coordinator& coordinator, StatusServerOptions options);
  ~StatusServer();
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;
  // Binds and serves on its own thread; returns the bound port. TransportError when the
  // address cannot be bound.
  std::uint16_t start();
  void stop();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace desloc::transport
