// The coordinator's read-only HTTP endpoint (issue 17), on Boost.Beast:
//   GET /metrics     the job in the Prometheus text exposition format (version 0.0.4)
//   GET /api/state   the same as JSON
//   GET /            a plain-text index of the two
// Nothing on it can change the job: other methods are refused (405). It binds to loopback by
// default; bound elsewhere, every request must carry the job token as `Authorization: Bearer
// <token>` (401 without it).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "desloc/transport/auth.hpp"
#include "desloc/transport/control_plane.hpp"

namespace desloc::transport {

// What the endpoint shows: a consistent read of the coordinator's state.
struct JobStatus {
  std::vector<std::string> sites;  // job.sites, in ring order
  std::uint32_t ranks_per_site = 0;
  std::int64_t steps = 0;  // train.steps
  std::size_t registered = 0;
  std::optional<Membership> membership;
  std::vector<RankProgress> ranks;
  std::vector<RankId> missing;
  std::vector<std::string> departed;  // "site: dropped at epoch N: why"
  double uptime_s = 0.0;
};

JobStatus read_status(const Coordinator& coordinator, std::vector<std::string> sites,
                      std::uint32_t ranks_per_site, std::int64_t steps, double uptime_s);

// The Prometheus text exposition of a status (checked by `promtool check metrics` in
// tests/integration/status_http_test.cpp).
std::string prometheus_text(const JobStatus& s);
// The same as a JSON object.
std::string status_json(const JobStatus& s);

struct StatusServerOptions {
  std::string bind = "127.0.0.1";
  std::uint16_t port = 0;  // 0 = any
  std::vector<std::string> sites;
  std::uint32_t ranks_per_site = 0;
  std::int64_t steps = 0;
  // Needed to bind anywhere but loopback: requests must then present it.
  std::optional<JobToken> token;
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
