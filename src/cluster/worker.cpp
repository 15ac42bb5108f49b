// `desloc worker`: one rank of a multi-site job, from rendezvous to the last step.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <thread>

#include "cluster/groups.hpp"
#include "cluster/session.hpp"
#include "desloc/cluster/cluster.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/fault_plan.hpp"
#include "desloc/core/log.hpp"
#include "desloc/sync/collective_averager.hpp"
#include "desloc/sync/regional_averager.hpp"
#include "desloc/train/out_dir_lock.hpp"
#include "desloc/transport/control_plane.hpp"
#include "desloc/transport/nccl_collective.hpp"
#include "desloc/transport/ring_order.hpp"
#include "desloc/transport/ucx_collective.hpp"

namespace desloc::cluster {
namespace {

using Clock = std::chrono::steady_clock;
}  // namespace

transport::JobToken job_token(const train::JobConfig& cfg) {
  if (!cfg.job.token_file.empty()) return transport::JobToken::from_file(cfg.job.token_file);
  if (!cfg.job.token.empty()) return transport::JobToken::from_string(cfg.job.token, cfg.source);
  if (const char* env = std::getenv(kTokenEnv); env != nullptr && *env != '\0')
    return transport::JobToken::from_string(env, std::string("$") + kTokenEnv);
  throw ConfigError(fmt::format(
      "{}: no job token: set job.token_file (a file only the job's users can read), job.token, "
      "or ${}; every rank must present the same secret",
      cfg.source, kTokenEnv));
}

std::vector<transport::ConfigValue> agreement_values(const train::JobConfig& cfg) {
  std::vector<transport::ConfigValue> out;
  for (const train::ConfigEntry& e : cfg.entries())
    if (e.scope != train::KeyScope::kProcess)
      out.push_back({e.key, transport::config_value(e.value)});
  return out;
}

std::optional<RankIdentity> identity_from_environment(const train::JobConfig& cfg) {
  struct Source {
    const char* rank;
    const char* size;
  };
  for (const Source src : {Source{"SLURM_PROCID", "SLURM_NTASKS"},
                           Source{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}}) {
    const char* r = std::getenv(src.rank);
    const char* n = std::getenv(src.size);
    if (r == nullptr || n == nullptr) continue;
    char* end = nullptr;
    const long g = std::strtol(r, &end, 10);
    const long size = std::strtol(n, nullptr, 10);
    const auto sites = cfg.site_names();
    const int S = static_cast<int>(sites.size());
    const long world = cfg.ranks_of_sites(S);
    if (*end != '\0' || g < 0 || g >= size)
      throw ConfigError(
          fmt::format("${} = '{}' is not a rank below ${} = {}", src.rank, r, src.size, size));
    if (size != world)
      throw ConfigError(
          fmt::format("{}: ${} = {} but the job has {} ranks ({}); start exactly that many tasks",
                      cfg.source, src.size, size, world,
                      cfg.ranks_alike() ? fmt::format("{} sites x {}", S, cfg.job.ranks_per_site)
                                        : std::string("the [[job.site]] tables' ranks")));
    int s = 0;
    while (g >= cfg.first_rank(s + 1)) ++s;
    return RankIdentity{sites[static_cast<std::size_t>(s)],
                        static_cast<int>(g - cfg.first_rank(s))};
  }
  return std::nullopt;
}

std::pair<std::string, std::uint16_t> parse_endpoint(const std::string& text,
                                                     const std::string& what) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    throw ConfigError(fmt::format("{} = '{}' must be host:port", what, text));
  char* end = nullptr;
  const long port = std::strtol(text.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port < 0 || port > 65535)
    throw ConfigError(
        fmt::format("{} = '{}': '{}' is not a port number", what, text, text.substr(colon + 1)));
  std::string host = text.substr(0, colon);
  // An IPv6 address is written in brackets so that its colons are not the port's: [::1]:0.
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return {host, static_cast<std::uint16_t>(port)};
}

namespace {

// Runs `connect`. With `elastic`, a peer that died or a link that broke while the groups
// connected (ucp_ep_create to a worker that is gone, a handshake past its deadline) comes back
// as the reason for a recovery instead of ending the rank; anything else is thrown.
std::optional<std::string> mendable_failure(const std::function<void()>& connect, bool elastic) {
  if (!elastic) {
    connect();
    return std::nullopt;
  }
  try {
    connect();
  } catch (const PeerFailure& e) {
    return e.message();
  } catch (const TransportError& e) {
    return e.message();
  } catch (const TimeoutError& e) {
    return e.message();
  }
  return std::nullopt;
}

// Epochs in a row whose groups a recovering rank fails to connect before it gives up.
constexpr int kMaxConnectAttempts = 3;

// The index in job.sites of the rank's site; ConfigError when the identity is not one of the job.
int home_site(const train::JobConfig& cfg, const RankIdentity& id) {
  const auto sites = cfg.site_names();
  const auto it = std::find(sites.begin(), sites.end(), id.site);
  if (it == sites.end())
    throw ConfigError(fmt::format("--site {}: not a site of {} (job.sites = [{}])", id.site,
                                  cfg.source, fmt::join(sites, ", ")));
  const int site = static_cast<int>(it - sites.begin());
  if (id.rank < 0 || id.rank >= cfg.site_ranks(site))
    throw ConfigError(fmt::format(
        "--rank {}: site {} has {} rank(s) ({} = {}) in {}", id.rank, id.site, cfg.site_ranks(site),
        cfg.job.site.empty() ? "job.ranks_per_site" : "its [[job.site]] table's ranks",
        cfg.site_ranks(site), cfg.source));
  return site;
}

}  // namespace

Session join_job(const train::JobConfig& cfg, const WorkerOptions& opts, bool pair_groups) {
  Session ss;
  ss.sites = cfg.site_names();
  ss.S = static_cast<int>(ss.sites.size());
  const auto& sites = ss.sites;
  ss.site_index = home_site(cfg, opts.id);
  ss.home_site = ss.site_index;
  ss.R = cfg.site_ranks(ss.home_site);
  const int R = ss.R;
  ss.map = std::make_shared<const sync::ShardMap>(cfg.wan_map());
  ss.rank = opts.id.rank;
  ss.name = fmt::format("{}/{}", opts.id.site, opts.id.rank);
  const std::string& name = ss.name;
  const auto [host, port] = parse_endpoint(opts.coordinator, "--coordinator");
  const auto deadline = Clock::now() + std::chrono::seconds(cfg.job.rendezvous_timeout_s);

  // 1. Ports first: their addresses travel in the registration.
  if (uses_nccl(cfg, R) && transport::cuda_device_count() < R)
    throw ConfigError(fmt::format(
        "{}: train.backend = \"cuda\" with {} ranks at site {} needs one GPU per rank of a "
        "site for NCCL, but {} device(s) are visible",
        cfg.source, R, opts.id.site, transport::cuda_device_count()));
  Ports ports = open_ports(cfg, ss, pair_groups);

  // 2. Rendezvous.
  transport::RankClientOptions client_opts;
  client_opts.site = opts.id.site;
  client_opts.rank = static_cast<std::uint32_t>(opts.id.rank);
  client_opts.worker_address = ports.packed;
  client_opts.config_hash = cfg.agreement_hash();
  client_opts.config = agreement_values(cfg);
  client_opts.token = job_token(cfg);
  client_opts.heartbeat_interval = std::chrono::milliseconds(cfg.job.heartbeat_ms);
  client_opts.coordinator_timeout = std::chrono::seconds(cfg.job.coordinator_timeout_s);
  client_opts.tls = {cfg.job.tls, "", "", cfg.job.tls_ca, ""};
  ss.client = std::make_unique<transport::RankClient>(client_opts);
  log::info("{}: registering with the coordinator at {}:{}", name, host, port);
  ss.client->connect(host, port, deadline);
  const transport::Membership m = ss.client->wait_membership(deadline);
  log::info("{}: membership epoch {} with {} ranks", name, m.epoch, m.members.size());
  if (crash_injection(opts.id.site, m.epoch).at_membership) {
    log::warn("fault injection: site {} dies right after membership epoch {}", opts.id.site,
              m.epoch);
    std::_Exit(9);
  }

  // 3. Groups. The WAN ring follows the membership's ring order; data and sum order follow
  // job.sites, which the coordinator's ring order equals (it is configured with them).
  std::vector<std::string> ring;
  for (std::uint32_t i : m.ring_order) ring.push_back(m.sites.at(i));
  // A running job that takes this site back has fewer sites, in the same order.
  std::vector<std::string> kept;
  for (const auto& s : sites)
    if (std::find(ring.begin(), ring.end(), s) != ring.end()) kept.push_back(s);
  const auto at = std::find(ring.begin(), ring.end(), opts.id.site);
  if (kept != ring || at == ring.end() || (m.epoch == 1 && ring != sites))
    throw PeerFailure(fmt::format(
        "{}: the coordinator's ring [{}] does not fit job.sites [{}]; it runs another config", name,
        fmt::join(ring, ", "), fmt::join(sites, ", ")));
  if (m.epoch > 1)
    log::warn(
        "{}: rejoining a running job at membership epoch {} with {} site(s) [{}]; the "
        "state at step {} comes from a peer",
        name, m.epoch, ring.size(), fmt::join(ring, ", "), m.resume_step);
  ss.sites = ring;
  ss.S = static_cast<int>(ring.size());
  ss.site_index = static_cast<int>(at - ring.begin());
  ss.membership = m;
  const auto failed = mendable_failure([&] { connect_groups(cfg, ss, std::move(ports), m); },
                                       cfg.job.on_site_failure == train::OnSiteFailure::kContinue);
  if (failed) {
    // Nothing is trained yet, so this rank holds its start state: it offers that as step 0,
    // which every survivor that has not stepped shares. A rejoining site holds nothing yet.
    log::warn(
        "{}: connecting the groups of membership epoch {} failed ({}); recovering in the "
        "next epoch",
        name, m.epoch, *failed);
    const bool rejoining =
        std::find(m.joining.begin(), m.joining.end(), opts.id.site) != m.joining.end();
    const std::int64_t start = 0;
    ss.recover(cfg, rejoining ? std::span<const std::int64_t>() : std::span(&start, 1), *failed);
  }
  return ss;
}

std::int64_t Session::recover(const train::JobConfig& cfg, std::span<const std::int64_t> snapshots,
                              const std::string& reason) {
  std::string why = reason;
  for (int attempt = 1;; ++attempt) {
    // The straggler rule's evidence, read before the groups go.
    transport::FailureEvidence seen;
    std::vector<const transport::Collective*> groups{site_group.get()};
    for (const auto* rings : {&wan, &region})
      for (const Rings& w : *rings) groups.insert(groups.end(), {w.ring.get(), w.reverse.get()});
    for (const auto* g : groups)
      if (g != nullptr) {
        const transport::FailureEvidence e = g->failure_evidence();
        seen.in_operation = std::max(seen.in_operation, e.in_operation);
        seen.send_wait = std::max(seen.send_wait, e.send_wait);
        if (e.backlog > seen.backlog) {
          seen.backlog = e.backlog;
          seen.backlog_peer = e.backlog_peer;
        }
      }
    // Tear the broken epoch's groups down first (they abort what is in flight).
    pairs.clear();
    region.clear();
    wan.clear();
    site_group.reset();
    Ports ports = open_ports(cfg, *this, false);
    transport::Recover report;
    report.epoch = membership.epoch;
    report.snapshots.assign(snapshots.begin(), snapshots.end());
    report.worker_address = ports.packed;
    report.reason = why.substr(0, transport::kMaxReasonBytes);
    report.operation_ms = transport::wire_ms(seen.in_operation);
    report.send_wait_ms = transport::wire_ms(seen.send_wait);
    report.backlog_ms = transport::wire_ms(seen.backlog);
    report.backlog_peer = seen.backlog_peer;
    const auto deadline = Clock::now() + std::chrono::seconds(cfg.job.recovery_timeout_s) +
                          std::chrono::milliseconds(cfg.job.heartbeat_timeout_ms) +
                          std::chrono::seconds(10);
    const transport::Membership m = client->recover(report, deadline);
    const std::string site = sites[std::size_t(site_index)];
    if (m.sites.empty())
      throw PeerFailure(
          fmt::format("{}: the coordinator ended the job at epoch {}: {}", name, m.epoch, m.note));
    std::vector<std::string> ring;
    for (std::uint32_t i : m.ring_order) ring.push_back(m.sites.at(i));
    const auto at = std::find(ring.begin(), ring.end(), site);
    if (at == ring.end())
      throw PeerFailure(fmt::format("{}: site {} was dropped from the job at epoch {}: {}", name,
                                    site, m.epoch, m.note));
    sites = ring;
    S = static_cast<int>(sites.size());
    site_index = static_cast<int>(at - ring.begin());
    membership = m;
    // A peer of the new epoch may die before the groups are up: that epoch fails in turn.
    const auto failed =
        mendable_failure([&] { connect_groups(cfg, *this, std::move(ports), m); }, true);
    if (!failed) break;
    if (attempt == kMaxConnectAttempts)
      throw PeerFailure(fmt::format(
          "{}: connecting the groups failed in {} membership epochs in a row; giving up (epoch "
          "{}: {})",
          name, attempt, m.epoch, *failed));
    log::warn("{}: connecting the groups of membership epoch {} failed ({}); recovering again",
              name, m.epoch, *failed);
    why = *failed;
  }
  log::warn("{}: membership epoch {}: {} site(s) [{}], rolling back to step {}", name,
            membership.epoch, S, fmt::join(sites, ", "), membership.resume_step);
  return membership.resume_step;
}

train::TrainResult run_worker(const train::JobConfig& cfg, const WorkerOptions& opts) {
  // Before registering, what would end this rank at its start ends it now, while the job
  // does not count on it yet: sites it cannot pair, an identity not of the job, data it cannot
  // read, another process writing its directory.
  const int home = home_site(cfg, opts.id);
  train::load_training_data(cfg);
  const train::OutDirLock lock(train::output_dir(cfg, home, opts.id.rank),
                               fmt::format("desloc worker {}/{}", opts.id.site, opts.id.rank));
  Session ss = join_job(cfg, opts, false);
  std::optional<sync::CollectiveAverager> averager;
  // Hierarchical DES-LOC: the region's averager (over the region group; a region of one live
  // site averages with itself) and the two levels as one.
  std::optional<sync::CollectiveAverager> region_averager;
  std::optional<sync::VirtualAverager> lone_region;
  std::optional<sync::RegionalAverager> regional;
  sync::SyncMeter meter;         // outlives the averagers of every epoch: its counters only grow
  sync::SyncMeter region_meter;  // the region ring's averages (job.regions), likewise
  train::RankContext ctx;
  ctx.site = ss.home_site;
  ctx.rank = ss.rank;
  ctx.device = ss.rank;  // as the site's NCCL communicator (connect_groups)
  ctx.name = ss.name;
  auto bind_groups = [&] {
    averager.emplace(Session::views(ss.wan), *ss.map, ss.site_group.get(),
                     cfg.transport.lane_share);
    sync::PayloadGuard guard;  // names the sites in its warnings (ring positions)
    guard.site_names = ss.sites;
    averager->set_payload_guard(guard);
    // The ring's sites by job index: the averages weigh them as the config does.
    const std::vector<std::string> job_sites = cfg.site_names();
    ctx.live_sites.clear();
    for (const std::string& s : ss.sites)
      ctx.live_sites.push_back(
          static_cast<int>(std::find(job_sites.begin(), job_sites.end(), s) - job_sites.begin()));
    averager->set_weights(cfg.site_weights(ctx.live_sites));
    averager->set_sync_meter(&meter);
    regional.reset();
    region_averager.reset();
    lone_region.reset();
    sync::Averager* bound = &*averager;
    if (!cfg.job.regions.empty()) {
      sync::PayloadGuard region_guard;
      for (int p : ss.region_sites) region_guard.site_names.push_back(ss.sites[std::size_t(p)]);
      sync::Averager* region = nullptr;
      if (!ss.region.empty()) {
        region_averager.emplace(Session::views(ss.region), *ss.map, ss.site_group.get(),
                                cfg.transport.lane_share);
        region_averager->set_sync_meter(&region_meter);
        region = &*region_averager;
      } else {
        lone_region.emplace(1);
        region = &*lone_region;
      }
      region->set_payload_guard(region_guard);
      if (!ss.region.empty()) {
        std::vector<int> region_sites;
        for (int p : ss.region_sites) region_sites.push_back(ctx.live_sites.at(std::size_t(p)));
        region->set_weights(cfg.site_weights(region_sites));
      }
      regional.emplace(*averager, *region, ss.region_sites);
      bound = &*regional;
    }
    // The successor of the first ring (its owner of this rank's first segment).
    const std::string next = ss.sites[std::size_t((ss.site_index + 1) % ss.S)];
    ctx.wan_successor = ss.S > 1 ? fmt::format("{}/{}", next,
                                               ss.map->owner(cfg.site_ranks(cfg.site_index(next)),
                                                             ss.wan.front().segment))
                                 : std::string();
    ctx.averager = bound;
    ctx.site_group = ss.site_group.get();
    ctx.wan_rings = Session::views(ss.wan);
    ctx.shard_map = ss.map.get();
    // The first live site's rank 0 evaluates (site 0 unless it failed).
    ctx.evaluates = ss.site_index == 0 && ss.rank == 0;
    ctx.epoch = ss.membership.epoch;
    ctx.joining_sites.clear();
    ctx.joining = false;
    for (const auto& site : ss.membership.joining) {
      const auto at = std::find(ss.sites.begin(), ss.sites.end(), site);
      ctx.joining_sites.push_back(static_cast<int>(at - ss.sites.begin()));
      ctx.joining = ctx.joining || at - ss.sites.begin() == ss.site_index;
    }
    ctx.join_step = ss.membership.resume_step;
  };
  bind_groups();
  ctx.on_step = [&ss](std::int64_t step) { ss.client->set_step(static_cast<std::uint64_t>(step)); };
  ctx.on_progress = [&ss, &meter, &region_meter](transport::RankReport report) {
    meter.fill(report);
    report.region_lane = region_meter.lane(0);
    ss.client->set_report(report);
  };
  if (cfg.job.on_site_failure == train::OnSiteFailure::kContinue) {
    ctx.recovery_pending = [&ss] { return ss.client->recovery_pending(); };
    ctx.recover = [&](std::span<const std::int64_t> snapshots, const std::string& reason) {
      regional.reset();
      region_averager.reset();
      lone_region.reset();
      averager.reset();
      const std::int64_t resume = ss.recover(cfg, snapshots, reason);
      bind_groups();
      return resume;
    };
  }
  // A stalled collective only knows which neighbour went quiet; the coordinator knows who left.
  auto with_lost = [&ss, &cfg](const std::string& message) {
    const auto until = Clock::now() + std::chrono::milliseconds(cfg.job.heartbeat_timeout_ms);
    std::vector<std::string> lost = ss.client->lost_peers();
    while (lost.empty() && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      lost = ss.client->lost_peers();
    }
    if (lost.empty()) return message;
    return fmt::format("{}; the coordinator reports lost: {}", message, fmt::join(lost, ", "));
  };
  train::TrainResult result;
  try {
    result = train::run_training(cfg, opts.train, &ctx);
  } catch (const TimeoutError& e) {
    throw TimeoutError(with_lost(e.message()));
  } catch (const PeerFailure& e) {
    throw PeerFailure(with_lost(e.message()));
  } catch (const TransportError& e) {
    throw TransportError(with_lost(e.message()));
  }
  // Leave together: nobody tears down its UCX worker while a peer still finishes the last
  // operation. Then tell the coordinator this rank finished, so its exit is no failure.
  ss.leave();
  ss.client->finish();
  return result;
}

void Session::leave() {
  if (site_group) site_group->barrier();
  for (const auto* rings : {&wan, &region})
    for (const Rings& w : *rings) {
      w.ring->barrier();
      if (w.reverse) w.reverse->barrier();
    }
}

std::vector<sync::WanRing> Session::views(const std::vector<Rings>& rings) {
  std::vector<sync::WanRing> out;
  for (const Rings& w : rings) out.push_back({w.segment, w.ring.get(), w.reverse.get()});
  return out;
}

}  // namespace desloc::cluster
