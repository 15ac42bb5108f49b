// A rank's UCX groups (groups.hpp).
#include "cluster/groups.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "desloc/core/error.hpp"
#include "desloc/core/fault_plan.hpp"
#include "desloc/core/log.hpp"
#include "desloc/optim/optimizer.hpp"
#include "desloc/transport/nccl_collective.hpp"
#include "desloc/transport/ring_order.hpp"

namespace desloc::cluster {
namespace {

// The Hello's opaque address field carries the UCX worker addresses of this rank's groups
// (an entry is empty when its group has one member or this rank is not in it).
std::vector<std::uint8_t> pack_addresses(const std::vector<transport::WorkerAddress>& all) {
  std::vector<std::uint8_t> out;
  for (const auto& a : all) {
    const auto n = static_cast<std::uint32_t>(a.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(n >> (8 * i)));
    for (std::byte b : a) out.push_back(static_cast<std::uint8_t>(b));
  }
  return out;
}

transport::WorkerAddress unpack_address(const std::vector<std::uint8_t>& blob, int which,
                                        const std::string& owner) {
  std::size_t at = 0;
  for (int k = 0;; ++k) {
    if (at + 4 > blob.size())
      throw PeerFailure(fmt::format("the membership's address entry of {} is truncated", owner));
    std::uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= std::uint32_t(blob[at + std::size_t(i)]) << (8 * i);
    at += 4;
    if (at + n > blob.size())
      throw PeerFailure(fmt::format("the membership's address entry of {} is truncated", owner));
    if (k == which) {
      transport::WorkerAddress a(n);
      std::memcpy(a.data(), blob.data() + at, n);
      if (a.empty())
        throw PeerFailure(fmt::format("{} registered no UCX address for this group", owner));
      return a;
    }
    at += n;
  }
}

transport::UcxOptions ucx_options(const train::TransportSection& t, bool wide_area) {
  transport::UcxOptions o;
  o.tls = wide_area ? t.tls : t.site_tls;
  o.net_devices = wide_area ? t.net_devices : t.site_net_devices;
  o.rndv_thresh = t.rndv_thresh;
  o.spin_iterations = wide_area ? t.wan_spin_iterations : t.spin_iterations;
  o.linger_us = wide_area ? t.wan_linger_us : 0;
  // UCX 1.13's shared-memory transports refuse peer-failure endpoints (docs/transport.md).
  const bool shm =
      o.tls.find("sm") != std::string::npos || o.tls.find("posix") != std::string::npos ||
      o.tls.find("sysv") != std::string::npos || o.tls.find("cma") != std::string::npos;
  o.peer_failure_detection = !shm;
  return o;
}

const transport::MemberEntry& member(const transport::Membership& m, const std::string& site,
                                     std::uint32_t rank) {
  for (const auto& e : m.members)
    if (e.site == site && e.rank == rank) return e;
  throw PeerFailure(
      fmt::format("the coordinator's membership (epoch {}) lacks {}/{}", m.epoch, site, rank));
}

// Address slots: 0 the site group, 1 the site's NCCL id (cuda backend, rank 0), 2 + k
// (profiling, rank 0 only) a pair with site k of the job, then four per segment j of the
// job's shard map: its ring, its reversed ring, its region ring and that one's reverse. A slot
// is empty when its group has one member or the rank does not own the segment.
constexpr int kSiteSlot = 0, kNcclSlot = 1, kPairSlot = 2;
enum RingKind { kRing = 0, kReverse = 1, kRegion = 2, kRegionReverse = 3 };
int segment_slot(const train::JobConfig& cfg, int segment, RingKind kind) {
  return kPairSlot + static_cast<int>(cfg.site_names().size()) + 4 * segment + kind;
}

// The sites of `site`'s region (job.regions) that are in `sites`, in the region's ring order;
// empty without regions.
std::vector<std::string> live_region(const train::JobConfig& cfg,
                                     const std::vector<std::string>& sites,
                                     const std::string& site) {
  for (const auto& region : cfg.job.regions) {
    if (std::find(region.begin(), region.end(), site) == region.end()) continue;
    std::vector<std::string> live;
    for (const auto& s : region)
      if (std::find(sites.begin(), sites.end(), s) != sites.end()) live.push_back(s);
    return live;
  }
  return {};
}

// The rank of `site` that owns `segment` of the job's shard map.
std::uint32_t owner_at(const train::JobConfig& cfg, const sync::ShardMap& map,
                       const std::string& site, int segment) {
  return static_cast<std::uint32_t>(map.owner(cfg.site_ranks(cfg.site_index(site)), segment));
}

// Segment `segment`'s wide-area ring over `ring`'s sites (each joined by the rank that owns the
// segment there), this rank being that of ring[me]: in the ring's order, or `reversed` (a
// second lane: site i has group rank reversed_rank(i, n) and its successor is site i - 1). The
// successor's address is the segment's `kind` slot of its registration. One site makes a group
// of one, which needs no port.
std::unique_ptr<transport::Collective> connect_ring(const train::JobConfig& cfg,
                                                    const sync::ShardMap& map,
                                                    std::unique_ptr<transport::UcxPort> port,
                                                    const std::vector<std::string>& ring, int me,
                                                    int segment, RingKind kind, bool reversed,
                                                    transport::CollectiveOptions o,
                                                    const transport::Membership& m) {
  const int n = static_cast<int>(ring.size());
  for (int p = 0; p < n; ++p) {
    const std::string& s = ring[std::size_t(reversed ? (n - p) % n : p)];
    o.peer_names.push_back(fmt::format("{}/{}", s, owner_at(cfg, map, s, segment)));
  }
  transport::WorkerAddress successor;
  if (n > 1) {
    const std::string& s = ring[std::size_t(reversed ? (me - 1 + n) % n : (me + 1) % n)];
    const auto& next = member(m, s, owner_at(cfg, map, s, segment));
    successor = unpack_address(next.worker_address, segment_slot(cfg, segment, kind),
                               fmt::format("{}/{}", next.site, next.rank));
  }
  return transport::connect_ucx_collective(n > 1 ? std::move(port) : nullptr,
                                           reversed ? transport::reversed_rank(me, n) : me, n,
                                           successor, o);
}

}  // namespace

CrashInjection crash_injection(const std::string& site, std::uint64_t epoch) {
  const std::optional<FaultPlan::Crash> c = FaultPlan::from_environment().crash;
  if (!c || epoch != 1 || c->site != site) return {};
  CrashInjection at;
  at.at_membership = c->at_membership;
  if (c->at_membership) return at;
  at.in_average.step = c->step;
  at.in_average.state = static_cast<std::uint8_t>(c->state == 'x'   ? optim::StateKind::kX
                                                  : c->state == 'u' ? optim::StateKind::kU
                                                                    : optim::StateKind::kV);
  log::warn("fault injection: site {} dies halfway through its {} average at step {}", site,
            c->state, c->step);
  return at;
}

bool uses_nccl(const train::JobConfig& cfg, int site_ranks) {
  return cfg.train.backend == model::Backend::kCuda && site_ranks > 1;
}

Ports open_ports(const train::JobConfig& cfg, const Session& ss, bool pair_groups) {
  const int R = ss.R;
  const std::vector<std::string> names = cfg.site_names();
  const int job_sites = std::max(ss.S, static_cast<int>(names.size()));
  const bool nccl = uses_nccl(cfg, R);
  Ports p;
  if (R > 1 && !nccl) p.site = transport::open_ucx_port(ucx_options(cfg.transport, false));
  const bool lanes = transport::effective_lanes(cfg.transport.lanes, job_sites) == 2;
  // The whole region: a recovery opens ports before it knows who survives.
  const auto whole = live_region(cfg, names, names.at(static_cast<std::size_t>(ss.home_site)));
  const bool region_lanes =
      transport::effective_lanes(cfg.transport.lanes, static_cast<int>(whole.size())) == 2;
  // Profiling uses one wide-area ring, segment 0's (rank 0 of every site): its other ranks time
  // their compute step and leave, and no ring of theirs may wait on a rank measuring links.
  const sync::ShardMap::Segments mine = pair_groups
                                            ? sync::ShardMap::Segments{0, ss.rank == 0 ? 1 : 0}
                                            : ss.map->segments_of(R, ss.rank);
  for (int j = mine.first; j < mine.last; ++j) {
    Ports::Segment s;
    s.segment = j;
    if (job_sites > 1) s.ring = transport::open_ucx_port(ucx_options(cfg.transport, true));
    if (lanes) s.reverse = transport::open_ucx_port(ucx_options(cfg.transport, true));
    if (!cfg.job.regions.empty()) {
      s.region = transport::open_ucx_port(ucx_options(cfg.transport, true));
      if (region_lanes)
        s.region_reverse = transport::open_ucx_port(ucx_options(cfg.transport, true));
    }
    p.segments.push_back(std::move(s));
  }
  transport::WorkerAddress nccl_id;
  if (nccl && ss.rank == 0) {
    const auto id = transport::nccl_unique_id();
    nccl_id.assign(id.begin(), id.end());
  }
  auto address = [](const std::unique_ptr<transport::UcxPort>& port) {
    return port ? port->address() : transport::WorkerAddress{};
  };
  std::vector<transport::WorkerAddress> addresses{address(p.site), nccl_id};
  p.pairs.resize(static_cast<std::size_t>(job_sites));
  for (int k = 0; k < job_sites; ++k) {
    if (pair_groups && ss.rank == 0 && k != ss.site_index && k < ss.S) {
      // The profile's pairs time round trips: a linger would add to each.
      transport::UcxOptions pair = ucx_options(cfg.transport, true);
      pair.linger_us = 0;
      p.pairs[std::size_t(k)] = transport::open_ucx_port(pair);
    }
    addresses.push_back(address(p.pairs[std::size_t(k)]));
  }
  addresses.resize(static_cast<std::size_t>(segment_slot(cfg, ss.map->segments(), kRing)));
  for (const Ports::Segment& s : p.segments) {
    addresses[std::size_t(segment_slot(cfg, s.segment, kRing))] = address(s.ring);
    addresses[std::size_t(segment_slot(cfg, s.segment, kReverse))] = address(s.reverse);
    addresses[std::size_t(segment_slot(cfg, s.segment, kRegion))] = address(s.region);
    addresses[std::size_t(segment_slot(cfg, s.segment, kRegionReverse))] =
        address(s.region_reverse);
  }
  p.packed = pack_addresses(addresses);
  return p;
}

void connect_groups(const train::JobConfig& cfg, Session& ss, Ports ports,
                    const transport::Membership& m) {
  const int S = ss.S, R = ss.R, site_index = ss.site_index;
  const auto& sites = ss.sites;
  const std::string& site = sites[std::size_t(site_index)];
  transport::CollectiveOptions base;
  base.deadline =
      std::chrono::milliseconds(static_cast<std::int64_t>(cfg.transport.deadline_s * 1e3));
  base.chunk_bytes = static_cast<std::size_t>(cfg.transport.chunk_bytes);
  base.max_inflight_chunks = static_cast<std::size_t>(cfg.transport.inflight_chunks);
  base.epoch = m.epoch;
  if (cfg.job.on_site_failure == train::OnSiteFailure::kContinue) {
    transport::RankClient* client = ss.client.get();
    base.should_abort = [client] { return client->recovery_pending(); };
  }
  const transport::OpLabel crash = crash_injection(site, m.epoch).in_average;

  if (uses_nccl(cfg, R)) {
    auto o = base;
    const auto& root = member(m, site, 0);
    const auto blob = unpack_address(root.worker_address, kNcclSlot, site + "/0 (NCCL id)");
    transport::NcclId id{};
    if (blob.size() != id.size())
      throw PeerFailure(fmt::format("{}/0 registered a {}-byte NCCL id; expected {}", site,
                                    blob.size(), id.size()));
    std::copy(blob.begin(), blob.end(), id.begin());
    // One GPU per rank of the site: rank r uses device r.
    ss.site_group = transport::make_nccl_collective(ss.rank, R, id, ss.rank, o);
    log::info("{}: site group over NCCL on device {}", ss.name, ss.rank);
  } else if (R > 1) {
    auto o = base;
    for (int q = 0; q < R; ++q) o.peer_names.push_back(fmt::format("{}/{}", site, q));
    const auto& next = member(m, site, static_cast<std::uint32_t>((ss.rank + 1) % R));
    ss.site_group = transport::connect_ucx_collective(
        std::move(ports.site), ss.rank, R,
        unpack_address(next.worker_address, kSiteSlot, fmt::format("{}/{}", next.site, next.rank)),
        o);
  }
  // The wide-area rings of each segment this rank owns: every site's owner of it, and this
  // site's region's, each with its second lane (the reversed ring) from three sites on at
  // transport.lanes = 2.
  auto wide = base;
  wide.chunk_headers = cfg.transport.chunk_headers;
  wide.crash_in = crash;  // $DESLOC_INJECT_CRASH, also at a step only the regions average
  ss.wan.clear();
  ss.region.clear();
  ss.region_sites.clear();
  const auto region = live_region(cfg, sites, site);
  for (const auto& s : region)
    ss.region_sites.push_back(
        static_cast<int>(std::find(sites.begin(), sites.end(), s) - sites.begin()));
  const int n = static_cast<int>(region.size());
  const int me = static_cast<int>(std::find(region.begin(), region.end(), site) - region.begin());
  for (Ports::Segment& port : ports.segments) {
    const int j = port.segment;
    Session::Rings w;
    w.segment = j;
    w.ring = connect_ring(cfg, *ss.map, std::move(port.ring), sites, site_index, j, kRing, false,
                          wide, m);
    if (transport::effective_lanes(cfg.transport.lanes, S) == 2)
      w.reverse = connect_ring(cfg, *ss.map, std::move(port.reverse), sites, site_index, j,
                               kReverse, true, wide, m);
    ss.wan.push_back(std::move(w));
    if (n <= 1) continue;
    Session::Rings g;
    g.segment = j;
    g.ring =
        connect_ring(cfg, *ss.map, std::move(port.region), region, me, j, kRegion, false, wide, m);
    if (transport::effective_lanes(cfg.transport.lanes, n) == 2)
      g.reverse = connect_ring(cfg, *ss.map, std::move(port.region_reverse), region, me, j,
                               kRegionReverse, true, wide, m);
    ss.region.push_back(std::move(g));
  }
  ss.pairs.clear();
  ss.pairs.resize(static_cast<std::size_t>(S));
  // Pair ports exist only for profiling (opened for the world at the time, never in a recovery).
  for (int k = 0; k < S && std::size_t(k) < ports.pairs.size(); ++k) {
    if (!ports.pairs[std::size_t(k)]) continue;
    auto o = base;
    const int mine = site_index < k ? 0 : 1;
    o.peer_names = mine == 0 ? std::vector<std::string>{ss.name, sites[std::size_t(k)] + "/0"}
                             : std::vector<std::string>{sites[std::size_t(k)] + "/0", ss.name};
    const auto& other = member(m, sites[std::size_t(k)], 0);
    ss.pairs[std::size_t(k)] = transport::connect_ucx_collective(
        std::move(ports.pairs[std::size_t(k)]), mine, 2,
        unpack_address(other.worker_address, kPairSlot + site_index, other.site + "/0"), o);
  }
  ss.membership = m;
}

}  // namespace desloc::cluster
