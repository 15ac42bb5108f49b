// Scaffolding shared by the unit tests: a watchdog that turns a hang into an abort naming the
// test; run_ranks, one group of N ranks (threads) over any Collective backend built here; and an
// in-process UCX world of S sites x R ranks with the site, WAN and reversed-WAN groups a
// `desloc worker` builds.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "desloc/sync/collective_averager.hpp"
#include "desloc/sync/shard_map.hpp"
#include "desloc/transport/nccl_collective.hpp"
#include "desloc/transport/ring_order.hpp"
#include "desloc/transport/ucx_collective.hpp"

namespace desloc::test_support {

// The running test as "Suite.Name", or "(no test)" outside one.
inline std::string current_test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info == nullptr) return "(no test)";
  return std::string(info->test_suite_name()) + "." + info->name();
}

// Aborts the whole test binary if the guarded scope outlives `limit`: a hang becomes a failure
// naming the test (and `what`, when given) instead of a stuck CI job.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit, std::string what = {})
      : thread_([this, limit, name = current_test_name(), what = std::move(what)] {
          std::unique_lock lock(mutex_);
          if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
            std::fprintf(stderr, "WATCHDOG: %s%s%s exceeded %lld s; aborting\n", name.c_str(),
                         what.empty() ? "" : ": ", what.c_str(),
                         static_cast<long long>(limit.count()));
            std::abort();
          }
        }) {}
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: started once the members it waits on exist
};

// The Collective backends: UCX over tcp on loopback and over shared memory (posix, sysv, cma),
// each eager only as a job runs it (transport.rndv_thresh = "inf") and with UCX's rendezvous;
// NCCL on the GPUs present, one rank per device.
enum class Backend {
  kUcxTcp,
  kUcxTcpRendezvous,
  kUcxTcpLinger,  // the wide-area groups' progress: no spin, a 5 ms linger
  kUcxSharedMemory,
  kUcxSharedMemoryRendezvous,
  kNccl
};

inline const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kUcxTcp:
      return "ucx_tcp";
    case Backend::kUcxTcpRendezvous:
      return "ucx_tcp_rndv";
    case Backend::kUcxTcpLinger:
      return "ucx_tcp_linger";
    case Backend::kUcxSharedMemory:
      return "ucx_sm";
    case Backend::kUcxSharedMemoryRendezvous:
      return "ucx_sm_rndv";
    case Backend::kNccl:
      return "nccl";
  }
  return "?";
}

inline bool is_ucx(Backend b) { return b != Backend::kNccl; }

inline transport::UcxOptions ucx_options(Backend b) {
  transport::UcxOptions o;
  o.tls = "tcp";
  o.net_devices = "lo";
  o.rndv_thresh = "inf";
  if (b == Backend::kUcxTcpRendezvous || b == Backend::kUcxSharedMemoryRendezvous)
    o.rndv_thresh = "";
  if (b == Backend::kUcxTcpLinger) {
    o.spin_iterations = 0;
    o.linger_us = 5000;
  }
  if (b == Backend::kUcxSharedMemory || b == Backend::kUcxSharedMemoryRendezvous) {
    o.tls = "sm";  // every rank is a thread of this process
    o.net_devices = "";
    o.peer_failure_detection = false;  // UCX 1.13 shm: "no peer failure handler"
  }
  return o;
}

// Runs body(collective, rank) on `size` ranks of `backend`, each a thread with its own
// Collective, under a watchdog. UCX ranks connect as a `desloc worker` does (open a port,
// publish its address, connect to the successor's); NCCL rank r uses device r. Every rank keeps
// its Collective until all bodies are done, as long-lived processes do. Exceptions are captured
// per rank; once all have joined, the first (in rank order) is named on stderr and rethrown as
// it was thrown, so the caller can still catch it by type.
inline void run_ranks(Backend backend, int size, const transport::CollectiveOptions& options,
                      const std::function<void(transport::Collective&, int)>& body,
                      std::chrono::seconds limit = std::chrono::seconds(60)) {
  Watchdog watchdog(
      limit, std::string("run_ranks ") + backend_name(backend) + " size " + std::to_string(size));
  transport::InMemoryAddressBook book;
  const transport::NcclId id =
      backend == Backend::kNccl ? transport::nccl_unique_id() : transport::NcclId{};
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::latch done(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<transport::Collective> c;
      try {
        if (backend == Backend::kNccl) {
          c = transport::make_nccl_collective(r, size, id, r, options);
        } else {
          auto port = transport::open_ucx_port(ucx_options(backend));
          book.publish(r, port->address());
          const auto successor = book.lookup(
              (r + 1) % size, std::chrono::steady_clock::now() + std::chrono::seconds(20));
          c = transport::connect_ucx_collective(std::move(port), r, size, successor, options);
        }
        body(*c, r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
      done.arrive_and_wait();
    });
  for (auto& t : threads) t.join();
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "run_ranks: rank %zu failed: %s\n", r, e.what());
    } catch (...) {
    }
    std::rethrow_exception(errors[r]);
  }
}

// Why `backend` cannot run `size` ranks here ("" if it can): no GPU, or fewer GPUs than ranks,
// for NCCL; for UCX, a 2-rank barrier that fails (run once per backend, then remembered).
inline std::string backend_unavailable(Backend backend, int size) {
  if (backend == Backend::kNccl) {
    if (!transport::nccl_available()) return "no CUDA device (or NCCL not built)";
    if (transport::cuda_device_count() < size)
      return std::to_string(transport::cuda_device_count()) + " CUDA device(s) for " +
             std::to_string(size) + " ranks (NCCL takes one device per rank)";
    return {};
  }
  static std::mutex mutex;
  static std::vector<std::pair<Backend, std::string>> cache;
  std::lock_guard lock(mutex);
  for (auto& [b, result] : cache)
    if (b == backend) return result;
  std::string failure;
  transport::CollectiveOptions o;
  o.deadline = std::chrono::seconds(5);
  try {
    run_ranks(backend, 2, o, [](transport::Collective& c, int) { c.barrier(); });
  } catch (const std::exception& e) {
    failure = e.what();
  }
  cache.emplace_back(backend, failure);
  return failure;
}

// How run_world builds each rank's groups.
struct WorldOptions {
  transport::CollectiveOptions collective;  // every group's options (deadline, chunk_bytes)
  bool two_lanes = false;                   // a reversed-ring WAN group as well (the second lane)
  bool wan_chunk_headers = true;            // chunk headers on the WAN groups
  bool lone_site_group = true;  // a site group of 1 when R == 1 (false: site stays null)
  std::chrono::seconds lookup_timeout = std::chrono::seconds(20);  // for peers' addresses
};

// One rank's groups, alive until every rank of the world has left its body.
struct Groups {
  std::unique_ptr<transport::Collective> site;     // ranks of this site; null if none was built
  std::unique_ptr<transport::Collective> wan;      // the first segment's ring: rank r of every site
  std::unique_ptr<transport::Collective> reverse;  // the WAN ring reversed; null with one lane
  // Sites of unequal rank counts: the segments (sync::ShardMap) this rank owns, the first
  // being wan's and reverse's, and the rings of the others, in segment order.
  std::vector<int> segments;
  std::vector<std::unique_ptr<transport::Collective>> more_rings, more_reverses;
  std::vector<sync::WanRing> wan_rings() const {
    std::vector<sync::WanRing> out{{segments.at(0), wan.get(), reverse.get()}};
    for (std::size_t i = 0; i < more_rings.size(); ++i)
      out.push_back({segments.at(i + 1), more_rings[i].get(), more_reverses[i].get()});
    return out;
  }
};

// Sites of site_ranks[s] ranks each, as threads over UCX loopback. Rank (s, r) opens its
// ports, publishes their addresses (site books per site, a WAN and a reverse book per segment
// of the sync::ShardMap), connects its groups (the site's, and one ring per segment it owns),
// runs body(s, r, groups), and waits on a barrier for every rank before its groups close.
// Once all have joined, the first failed rank (in site, then rank order) is named on stderr
// and its exception rethrown as it was thrown, so the caller can still catch it by type.
inline void run_world(const std::vector<int>& site_ranks, const WorldOptions& world,
                      const std::function<void(int s, int r, Groups&)>& body) {
  const int S = static_cast<int>(site_ranks.size());
  const sync::ShardMap map(site_ranks);
  std::vector<transport::InMemoryAddressBook> site_books(static_cast<std::size_t>(S));
  std::vector<transport::InMemoryAddressBook> wan_books(static_cast<std::size_t>(map.segments()));
  std::vector<transport::InMemoryAddressBook> reverse_books(wan_books.size());
  std::vector<std::size_t> first(static_cast<std::size_t>(S) + 1, 0);
  for (int s = 0; s < S; ++s)
    first[std::size_t(s) + 1] = first[std::size_t(s)] + std::size_t(site_ranks[std::size_t(s)]);
  std::vector<std::exception_ptr> errors(first.back());
  std::latch done(static_cast<std::ptrdiff_t>(first.back()));
  std::vector<std::thread> threads;
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < site_ranks[std::size_t(s)]; ++r)
      threads.emplace_back([&, s, r] {
        const int R = site_ranks[std::size_t(s)];
        const std::size_t me = first[std::size_t(s)] + std::size_t(r);
        Groups groups;
        try {
          const auto deadline = std::chrono::steady_clock::now() + world.lookup_timeout;
          const bool with_site = R > 1 || world.lone_site_group;
          auto site_port = with_site ? transport::open_ucx_port() : nullptr;
          const sync::ShardMap::Segments owned = map.segments_of(R, r);
          std::vector<std::unique_ptr<transport::UcxPort>> wan_ports, reverse_ports;
          const int back = transport::reversed_rank(s, S);
          for (int j = owned.first; j < owned.last; ++j) {
            groups.segments.push_back(j);
            wan_ports.push_back(transport::open_ucx_port());
            wan_books[std::size_t(j)].publish(s, wan_ports.back()->address());
            reverse_ports.push_back(world.two_lanes ? transport::open_ucx_port() : nullptr);
            if (world.two_lanes)
              reverse_books[std::size_t(j)].publish(back, reverse_ports.back()->address());
          }
          if (with_site) site_books[std::size_t(s)].publish(r, site_port->address());
          if (with_site)
            groups.site = transport::connect_ucx_collective(
                std::move(site_port), r, R,
                site_books[std::size_t(s)].lookup((r + 1) % R, deadline), world.collective);
          auto wan_options = world.collective;
          if (world.wan_chunk_headers) wan_options.chunk_headers = true;
          for (std::size_t i = 0; i < groups.segments.size(); ++i) {
            const auto j = static_cast<std::size_t>(groups.segments[i]);
            auto ring = transport::connect_ucx_collective(
                std::move(wan_ports[i]), s, S, wan_books[j].lookup((s + 1) % S, deadline),
                wan_options);
            std::unique_ptr<transport::Collective> reverse;
            if (world.two_lanes)
              reverse = transport::connect_ucx_collective(
                  std::move(reverse_ports[i]), back, S,
                  reverse_books[j].lookup((back + 1) % S, deadline), wan_options);
            if (i == 0) {
              groups.wan = std::move(ring);
              groups.reverse = std::move(reverse);
            } else {
              groups.more_rings.push_back(std::move(ring));
              groups.more_reverses.push_back(std::move(reverse));
            }
          }
          body(s, r, groups);
        } catch (...) {
          errors[me] = std::current_exception();
        }
        done.arrive_and_wait();
      });
  for (auto& t : threads) t.join();
  const auto failed_first =
      std::find_if(errors.begin(), errors.end(), [](auto& e) { return bool(e); });
  if (failed_first == errors.end()) return;
  const auto i = static_cast<std::size_t>(failed_first - errors.begin());
  const auto failed = std::count_if(failed_first, errors.end(), [](auto& e) { return bool(e); });
  std::string what = "(not a std::exception)";
  try {
    std::rethrow_exception(*failed_first);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  const auto site =
      static_cast<std::size_t>(std::upper_bound(first.begin(), first.end(), i) - first.begin() - 1);
  std::fprintf(stderr, "run_world: site %zu rank %zu failed (the first of %td): %s\n", site,
               i - first[site], failed, what.c_str());
  std::rethrow_exception(*failed_first);
}

// S sites x R ranks each.
inline void run_world(int S, int R, const WorldOptions& world,
                      const std::function<void(int s, int r, Groups&)>& body) {
  run_world(std::vector<int>(static_cast<std::size_t>(S), R), world, body);
}

}  // namespace desloc::test_support
