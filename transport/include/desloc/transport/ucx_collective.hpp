// Factory for the UCX Collective (ring algorithms over UCP tag matching) and the address
// exchange it bootstraps from: in memory for ranks-as-threads, the control plane otherwise.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "desloc/transport/collective.hpp"

namespace desloc::transport {

using WorkerAddress = std::vector<std::byte>;  // opaque ucp_address_t bytes

// Where ranks publish their UCX worker address and look up their peers'.
class AddressExchange {
 public:
  virtual ~AddressExchange() = default;
  virtual void publish(int rank, WorkerAddress address) = 0;
  // Blocks until `rank` has published; throws TimeoutError naming the rank at `deadline`.
  virtual WorkerAddress lookup(int rank, std::chrono::steady_clock::time_point deadline) = 0;
};

// Thread-safe in-process table, for ranks running as threads of one process (tests, benches).
class InMemoryAddressBook final : public AddressExchange {
 public:
  void publish(int rank, WorkerAddress address) override;
  WorkerAddress lookup(int rank, std::chrono::steady_clock::time_point deadline) override;

 private:
  std::mutex mutex_;
  std::condition_variable published_;
  std::map<int, WorkerAddress> addresses_;
};

// UCX settings, applied per context through ucp_config_modify (never through the process
// environment, so ranks-as-threads can differ). Empty string = UCX's own default.
struct UcxOptions {
  // UCX_TLS. "tcp" is the only choice that crosses network namespaces (cma/posix bypass the
  // shaped link); "sm" (posix, sysv, cma) is the fast intra-host choice.
  std::string tls = "tcp";
  // UCX_NET_DEVICES. Set it explicitly with tcp: UCX's default device choice hangs between
  // namespaces. Ignored (left to UCX) when tls has no network transport.
  std::string net_devices = "lo";
  // UCX_RNDV_THRESH. Traffic in both directions through rendezvous runs at about half rate on
  // this UCX (1.13) unless raised to "inf"; leave empty for UCX's default.
  std::string rndv_thresh;
  // Progress-loop iterations before sleeping on the worker's event fd (ucp_worker_arm + poll).
  // 0 = sleep as soon as UCX has nothing to do; large values busy-poll a core.
  int spin_iterations = 64;
  // Then, where > 0, sleep this long and progress what arrived, for as long as each linger
  // brings work, before sleeping on the event fd: one wake-up per linger instead of one per
  // few packets of a stream (UcxWorker::wait_until). Adds at most this latency per wait.
  int linger_us = 0;
  // Ask UCX to report a failed successor (UCP_ERR_HANDLING_MODE_PEER), so a send to a dead
  // rank fails fast with PeerFailure instead of waiting for the deadline. UCX 1.13's
  // shared-memory transports have no peer-failure handler and refuse such endpoints
  // ("Destination is unreachable"): set false with tls = "sm"; the deadline still bounds waits.
  bool peer_failure_detection = true;
};

// A UCX context and worker opened before the group is known, so that its address can travel
// through the control plane's rendezvous; connect_ucx_collective turns it into a group member
// once the membership (every peer's address) has arrived.
class UcxPort {
 public:
  virtual ~UcxPort() = default;
  virtual WorkerAddress address() const = 0;
};
std::unique_ptr<UcxPort> open_ucx_port(const UcxOptions& ucx = {});

// Rank `rank` of a `size`-rank group over an open port, with an endpoint to its ring
// successor, whose address is `successor` ((rank + 1) % size). size == 1 ignores both.
std::unique_ptr<Collective> connect_ucx_collective(std::unique_ptr<UcxPort> port, int rank,
                                                   int size, const WorkerAddress& successor,
                                                   const CollectiveOptions& options = {});

// Creates rank `rank` of a `size`-rank group: its own UCX context and worker, its address
// published to `exchange`, and an endpoint to its ring successor (rank + 1) % size. The ring
// order is the rank order; a caller with a planned ring order numbers its ranks accordingly.
// Throws TransportError on UCX failures and TimeoutError if the successor's address does not
// appear within options.deadline. size == 1 creates no UCX objects.
std::unique_ptr<Collective> make_ucx_collective(int rank, int size, AddressExchange& exchange,
                                                const CollectiveOptions& options = {},
                                                const UcxOptions& ucx = {});

}  // namespace desloc::transport
