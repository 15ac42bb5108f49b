// The membership state machine's private parts (membership.hpp), shared by its two halves:
// membership.cpp (admission, the ranks' frames, the queries) and membership_recovery.cpp (time:
// silence, pauses, slow links and the rebuild after a restart; and the recovery epochs).
// Not installed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "desloc/transport/membership.hpp"

namespace desloc::transport::membership_detail {

inline constexpr std::size_t kMaxListedMissing = 16;

inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

inline bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

inline std::string site_of(const std::string& rank_name) {
  return rank_name.substr(0, rank_name.rfind('/'));
}

// The ring positions 0..n-1: the ring follows the site table's order.
inline std::vector<std::uint32_t> ring_of(std::size_t n) {
  std::vector<std::uint32_t> ring(n);
  for (std::uint32_t i = 0; i < n; ++i) ring[i] = i;
  return ring;
}

}  // namespace desloc::transport::membership_detail

namespace desloc::transport {

// One event's worth of work on the roster: the old handlers' logic, writing into `out`.
class Roster::Step {
 public:
  Step(Roster& roster, Clock::time_point now)
      : rules_(roster.rules_), s_(roster.state_), roster_(roster), now_(now) {}

  MembershipDecision out;

  void hello(const HelloEvent& e);
  void heartbeat(const HeartbeatEvent& e);
  void bye(const ByeEvent& e);
  void recover(const RecoverEvent& e);
  void closed(const ClosedEvent& e);
  void tick();

 private:
  void forgive_pause();
  void say(log::Level level, std::string text) { out.log.push_back({level, std::move(text)}); }
  void send(std::vector<RankId> to, decltype(Outgoing::message) message) {
    if (!to.empty()) out.sends.push_back({std::move(to), std::move(message)});
  }
  // The record of `id` if `connection` is the one it registered on.
  RankRecord* current(const RankId& id, std::uint64_t connection) {
    const auto it = s_.ranks.find(id);
    return it == s_.ranks.end() || it->second.connection != connection ? nullptr : &it->second;
  }

  std::optional<Reject> admit(const HelloEvent& e);
  void welcome(const HelloEvent& e);
  void form_first_epoch();
  void broadcast_lost();
  void begin_recovery(const std::string& reason, const std::string& site);
  void try_finish_recovery(bool timed_out);
  bool drop_lost_and_late(bool timed_out);
  void drop_straggler();
  void watch_slow_links();
  std::set<std::string> joining_sites() const;
  Membership next_membership(const std::set<std::string>& joining);
  void close_recovery(Membership m, const std::set<std::string>& joining);
  void rebuild_if_quiet();

  const MembershipRules& rules_;
  MembershipState& s_;
  Roster& roster_;
  Clock::time_point now_;
};

}  // namespace desloc::transport
