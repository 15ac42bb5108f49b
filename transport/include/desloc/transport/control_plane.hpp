// The control plane over TCP (Boost.Asio, kept out of this header): the Coordinator runs
// rendezvous, authentication, membership and heartbeat tracking; each rank's RankClient
// registers with it and keeps it informed.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "desloc/transport/auth.hpp"
#include "desloc/transport/job_history.hpp"
#include "desloc/transport/wire.hpp"

namespace desloc::transport {

// Version of the control protocol (message meaning), carried in Hello. The frame format has
// its own kWireVersion.
// 2: recovery epochs; 3: heartbeats carry the loss, tokens/s and wide-area bytes; 4: and the
// sync-duration histogram, the lanes' bytes and rates, and the payload guard's rejections; 5:
// and the parameter-average period in force, the re-plans, the region ring's lane and the
// rank's TCP backlog; Recover carries the straggler rule's evidence; 6: the heartbeat's and
// Recover's TCP backlog name the address their slowest socket leads to; 7: Hello carries the
// config's keys, and the config hash covers every key the ranks must agree on.
inline constexpr std::uint16_t kProtocolVersion = 7;

using Clock = std::chrono::steady_clock;

struct RankId {
  std::string site;
  std::uint32_t rank = 0;
  auto operator<=>(const RankId&) const = default;
  std::string str() const { return site + "/" + std::to_string(rank); }
};

// TLS for the control connections (off by default). The coordinator presents cert_file and
// key_file; each rank verifies that chain against ca_file and the name it connects to. The
// job token still authenticates the ranks: TLS adds confidentiality and the coordinator's
// identity.
struct TlsOptions {
  bool enabled = false;
  std::string cert_file;  // coordinator: PEM certificate chain, its own certificate first
  std::string key_file;   // coordinator: PEM private key of that certificate
  std::string ca_file;    // rank: PEM CA certificate(s) to trust; "" = the system's CAs
  // rank: the name (DNS or IP) the coordinator's certificate must carry; "" = the host given
  // to RankClient::connect().
  std::string server_name;
};

// The rank count of `site`: ranks[s] where names[s] is the site, else `otherwise`.
inline std::size_t site_rank_count(const std::vector<std::string>& names,
                                   const std::vector<std::size_t>& ranks, std::size_t otherwise,
                                   const std::string& site) {
  for (std::size_t s = 0; s < ranks.size() && s < names.size(); ++s)
    if (names[s] == site) return ranks[s];
  return otherwise;
}

struct CoordinatorOptions {
  std::size_t num_sites = 1;       // S
  std::size_t ranks_per_site = 1;  // R; ranks are 0..R-1 in every site
  // Expected site names. When empty, the first S distinct names to register are accepted.
  std::vector<std::string> site_names;
  // Sites of unequal rank counts: site_names[s] has site_ranks[s] ranks (ranks_per_site is
  // then their largest). Empty: every site has ranks_per_site.
  std::vector<std::size_t> site_ranks;
  // The ranks of `site`.
  std::size_t ranks_of(const std::string& site) const;
  std::optional<JobToken> token;  // required: no unauthenticated peer joins
  std::uint64_t config_hash = 0;
  // The keys config_hash digests: a rank whose hash differs is told which of them differ.
  std::vector<ConfigValue> config;
  std::uint16_t protocol_version = kProtocolVersion;
  std::string bind_address = "127.0.0.1";
  // A connection must finish Challenge -> AuthResponse -> Hello within this.
  std::chrono::milliseconds handshake_timeout{5000};
  // A registered rank with no frame for this long is listed by missing().
  std::chrono::milliseconds heartbeat_timeout{3000};
  std::size_t max_frame_payload = kDefaultMaxPayloadBytes;
  // After the membership, a lost rank (disconnected, or silent past heartbeat_timeout) takes
  // its whole site out: the coordinator broadcasts Recovery, collects every survivor's
  // Recover, and opens the next epoch without that site. False: it only reports the loss (and
  // the ranks stop with an error naming it).
  bool elastic = true;
  // A survivor that has not sent Recover this long after the recovery began is dropped too.
  std::chrono::milliseconds recovery_timeout{10000};
  // Fewer live sites than this end the job instead of a new epoch.
  std::size_t min_sites = 1;
  // A failure that lost no site drops the straggler (find_straggler, membership.hpp) when its
  // evidence (TCP backlog or send wait) is this many times any other site's; 0 = never drop a
  // live site.
  double straggler_ratio = 4.0;
  // Hierarchical DES-LOC (job.regions), for the status endpoint's per-link bytes.
  std::vector<std::vector<std::string>> regions;
  // With tls.enabled a connection must also finish the TLS handshake within
  // handshake_timeout; a plaintext peer is told so in a plaintext Reject.
  TlsOptions tls;
};

struct RankProgress {
  RankId id;
  std::uint64_t step = 0;               // the last step the rank reported in a heartbeat
  bool connected = false;               // its control connection is open
  std::chrono::milliseconds silent{0};  // since its last frame
  RankReport report;                    // from its latest heartbeat
  bool finished = false;                // said Bye after its last step
};

// Accepts ranks until S x R have registered, then broadcasts Membership epoch 1. Runs its
// io_context on its own thread between start() and stop(); the query functions are safe to
// call from any thread.
class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions options);  // ConfigError on a bad world or no token
  ~Coordinator();                                    // stop(), logging instead of throwing
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Binds and starts serving; port 0 picks an ephemeral port. Returns the bound port.
  std::uint16_t start(std::uint16_t port = 0);
  // Closes every connection and joins the thread; rethrows an error the thread captured.
  void stop();

  std::uint16_t port() const;
  std::size_t registered() const;
  // The broadcast membership, once the world is complete.
  std::optional<Membership> membership() const;
  // Every registered rank's last reported step and liveness, sorted by (site, rank).
  std::vector<RankProgress> progress() const;
  // The epochs so far, each site's loss curve and each link's bytes (a copy).
  JobHistory history() const;
  // Registered ranks silent for longer than heartbeat_timeout, sorted.
  std::vector<RankId> missing() const;
  // Expected ranks that have not registered yet, as "site/rank" or a summary of unseen sites.
  std::vector<std::string> unregistered() const;
  // Sites dropped from the job so far, with the epoch that dropped them and why.
  std::vector<std::string> departed() const;
  // All of the above but unregistered(), read under one lock: a consistent view (the status
  // endpoint's), where separate queries could straddle an epoch change.
  struct Snapshot {
    std::size_t registered = 0;
    std::optional<Membership> membership;
    std::vector<RankProgress> progress;
    JobHistory history;
    std::vector<RankId> missing;
    std::vector<std::string> departed;
  };
  Snapshot snapshot() const;
  // Rethrows (once) an exception that escaped a handler on the coordinator's thread.
  void rethrow_if_failed();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

struct RankClientOptions {
  std::string site;
  std::uint32_t rank = 0;
  std::vector<std::uint8_t> worker_address;  // this rank's ucp worker address
  std::uint64_t config_hash = 0;
  std::vector<ConfigValue> config;  // the keys config_hash digests (CoordinatorOptions::config)
  std::uint16_t protocol_version = kProtocolVersion;
  std::optional<JobToken> token;  // without one the coordinator will refuse us, by design
  std::chrono::milliseconds heartbeat_interval{500};
  // After the membership, a lost coordinator is not fatal: training goes on (collectives do
  // not need it) and the client reconnects for up to this long, telling a restarted
  // coordinator its epoch so it can rebuild the membership. 0 = fail at once.
  std::chrono::milliseconds coordinator_timeout{0};
  std::size_t max_frame_payload = kDefaultMaxPayloadBytes;
  TlsOptions tls;  // must match the coordinator's: enabled on both sides or on neither
};

// One rank's connection to the coordinator. Owns an io_context thread (started by connect)
// that reads frames and sends heartbeats; errors on that thread are stored and rethrown by
// the next call on the owner's thread.
class RankClient {
 public:
  explicit RankClient(RankClientOptions options);
  ~RankClient();  // close()
  RankClient(const RankClient&) = delete;
  RankClient& operator=(const RankClient&) = delete;

  // Connects (with TLS: handshakes and verifies the coordinator), answers the challenge and
  // registers. Returns once the coordinator welcomed us. Throws ConfigError (auth, duplicate,
  // version, config hash, world size, TLS verification or a TLS mismatch) or
  // PeerFailure with the coordinator's reject reason, TransportError if the coordinator is
  // unreachable, TimeoutError at the deadline.
  void connect(const std::string& host, std::uint16_t port, Clock::time_point deadline);
  // Blocks until the membership arrives. TimeoutError at the deadline names the coordinator
  // and the ranks it last reported as missing.
  Membership wait_membership(Clock::time_point deadline);

  // Progress reported in heartbeats.
  void set_step(std::uint64_t step);
  // What the next heartbeats report besides the step (the status endpoint's per-rank figures).
  void set_report(const RankReport& report);
  // After the membership: the ranks the coordinator reports as disconnected or silent, e.g.
  // "east/0 (disconnected)"; empty while everyone is alive.
  std::vector<std::string> lost_peers() const;
  // True from the coordinator's Recovery until the next membership arrives: the current epoch
  // is over and every collective should stop waiting (CollectiveOptions::should_abort).
  bool recovery_pending() const;
  // Reports this rank's broken epoch, its rollback snapshots and fresh UCX addresses, and
  // waits for the next membership (epoch > report.epoch). The caller checks that it is still
  // a member. TimeoutError at the deadline; PeerFailure if the coordinator went away.
  Membership recover(const Recover& report, Clock::time_point deadline);
  // Fault injection for tests: a paused client keeps its connection but goes silent, like a
  // frozen process.
  void pause_heartbeats(bool paused);
  // After the last step: tells the coordinator this rank finished (so its disconnect is no
  // failure), flushes, and closes.
  void finish();
  // Drops the connection and joins the thread. Idempotent.
  void close();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace desloc::transport
