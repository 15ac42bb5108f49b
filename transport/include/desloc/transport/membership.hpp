// The coordinator's membership decisions as a deterministic state machine: who is admitted, who
// is lost, when an epoch closes, who joins and where the survivors roll back to. No I/O and no
// clock: time arrives with every event, and each decision lists the frames to send.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "desloc/core/log.hpp"
#include "desloc/transport/control_plane.hpp"
#include "desloc/transport/wire.hpp"

namespace desloc::transport {

// The part of CoordinatorOptions that decides membership.
struct MembershipRules {
  std::size_t num_sites = 1;
  std::size_t ranks_per_site = 1;
  std::vector<std::string> site_names;  // the ring order; empty = the first S names to register
  std::vector<std::size_t> site_ranks;  // per site_names entry (CoordinatorOptions::site_ranks)
  bool elastic = true;                  // a lost site leaves and the others go on
  std::size_t min_sites = 1;            // fewer live sites end the job
  std::chrono::milliseconds heartbeat_timeout{3000};
  std::chrono::milliseconds recovery_timeout{10000};
  double straggler_ratio = 4.0;  // find_straggler's; 0 = never drop a live site

  static MembershipRules of(const CoordinatorOptions& options);
  std::size_t ranks_of(const std::string& site) const;
  std::size_t world() const;
};

// What the coordinator knows of one registered rank.
struct RankRecord {
  std::string peer;  // "ip:port" of its control connection, for messages
  std::vector<std::uint8_t> worker_address;
  // The control connection it registered on (the coordinator numbers them from 1); 0 while
  // none is open. Events from another connection of the same rank id are stale.
  std::uint64_t connection = 0;
  Clock::time_point last_seen{};
  // Its control connection's address: the straggler rule takes a slow socket that leads there
  // to lead to this rank's site (when no other site's rank registered from it).
  IpAddress address = kNoAddress;
  bool silent = false;     // past heartbeat_timeout: listed missing
  std::uint64_t step = 0;  // from its latest heartbeat
  RankReport report;       // from its latest heartbeat
  // Its heartbeats' TCP backlogs of at least kStragglerFloor over the last kBacklogMemory, oldest
  // first: the straggler rule reads those reported while the failed operation ran, since a
  // sender that finished its sends before the operation broke reports none at the end.
  struct Backlog {
    Clock::time_point at;
    std::uint32_t ms = 0;
    IpAddress peer = kNoAddress;
  };
  std::deque<Backlog> backlogs;
  bool finished = false;            // said Bye: its disconnect is the end of its work
  bool joining = false;             // its site left and is rejoining: not in the membership yet
  std::uint64_t rebuilt_epoch = 0;  // reconnected to a restarted coordinator at this epoch
  bool connected() const { return connection != 0; }
};

struct MembershipState {
  std::map<RankId, RankRecord> ranks;
  std::optional<Membership> membership;  // from epoch 1 on
  // A recovery: the current epoch failed and the survivors' Recover reports are collected.
  bool recovering = false;
  Clock::time_point recovery_start{};
  std::string recovery_reason;
  std::set<std::string> failing_sites;  // dropped when this recovery ends
  std::map<RankId, Recover> reports;
  std::map<std::string, std::string> departed;  // site -> "dropped at epoch N: why"
  // After a coordinator restart: the newest epoch a reconnecting rank reported, and when the
  // last one came; the membership is rebuilt once they stop coming.
  std::uint64_t rebuild_epoch = 0;
  Clock::time_point last_rebuild_registration{};
  std::size_t status_sent_for = 0;  // ranks registered at the last Status broadcast
  // The previous tick. A tick far later than the one before means the coordinator itself did
  // not run (SIGSTOP of the job, a suspended host or VM): everyone's silence includes its own.
  Clock::time_point last_tick{};
  // The site whose links' TCP backlogs stand out now (find_straggler over the heartbeats), since
  // when, and whether the coordinator warned about it yet.
  std::string slow_site;
  bool slow_inbound = false;  // its inbound link (others' backlogs toward it)
  Clock::time_point slow_since{};
  bool slow_warned = false;
};

// --- Events: what the coordinator's I/O saw. `connection` identifies the control connection.

// A rank that passed the token and the Hello's static checks asks to register. epoch > 0: it
// trains in that epoch and reconnects (after a broken link, or to a restarted coordinator).
struct HelloEvent {
  RankId id;
  std::vector<std::uint8_t> worker_address;
  std::uint64_t epoch = 0;
  std::string peer;
  std::uint64_t connection = 0;
  Clock::time_point now{};
  IpAddress address = kNoAddress;  // the control connection's peer address
};
struct HeartbeatEvent {
  RankId id;
  std::uint64_t connection = 0;
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  Clock::time_point now{};
  RankReport report;
};
struct ByeEvent {
  RankId id;
  std::uint64_t connection = 0;
  std::uint64_t step = 0;
  Clock::time_point now{};
};
struct RecoverEvent {
  RankId id;
  std::uint64_t connection = 0;
  Recover report;
  Clock::time_point now{};
};
// A registered rank's connection closed; reason "" when it closed cleanly.
struct ClosedEvent {
  RankId id;
  std::uint64_t connection = 0;
  std::string peer;  // the connection's name for messages, e.g. "rank east/0 (10.0.0.2:5123)"
  std::string reason;
  Clock::time_point now{};
};
// The coordinator's periodic check: silence, a quiet rebuild, a recovery past its timeout. The
// coordinator ticks every heartbeat_timeout / 4 at most; a gap of more than kPauseGap or half
// the heartbeat timeout (whichever is longer) since the last tick is a pause of the coordinator,
// and every timer it keeps moves on by the gap instead of expiring.
inline constexpr std::chrono::milliseconds kPauseGap{1000};
struct TickEvent {
  Clock::time_point now{};
};
using MembershipEvent =
    std::variant<HelloEvent, HeartbeatEvent, ByeEvent, RecoverEvent, ClosedEvent, TickEvent>;

// --- Decisions: what the coordinator's I/O must do, in order.

struct Outgoing {
  std::vector<RankId> to;  // each must be sent the message on its current connection
  std::variant<Welcome, Status, Recovery, Membership> message;
};
struct LogLine {
  log::Level level = log::Level::kInfo;
  std::string text;
};
struct MembershipDecision {
  std::optional<Reject> reject;  // a HelloEvent that is refused: nothing else happens
  std::vector<Outgoing> sends;
  std::vector<LogLine> log;
  // A frame that has no place in the protocol now (a Recover before any membership): the
  // connection that sent it is refused with this reason.
  std::string protocol_error;
};

// The coordinator's roster: the membership state and the rules that move it. Every decision is
// a function of the state and the event alone, so the same events give the same epochs.
class Roster {
 public:
  explicit Roster(MembershipRules rules) : rules_(std::move(rules)) {}

  MembershipDecision on(const MembershipEvent& event);

  const MembershipRules& rules() const { return rules_; }
  const MembershipState& state() const { return state_; }
  MembershipState& state() { return state_; }  // tests set up a state directly

  // Queries for the coordinator's public API.
  std::vector<RankProgress> progress(Clock::time_point now) const;
  std::vector<RankId> missing(Clock::time_point now) const;
  std::vector<std::string> unregistered() const;
  std::vector<std::string> departed() const;
  Status status() const;  // while the world fills up: who is registered and who not yet

 private:
  class Step;
  MembershipRules rules_;
  MembershipState state_;
};

// The straggler rule. After a failed operation that lost no site (every rank alive and
// reporting), it looks for the site behind a slow link. Each rank's report is evidence against
// links: its TCP backlog (as time to drain) against the link from its site to the site its
// slowest socket leads to (`site_at`; the sender alone where that is unknown), its longest
// send's wait against its own site. A site stands out when the evidence on links that touch it
// (it sends or receives there) is at least kStragglerFloor and `ratio` times the evidence on
// every link that does not. So a throttled egress (its backlogs to every peer) and a throttled
// ingress (every peer's backlog to it) both point at that site. Where both ends of one slow
// link stand out on it (two sites, or one slow direction, whose ACKs starve the other
// direction), the end whose links to third sites carry a backlog of at least kStragglerFloor
// (and longer than the other end's) is named, else the sender. A send's wait alone
// also needs every other site inside the operation at least half that long: a site that
// entered late (say one that computed slowly and left its predecessor's sends unread) is no
// evidence against the predecessor, and its kernel had acknowledged those bytes, so no backlog
// shows there. nullopt when no site stands out, fewer than 2 sites reported, or ratio <= 0.
inline constexpr std::chrono::milliseconds kStragglerFloor{1000};
// How long a rank's record keeps its heartbeats' backlogs (RankRecord::backlogs), and at most
// how many: longer than any operation the rule judges at the heartbeat intervals desloc allows.
inline constexpr std::chrono::seconds kBacklogMemory{120};
inline constexpr std::size_t kMaxBacklogSamples = 1024;
// The ratio the coordinator's slow-link warning uses where job.straggler_ratio is 0 (dropping
// off; warning still on).
inline constexpr double kSlowLinkRatio = 4.0;
struct Straggler {
  std::string site;
  std::chrono::milliseconds evidence{0};  // the longest backlog or send wait on its links
  bool backlog = false;                   // the evidence is a TCP backlog, not a send's wait
  bool inbound = false;  // the backlog is other sites' data to it, not its own to them
  std::chrono::milliseconds others{0};  // the longest on links that do not touch it
  // The longest backlog (kStragglerFloor or more, else 0) on its links to sites that do not
  // stand out: what tells the two ends of one slow link apart.
  std::chrono::milliseconds corroboration{0};
};
std::optional<Straggler> find_straggler(const std::map<RankId, Recover>& reports, double ratio,
                                        const std::map<IpAddress, std::string>& site_at = {});
// The site behind each address ranks registered from; an address ranks of several sites share
// (one host, loopback) is left out, since a socket that leads there names no site.
std::map<IpAddress, std::string> site_addresses(const std::map<RankId, RankRecord>& ranks);

// The newest step every survivor can roll back to: the intersection of their snapshot lists.
// nullopt when `offers` is empty or they share none.
std::optional<std::int64_t> common_rollback_step(
    const std::vector<std::vector<std::int64_t>>& offers);

}  // namespace desloc::transport
