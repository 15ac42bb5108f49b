// The coordinator's membership decisions (transport/include/desloc/transport/membership.hpp),
// driven by events alone: every fault the fault suite injects into a real job, here as a table
// row that runs in microseconds. Time is event data, so silence and timeouts are exact.
#include "desloc/transport/membership.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace desloc::transport {
namespace {

using namespace std::chrono_literals;
using Steps = std::vector<std::int64_t>;

// A job's ranks as the coordinator's I/O would report them: each Hello opens a new connection,
// and the clock only moves when the script says so.
class Job {
 public:
  explicit Job(MembershipRules rules) : roster(std::move(rules)) {}

  // S sites x R ranks, all registered: epoch 1.
  static Job formed(const std::vector<std::string>& sites, std::size_t R,
                    std::function<void(MembershipRules&)> tweak = {}, bool one_host = false) {
    MembershipRules rules;
    rules.num_sites = sites.size();
    rules.ranks_per_site = R;
    rules.site_names = sites;
    rules.heartbeat_timeout = 3000ms;
    rules.recovery_timeout = 10000ms;
    if (tweak) tweak(rules);
    Job job(rules);
    job.shared_address = one_host;
    for (const auto& s : sites)
      for (std::uint32_t r = 0; r < job.roster.rules().ranks_of(s); ++r) job.hello(s, r);
    return job;
  }

  MembershipDecision hello(const std::string& site, std::uint32_t rank, std::uint64_t epoch = 0) {
    const RankId id{site, rank};
    const std::uint64_t c = ++connections;
    auto d = roster.on(HelloEvent{
        id, {std::uint8_t(rank), 1}, epoch, "connection " + id.str(), c, now, address_of(site)});
    if (!d.reject) connection[id] = c;
    return d;
  }
  MembershipDecision close(const std::string& site, std::uint32_t rank,
                           const std::string& reason = "peer closed the connection") {
    const RankId id{site, rank};
    return roster.on(ClosedEvent{id, connection[id], "rank " + id.str(), reason, now});
  }
  // A Recover for the current epoch (or `epoch`), with fresh addresses.
  MembershipDecision report(const std::string& site, std::uint32_t rank, Steps snapshots,
                            std::optional<std::uint64_t> epoch = std::nullopt) {
    const RankId id{site, rank};
    Recover rep;
    rep.epoch = epoch.value_or(roster.state().membership ? roster.state().membership->epoch : 0);
    rep.snapshots = std::move(snapshots);
    rep.worker_address = {std::uint8_t(rank), 2};
    rep.reason = "collective broke";
    if (const auto it = evidence.find(id); it != evidence.end())
      std::tie(rep.operation_ms, rep.send_wait_ms, rep.backlog_ms) = it->second;
    if (const auto it = backlog_to.find(id); it != backlog_to.end())
      rep.backlog_peer = address_of(it->second);
    return roster.on(RecoverEvent{id, connection[id], rep, now});
  }
  MembershipDecision heartbeat(const std::string& site, std::uint32_t rank, std::uint64_t step,
                               std::optional<std::uint64_t> epoch = std::nullopt) {
    const RankId id{site, rank};
    const auto e = epoch.value_or(roster.state().membership ? roster.state().membership->epoch : 0);
    RankReport report;
    if (const auto it = backlog_ms.find(id); it != backlog_ms.end())
      report.tcp_backlog_ms = it->second;
    if (const auto it = backlog_to.find(id); it != backlog_to.end())
      report.tcp_backlog_peer = address_of(it->second);
    return roster.on(HeartbeatEvent{id, connection[id], e, step, now, report});
  }
  MembershipDecision bye(const std::string& site, std::uint32_t rank, std::uint64_t step) {
    const RankId id{site, rank};
    return roster.on(ByeEvent{id, connection[id], step, now});
  }
  MembershipDecision tick() { return roster.on(TickEvent{now}); }
  void advance(std::chrono::milliseconds d) { now += d; }
  // `d` passes in seconds: the ranks of `sites` heartbeat, and the coordinator checks. Returns
  // what the coordinator logged meanwhile.
  std::string live(std::chrono::milliseconds d, const std::vector<std::string>& sites) {
    std::string log;
    for (auto left = d; left > 0ms; left -= 1000ms) {
      advance(std::min<std::chrono::milliseconds>(left, 1000ms));
      for (const auto& s : sites)
        for (std::uint32_t r = 0; r < roster.rules().ranks_of(s); ++r) heartbeat(s, r, 1);
      for (const auto& l : tick().log) log += l.text + "\n";
    }
    return log;
  }
  // Every survivor of `sites` (all its ranks) reports `snapshots`.
  void all_report(const std::vector<std::string>& sites, const Steps& snapshots) {
    for (const auto& s : sites)
      for (std::uint32_t r = 0; r < roster.rules().ranks_of(s); ++r) report(s, r, snapshots);
  }

  const Membership& membership() const { return *roster.state().membership; }

  // What a rank's Recover says of the operation that broke.
  void saw(const std::string& site, std::uint32_t rank, std::uint32_t operation_ms,
           std::uint32_t send_wait_ms, std::uint32_t backlog_ms = 0) {
    evidence[{site, rank}] = {operation_ms, send_wait_ms, backlog_ms};
  }
  // Each site's ranks register from one address of their own (10.0.0.x, in order of first
  // Hello), unless `shared_address`: then every rank from 127.0.0.1, as on one host.
  IpAddress address_of(const std::string& site) {
    if (shared_address) return parse_ip_address("127.0.0.1");
    const auto [it, fresh] = addresses.emplace(site, kNoAddress);
    if (fresh) it->second = parse_ip_address("10.0.0." + std::to_string(addresses.size()));
    return it->second;
  }

  Roster roster;
  Clock::time_point now{};
  std::uint64_t connections = 0;
  std::map<RankId, std::uint64_t> connection;
  std::map<RankId, std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>> evidence;
  std::map<RankId, std::uint32_t> backlog_ms;  // what each rank's heartbeats report
  std::map<RankId, std::string> backlog_to;    // the site its slowest socket leads to
  bool shared_address = false;
  std::map<std::string, IpAddress> addresses;
};

// The messages of one type that a decision sends, with their recipients.
template <class M>
std::vector<std::pair<std::vector<RankId>, M>> sent(const MembershipDecision& d) {
  std::vector<std::pair<std::vector<RankId>, M>> out;
  for (const auto& o : d.sends)
    if (const M* m = std::get_if<M>(&o.message)) out.emplace_back(o.to, *m);
  return out;
}

std::vector<std::string> departed_sites(const Roster& roster) {
  std::vector<std::string> out;
  for (const auto& [site, why] : roster.state().departed) out.push_back(site);
  return out;
}

std::string logged(const MembershipDecision& d) {
  std::string out;
  for (const auto& l : d.log) out += l.text + "\n";
  return out;
}

const std::vector<std::string> kSites{"west", "east", "north"};

// ------------------------------------------------------------------------ the recovery table

// From epoch 1 over [west, east, north] with R ranks each, `script` injects a fault and the
// survivors' reports; the row states the epoch that follows.
struct RecoveryRow {
  std::string name;
  std::size_t R = 1;
  std::size_t min_sites = 1;
  std::function<void(Job&)> script;
  std::uint64_t epoch = 2;
  std::vector<std::string> sites;  // empty: the job ends
  std::int64_t resume_step = 0;
  std::vector<std::string> joining;
  std::string note;                   // a part of the epoch's note
  std::vector<std::string> departed;  // sorted
  // Sites of unequal rank counts (west, east, north); empty: R ranks each.
  std::vector<std::size_t> site_ranks = {};
};

void PrintTo(const RecoveryRow& row, std::ostream* os) { *os << row.name; }

class RecoveryTable : public ::testing::TestWithParam<RecoveryRow> {};

TEST_P(RecoveryTable, OpensTheExpectedEpoch) {
  const RecoveryRow& row = GetParam();
  Job job = Job::formed(kSites, row.R, [&](MembershipRules& r) {
    r.min_sites = row.min_sites;
    r.site_ranks = row.site_ranks;
  });
  ASSERT_EQ(job.membership().epoch, 1u);
  row.script(job);
  const Membership& m = job.membership();
  EXPECT_EQ(m.epoch, row.epoch) << m.note;
  EXPECT_EQ(m.sites, row.sites) << m.note;
  if (!row.sites.empty()) {
    EXPECT_EQ(m.resume_step, row.resume_step) << m.note;
    std::size_t members = 0;
    for (const auto& site : row.sites) members += job.roster.rules().ranks_of(site);
    EXPECT_EQ(m.members.size(), members);
    for (const auto& e : m.members)
      EXPECT_NE(std::find(m.sites.begin(), m.sites.end(), e.site), m.sites.end());
  } else {
    EXPECT_TRUE(m.members.empty());
  }
  EXPECT_EQ(m.joining, row.joining);
  EXPECT_NE(m.note.find(row.note), std::string::npos) << m.note;
  EXPECT_EQ(departed_sites(job.roster), row.departed);
  EXPECT_FALSE(job.roster.state().recovering);
}

const RecoveryRow kRecoveryRows[] = {
    {"LossOfOneRankTakesItsWholeSite",
     2,
     1,
     [](Job& j) {
       j.close("east", 1);
       j.all_report({"west", "north"}, {3, 7});
     },
     2,
     {"west", "north"},
     7,
     {},
     "east/1 disconnected (peer closed the connection); dropped "
     "site(s) [east]",
     {"east"}},
    {"LossOfASite",
     1,
     1,
     [](Job& j) {
       j.close("east", 0);
       j.all_report({"west", "north"}, {11, 15});
     },
     2,
     {"west", "north"},
     15,
     {},
     "dropped site(s) [east]",
     {"east"}},
    {"SilencePastTheHeartbeatTimeout",
     1,
     1,
     [](Job& j) {
       j.advance(2000ms);
       j.heartbeat("west", 0, 40);
       j.heartbeat("north", 0, 40);
       j.advance(1001ms);  // east: last heard at 0, now 3001 ms ago
       j.tick();
       j.all_report({"west", "north"}, {39});
     },
     2,
     {"west", "north"},
     39,
     {},
     "east/0 silent for more than 3000 ms",
     {"east"}},
    {"ASurvivorWithoutRecoverBeforeTheTimeoutIsDroppedToo",
     1,
     1,
     [](Job& j) {
       j.close("east", 0);
       j.report("west", 0, {20});
       j.live(10000ms, {"west", "north"});  // north is alive but never reports
       ASSERT_TRUE(j.roster.state().recovering) << "exactly at the timeout: still waiting";
       j.advance(1ms);
       j.tick();
     },
     2,
     {"west"},
     20,
     {},
     "dropped site(s) [east, north]",
     {"east", "north"}},
    {"BelowMinSitesTheJobEnds",
     1,
     3,
     [](Job& j) {
       j.close("east", 0);
       j.all_report({"west", "north"}, {8});
     },
     2,
     {},
     0,
     {},
     "only 2 site(s) remain, below the job's minimum of 3: the job ends",
     {"east"}},
    {"TheResumeStepIsTheNewestAllSurvivorsHold",
     1,
     1,
     [](Job& j) {
       j.close("north", 0);
       j.report("west", 0, {23, 27});
       j.report("east", 0, {27, 31});
     },
     2,
     {"west", "east"},
     27,
     {},
     "dropped site(s) [north]",
     {"north"}},
    {"SurvivorsThatShareNoSnapshotEndTheJob",
     1,
     1,
     [](Job& j) {
       j.close("east", 0);
       j.report("west", 0, {3});
       j.report("north", 0, {7});
     },
     2,
     {},
     0,
     {},
     "the survivors share no rollback step (north/0 [7], west/0 [3]): the job ends",
     {"east"}},
    {"SurvivorsThatHaveNotSteppedShareStepZero",
     2,
     1,
     [](Job& j) {
       j.close("east", 0);  // right after epoch 1: nobody took a step
       j.all_report({"west", "north"}, {0});
     },
     2,
     {"west", "north"},
     0,
     {},
     "dropped site(s) [east]",
     {"east"}},
    {"ASurvivorWithoutStateJoinsFromAPeer",
     1,
     1,
     [](Job& j) {
       j.close("east", 0);
       j.report("west", 0, {12});
       j.report("north", 0, {});
     },
     2,
     {"west", "north"},
     12,
     {"north"},
     "joining [north]",
     {"east"}},
    {"NoSurvivorHoldingStateEndsTheJob",
     1,
     1,
     [](Job& j) {
       j.close("east", 0);
       j.all_report({"west", "north"}, {});
     },
     2,
     {},
     0,
     {},
     "joining [north, west]; no surviving site holds its state: the job ends",
     {"east"}},
    {"ABrokenCollectiveReportedByARankKeepsEverySite",
     2,
     1,
     [](Job& j) {
       j.report("north", 1, {44});  // a rank saw its collective fail; nobody is lost
       j.all_report({"west", "east"}, {44});
       j.report("north", 0, {44});
     },
     2,
     {"west", "east", "north"},
     44,
     {},
     "north/1 reported: collective broke",
     {}},
    {"AStaleRecoverIsIgnored",
     1,
     1,
     [](Job& j) {
       j.close("east", 0);
       j.all_report({"west", "north"}, {5});
       j.report("west", 0, {5}, 1);  // late, for the closed epoch 1
     },
     2,
     {"west", "north"},
     5,
     {},
     "dropped site(s) [east]",
     {"east"}},
    // The straggler rule: a deadline missed with every site alive (north's egress throttled:
    // its sends wait, the others' drain while they wait for its data).
    {"AStragglerIsDroppedWhenItsSendsAloneWaited",
     1,
     1,
     [](Job& j) {
       j.saw("west", 0, 5000, 40);
       j.saw("east", 0, 5000, 100);
       j.saw("north", 0, 4950, 4900);
       j.all_report(kSites, {60});
     },
     2,
     {"west", "east"},
     60,
     {},
     "site north's sends to its ring successor waited 4.90 s, the other sites' evidence at most "
     "0.10 s (the straggler); dropped site(s) [north]",
     {"north"}},
    {"AStragglerSiteIsItsSlowestRanks",
     2,
     1,
     [](Job& j) {
       for (const auto& s : kSites) j.saw(s, 0, 5000, 50);
       j.saw("east", 1, 5000, 300);
       j.saw("west", 1, 5000, 2400);  // one rank's lane
       j.all_report(kSites, {60});
     },
     2,
     {"east", "north"},
     60,
     {},
     "site west's sends to its ring successor waited 2.40 s, the other sites' evidence at most "
     "0.30 s",
     {"west"}},
    {"AStragglersTcpBacklogIsEvidenceEvenPastTheOthersTimeInTheOperation",
     1,
     1,
     [](Job& j) {
       // C's eager sends completed into its kernel; its shaped link needs 31 s to deliver them.
       j.saw("west", 0, 5000, 3, 0);
       j.saw("east", 0, 5000, 2, 20);
       j.saw("north", 0, 5000, 5, 31000);
       j.all_report(kSites, {60});
     },
     2,
     {"west", "east"},
     60,
     {},
     "site north's unacknowledged TCP data needs 31.00 s to reach its peers at the rate its link "
     "last delivered, the other sites' evidence at most 0.02 s (the straggler)",
     {"north"}},
    // A throttled ingress: the backlogs of north's peers lead to north, whose own is empty.
    {"AStragglerIsTheSiteEverySlowBacklogLeadsTo",
     1,
     1,
     [](Job& j) {
       j.saw("west", 0, 5000, 2, 11000);
       j.saw("east", 0, 5000, 3, 10500);
       j.saw("north", 0, 5000, 0, 10);
       j.backlog_to[{"west", 0}] = "north";
       j.backlog_to[{"east", 0}] = "north";
       j.backlog_to[{"north", 0}] = "west";
       j.all_report(kSites, {60});
     },
     2,
     {"west", "east"},
     60,
     {},
     "the TCP data other sites sent to site north needs 11.00 s to reach it at the rate its link "
     "last delivered, the other links' evidence at most 0.00 s (the straggler)",
     {"north"}},
    {"WithoutKnowingWhereBacklogsLeadTwoSlowSendersDropNobody",
     1,
     1,
     [](Job& j) {
       j.saw("west", 0, 5000, 2, 11000);
       j.saw("east", 0, 5000, 3, 10500);
       j.saw("north", 0, 5000, 0, 10);
       j.all_report(kSites, {60});
     },
     2,
     {"west", "east", "north"},
     60,
     {},
     "collective broke",
     {}},
    // A throttled egress seen from one socket: both ends of the link stand out; the sender goes.
    {"BothEndsOfOneSlowLinkStandOutAndTheSenderIsDropped",
     1,
     1,
     [](Job& j) {
       j.saw("west", 0, 5000, 0, 20);
       j.saw("east", 0, 5000, 0, 10);
       j.saw("north", 0, 5000, 0, 9000);
       j.backlog_to[{"west", 0}] = "east";
       j.backlog_to[{"east", 0}] = "north";
       j.backlog_to[{"north", 0}] = "west";
       j.all_report(kSites, {60});
     },
     2,
     {"west", "east"},
     60,
     {},
     "site north's unacknowledged TCP data needs 9.00 s to reach its peers at the rate its link "
     "last delivered, the other sites' evidence at most 0.02 s (the straggler)",
     {"north"}},
    {"WaitsThatDoNotStandOutDropNobody",
     1,
     1,
     [](Job& j) {
       j.saw("west", 0, 5000, 40);
       j.saw("east", 0, 5000, 1300);  // 3.8x shorter than north's: not 4x
       j.saw("north", 0, 5000, 4900);
       j.all_report(kSites, {60});
     },
     2,
     {"west", "east", "north"},
     60,
     {},
     "west/0 reported: collective broke",
     {}},
    {"ASiteThatEnteredLateIsNoEvidenceAgainstItsPredecessor",
     1,
     1,
     [](Job& j) {
       // north computed slowly and left east's sends unread: east's waited, but north was in
       // the operation for 0.3 s only.
       j.saw("west", 0, 5000, 40);
       j.saw("east", 0, 5000, 4900, 3);  // north's kernel acknowledged what it buffered
       j.saw("north", 0, 300, 0);
       j.all_report(kSites, {60});
     },
     2,
     {"west", "east", "north"},
     60,
     {},
     "collective broke",
     {}},
    {"AWaitUnderASecondIsNoStraggler",
     1,
     1,
     [](Job& j) {
       j.saw("west", 0, 900, 0);
       j.saw("east", 0, 900, 0);
       j.saw("north", 0, 900, 850);
       j.all_report(kSites, {60});
     },
     2,
     {"west", "east", "north"},
     60,
     {},
     "collective broke",
     {}},
    {"AStragglerIsKeptWhenDroppingItWouldEndTheJob",
     1,
     3,
     [](Job& j) {
       j.saw("west", 0, 5000, 0);
       j.saw("east", 0, 5000, 0);
       j.saw("north", 0, 5000, 4900);
       j.all_report(kSites, {60});
     },
     2,
     {"west", "east", "north"},
     60,
     {},
     "collective broke",
     {}},
    {"ALostSiteIsDroppedAloneWhateverTheWaits",
     1,
     1,
     [](Job& j) {
       j.close("east", 0);
       j.saw("west", 0, 5000, 0);
       j.saw("north", 0, 5000, 4900);
       j.all_report({"west", "north"}, {60});
     },
     2,
     {"west", "north"},
     60,
     {},
     "dropped site(s) [east]",
     {"east"}},
    {"TwoSitesLostInOneRecovery",
     1,
     1,
     [](Job& j) {
       j.close("east", 0);
       j.close("north", 0);
       j.report("west", 0, {9});
     },
     2,
     {"west"},
     9,
     {},
     "dropped site(s) [east, north]",
     {"east", "north"}},
    // Sites of unequal rank counts: west 1, east 3, north 2 ([[job.site]] tables).
    {"UnequalSitesLossOfTheSiteWithMostRanks",
     3,
     1,
     [](Job& j) {
       j.close("east", 2);
       j.all_report({"west", "north"}, {6, 9});
     },
     2,
     {"west", "north"},
     9,
     {},
     "east/2 disconnected (peer closed the connection); dropped site(s) [east]",
     {"east"},
     {1, 3, 2}},
    {"UnequalSitesLossOfTheSingleRankSite",
     3,
     1,
     [](Job& j) {
       j.close("west", 0);
       j.all_report({"east", "north"}, {4});
     },
     2,
     {"east", "north"},
     4,
     {},
     "dropped site(s) [west]",
     {"west"},
     {1, 3, 2}},
    {"UnequalSitesTheSiteWithMostRanksRejoinsOnceAllItsRanksAreBack",
     3,
     1,
     [](Job& j) {
       for (std::uint32_t r = 0; r < 3; ++r) j.close("east", r);
       j.all_report({"west", "north"}, {12});
       j.hello("east", 0);
       j.hello("east", 2);
       ASSERT_FALSE(j.roster.state().recovering) << "two of east's three ranks are back";
       j.hello("east", 1);
       ASSERT_TRUE(j.roster.state().recovering);
       j.all_report({"west", "north"}, {12, 14});
     },
     3,
     {"west", "east", "north"},
     14,
     {"east"},
     "site east rejoins",
     {},
     {1, 3, 2}},
    {"UnequalSitesTheSingleRankSiteRejoins",
     3,
     1,
     [](Job& j) {
       j.close("west", 0);
       j.all_report({"east", "north"}, {5});
       j.hello("west", 0);
       j.all_report({"east", "north"}, {5});
     },
     3,
     {"west", "east", "north"},
     5,
     {"west"},
     "site west rejoins",
     {},
     {1, 3, 2}},
};

INSTANTIATE_TEST_SUITE_P(Membership, RecoveryTable, ::testing::ValuesIn(kRecoveryRows),
                         [](const auto& info) { return info.param.name; });

// ------------------------------------------------------------------------ admission

struct AdmissionRow {
  std::string name;
  std::function<MembershipDecision(Job&)> hello;  // on a job of 2 sites x 2 ranks
  std::optional<RejectCode> code;                 // nullopt: admitted
  std::string reason;
};

void PrintTo(const AdmissionRow& row, std::ostream* os) { *os << row.name; }

class AdmissionTable : public ::testing::TestWithParam<AdmissionRow> {};

TEST_P(AdmissionTable, AdmitsOrRefusesWithTheReason) {
  const AdmissionRow& row = GetParam();
  MembershipRules rules;
  rules.num_sites = 2;
  rules.ranks_per_site = 2;
  rules.site_names = {"west", "east"};
  Job job(rules);
  job.hello("west", 0);
  const MembershipDecision d = row.hello(job);
  ASSERT_EQ(d.reject.has_value(), row.code.has_value()) << logged(d);
  if (d.reject) {
    EXPECT_EQ(d.reject->code, *row.code);
    EXPECT_NE(d.reject->reason.find(row.reason), std::string::npos) << d.reject->reason;
    EXPECT_TRUE(d.sends.empty());
  }
}

const AdmissionRow kAdmissionRows[] = {
    {"ANewRankIsWelcomed", [](Job& j) { return j.hello("east", 1); }, std::nullopt, ""},
    {"ADuplicateIsRefused", [](Job& j) { return j.hello("west", 0); }, RejectCode::kDuplicate,
     "west/0 is already registered from connection west/0"},
    {"AnUnknownSiteIsRefused", [](Job& j) { return j.hello("south", 0); }, RejectCode::kWorldSize,
     "site 'south' is not one of the job's sites (west, east)"},
    {"ARankOnceTheJobRunsIsRefused",
     [](Job& j) {
       j.hello("west", 1);
       j.hello("east", 0);
       j.hello("east", 1);
       return j.hello("east", 1);
     },
     RejectCode::kDuplicate, "east/1 is already registered"},
    {"AReconnectAtAnEpochThatIsNotLiveIsRefused",
     [](Job& j) {
       j.hello("west", 1);
       j.hello("east", 0);
       j.hello("east", 1);
       return j.hello("east", 0, 3);  // east/0 is connected: no broken link to replace
     },
     RejectCode::kWorldSize, "east/0 reconnects at epoch 3, but it is not a live member"},
};

INSTANTIATE_TEST_SUITE_P(Membership, AdmissionTable, ::testing::ValuesIn(kAdmissionRows),
                         [](const auto& info) { return info.param.name; });

// ------------------------------------------------------------------------ single cases

TEST(Membership, TheLastRankToRegisterGetsItsWelcomeThenEveryoneGetsEpochOne) {
  MembershipRules rules;
  rules.num_sites = 2;
  rules.site_names = {"west", "east"};
  Job job(rules);
  const auto first = job.hello("west", 0);
  ASSERT_EQ(first.sends.size(), 2u);  // Welcome, then who is still missing
  EXPECT_TRUE(std::holds_alternative<Welcome>(first.sends[0].message));
  const auto status = sent<Status>(first);
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(status[0].second.missing, (std::vector<std::string>{"east/0"}));
  const auto last = job.hello("east", 0);
  ASSERT_EQ(last.sends.size(), 2u);
  EXPECT_TRUE(std::holds_alternative<Welcome>(last.sends[0].message));
  const auto epoch1 = sent<Membership>(last);
  ASSERT_EQ(epoch1.size(), 1u);
  EXPECT_EQ(epoch1[0].first, (std::vector<RankId>{{"east", 0}, {"west", 0}}));
  EXPECT_EQ(epoch1[0].second.epoch, 1u);
  EXPECT_EQ(epoch1[0].second.sites, (std::vector<std::string>{"west", "east"}));
  EXPECT_EQ(epoch1[0].second.ring_order, (std::vector<std::uint32_t>{0, 1}));
}

TEST(Membership, ALossTellsTheOthersWhoIsLostAndClosesTheEpoch) {
  Job job = Job::formed(kSites, 1);
  const auto d = job.close("east", 0);
  const auto lost = sent<Status>(d);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].second.missing, (std::vector<std::string>{"east/0 (disconnected)"}));
  EXPECT_EQ(lost[0].first, (std::vector<RankId>{{"north", 0}, {"west", 0}}));
  const auto recovery = sent<Recovery>(d);
  ASSERT_EQ(recovery.size(), 1u);
  EXPECT_EQ(recovery[0].second.epoch, 1u);
  EXPECT_EQ(recovery[0].first, (std::vector<RankId>{{"north", 0}, {"west", 0}}));
  EXPECT_TRUE(job.roster.state().recovering);
  // The dropped site's ranks that are still connected hear the next epoch too: they leave.
  job.close("north", 0, "");  // a clean close is still a loss
  EXPECT_TRUE(job.roster.state().recovering);
  const auto next = job.report("west", 0, {6});
  const auto epoch2 = sent<Membership>(next);
  ASSERT_EQ(epoch2.size(), 1u);
  EXPECT_EQ(epoch2[0].first, (std::vector<RankId>{{"west", 0}}));
  EXPECT_EQ(epoch2[0].second.sites, (std::vector<std::string>{"west"}));
  EXPECT_EQ(epoch2[0].second.members[0].worker_address, (std::vector<std::uint8_t>{0, 2}))
      << "the member's address is the fresh one from its Recover";
}

// The coordinator's own ticks stop for 8 s (it was stopped with the whole job): nobody's
// silence counts over that gap. A rank silent before the pause keeps what it had, and a rank
// that stays silent after it is still found, one heartbeat timeout later.
TEST(Membership, APauseOfTheCoordinatorItselfIsNoRanksSilence) {
  Job job = Job::formed(kSites, 1);
  job.live(2000ms, kSites);
  job.live(2000ms, {"west", "north"});  // east: last heard 2 s ago
  job.advance(8000ms);                  // the whole job stopped; no tick, no heartbeat
  const auto d = job.tick();
  EXPECT_NE(logged(d).find("this coordinator did not run for 8.0 s"), std::string::npos)
      << logged(d);
  EXPECT_TRUE(sent<Recovery>(d).empty()) << logged(d);
  EXPECT_FALSE(job.roster.state().recovering);
  // The others are back at once; east stays silent and is found after the rest of its timeout:
  // its 2 s before the pause and 2 s after it.
  const std::string after = job.live(1000ms, {"west", "north"});
  EXPECT_EQ(after.find("east/0"), std::string::npos) << after;
  const std::string later = job.live(1000ms, {"west", "north"});
  EXPECT_NE(later.find("east/0 (connection east/0) silent for 4.0 s"), std::string::npos) << later;
  EXPECT_TRUE(job.roster.state().recovering);
}

// Ticks as the coordinator makes them: a rank silent past the timeout is found as before.
TEST(Membership, WithoutAPauseASilentRankIsFoundAtItsTimeout) {
  Job job = Job::formed(kSites, 1);
  job.live(1000ms, kSites);
  const std::string log = job.live(4000ms, {"west", "north"});
  EXPECT_NE(log.find("east/0 (connection east/0) silent for"), std::string::npos) << log;
  EXPECT_EQ(log.find("did not run"), std::string::npos) << log;
}

TEST(Membership, ARankThatSaidByeLeavesWithoutARecovery) {
  Job job = Job::formed(kSites, 1);
  job.bye("east", 0, 1500);
  const auto d = job.close("east", 0, "");
  EXPECT_TRUE(d.sends.empty());
  EXPECT_FALSE(job.roster.state().recovering);
  EXPECT_EQ(job.roster.progress(job.now)[0].step, 1500u);
}

TEST(Membership, ThreeFailedEpochsInARowEachOpenTheNext) {
  // The trainer gives up after one step failed in three epochs; the coordinator opens each.
  Job job = Job::formed(kSites, 2);
  for (std::uint64_t e = 1; e <= 3; ++e) {
    ASSERT_EQ(job.membership().epoch, e);
    job.report("west", 1, {100});
    EXPECT_TRUE(job.roster.state().recovering);
    job.all_report(kSites, {100});
    EXPECT_EQ(job.membership().epoch, e + 1);
    EXPECT_EQ(job.membership().sites, kSites);
    EXPECT_EQ(job.membership().resume_step, 100);
  }
  EXPECT_TRUE(job.roster.departed().empty());
}

TEST(Membership, AStaleEpochIsWarnedAboutIgnoredOrRefused) {
  Job job = Job::formed(kSites, 1);
  job.close("east", 0);
  job.all_report({"west", "north"}, {4});
  ASSERT_EQ(job.membership().epoch, 2u);
  // A heartbeat two epochs behind is worth a warning; one epoch behind is a rank catching up.
  EXPECT_EQ(logged(job.heartbeat("west", 0, 9, 1)), "");
  EXPECT_NE(logged(job.heartbeat("north", 0, 9, 7))
                .find("north/0 reports membership epoch 7 but the current one is 2"),
            std::string::npos);
  // A Recover for a closed epoch changes nothing.
  const auto late = job.report("north", 0, {4}, 1);
  EXPECT_TRUE(late.sends.empty());
  EXPECT_FALSE(job.roster.state().recovering);
  EXPECT_NE(logged(late).find("ignoring north/0's Recover for epoch 1 (current epoch 2)"),
            std::string::npos);
  // The dropped site reconnecting with its old epoch is no member.
  const auto back = job.hello("east", 0, 1);
  ASSERT_TRUE(back.reject.has_value());
  EXPECT_NE(back.reject->reason.find("east/0 reconnects at epoch 1, but it is not a live member"),
            std::string::npos);
}

TEST(Membership, ARestartedSiteRejoinsAtTheNextEpochAsJoining) {
  Job job = Job::formed(kSites, 2);
  job.close("east", 0);
  job.close("east", 1);
  job.all_report({"west", "north"}, {16});
  ASSERT_EQ(job.membership().sites, (std::vector<std::string>{"west", "north"}));
  // East restarts: its first rank waits for the second.
  const auto first = job.hello("east", 1);
  ASSERT_FALSE(first.reject);
  EXPECT_FALSE(job.roster.state().recovering);
  EXPECT_EQ(sent<Status>(first).size(), 1u);
  EXPECT_TRUE(job.hello("east", 1).reject.has_value()) << "one process per (site, rank)";
  const auto second = job.hello("east", 0);
  EXPECT_TRUE(job.roster.state().recovering);
  const auto recovery = sent<Recovery>(second);
  ASSERT_EQ(recovery.size(), 1u);
  EXPECT_EQ(recovery[0].second.reason, "site east rejoins");
  job.all_report({"west", "north"}, {16, 20});
  const Membership& m = job.membership();
  EXPECT_EQ(m.epoch, 3u);
  EXPECT_EQ(m.sites, kSites);  // back in its ring position
  EXPECT_EQ(m.joining, (std::vector<std::string>{"east"}));
  EXPECT_EQ(m.resume_step, 20);
  EXPECT_EQ(m.members.size(), 6u);
  EXPECT_TRUE(job.roster.departed().empty());
  // An old connection of east closing now is no loss of the new one.
  job.connection[{"east", 0}] = 3;  // its first life's connection (west/0, west/1, east/0)
  EXPECT_TRUE(job.close("east", 0).sends.empty());
  EXPECT_FALSE(job.roster.state().recovering);
}

TEST(Membership, ACoordinatorRestartRebuildsTheEpochFromTheRanksThatComeBack) {
  MembershipRules rules;
  rules.num_sites = 3;
  rules.ranks_per_site = 2;
  rules.site_names = kSites;
  rules.heartbeat_timeout = 3000ms;
  Job job(rules);
  job.hello("west", 0, 4);
  job.hello("west", 1, 4);
  job.hello("north", 1, 5);  // north/0 never comes back
  job.advance(1000ms);
  job.hello("east", 1, 5);
  job.hello("east", 0, 5);
  const auto fresh = job.hello("north", 0, 0);
  ASSERT_TRUE(fresh.reject.has_value());
  EXPECT_NE(fresh.reject->reason.find("rebuilding the membership of a running job (epoch 5)"),
            std::string::npos);
  job.advance(2999ms);
  job.tick();
  EXPECT_FALSE(job.roster.state().membership) << "ranks may still be arriving";
  job.advance(1ms);
  const auto d = job.tick();
  const Membership& m = job.membership();
  EXPECT_EQ(m.epoch, 5u);
  EXPECT_EQ(m.sites, (std::vector<std::string>{"west", "east"}));
  EXPECT_EQ(m.members.size(), 4u);
  EXPECT_TRUE(sent<Membership>(d).empty()) << "the ranks already train in it";
  EXPECT_EQ(departed_sites(job.roster), (std::vector<std::string>{"north"}));
  EXPECT_NE(logged(d).find("incomplete, left out: [north]"), std::string::npos);
  EXPECT_EQ(job.roster.state().ranks.count({"north", 1}), 0u);
}

TEST(Membership, WithoutElasticityALossIsReportedButNoEpochCloses) {
  Job job = Job::formed(kSites, 1, [](MembershipRules& r) { r.elastic = false; });
  const auto d = job.close("east", 0);
  EXPECT_EQ(sent<Status>(d).size(), 1u);
  EXPECT_TRUE(sent<Recovery>(d).empty());
  EXPECT_NE(logged(d).find("it will be listed missing after 3000 ms"), std::string::npos);
  // A broken link to this same coordinator is mended by a reconnect at the live epoch.
  EXPECT_FALSE(job.hello("east", 0, 1).reject.has_value());
  EXPECT_TRUE(job.roster.state().ranks.at({"east", 0}).connected());
}

TEST(Membership, WhileTheWorldFillsUpATickTellsTheWaitingRanksWhoIsMissing) {
  MembershipRules rules;
  rules.num_sites = 2;
  rules.site_names = {"west", "east"};
  Job job(rules);
  job.hello("west", 0);
  const auto d = job.tick();
  const auto status = sent<Status>(d);
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(status[0].second.missing, (std::vector<std::string>{"east/0"}));
  EXPECT_TRUE(job.tick().sends.empty()) << "only on change";
}

TEST(Membership, ARecoverBeforeTheMembershipIsAProtocolError) {
  MembershipRules rules;
  rules.num_sites = 2;
  Job job(rules);
  job.hello("west", 0);
  EXPECT_EQ(job.report("west", 0, {1}, 1).protocol_error, "Recover before the membership");
}

TEST(Membership, AStragglerRatioOfZeroNeverDropsALiveSite) {
  Job job = Job::formed(kSites, 1, [](MembershipRules& r) { r.straggler_ratio = 0.0; });
  job.saw("west", 0, 5000, 0);
  job.saw("east", 0, 5000, 0);
  job.saw("north", 0, 5000, 4900);
  job.all_report(kSites, {60});
  EXPECT_EQ(job.membership().epoch, 2u);
  EXPECT_EQ(job.membership().sites, kSites);
}

TEST(Membership, TheStragglerWarningNamesTheSiteAndTheWaits) {
  Job job = Job::formed(kSites, 1);
  job.saw("west", 0, 5000, 0);
  job.saw("east", 0, 5000, 250);
  job.saw("north", 0, 5000, 4900);
  job.report("west", 0, {60});
  job.report("east", 0, {60});
  const std::string log = logged(job.report("north", 0, {60}));
  EXPECT_NE(log.find("site north's sends to its ring successor waited 4.90 s, the other sites' "
                     "evidence at most 0.25 s: its outbound link is the straggler; dropping site "
                     "north"),
            std::string::npos)
      << log;
  EXPECT_NE(job.roster.state().departed.at("north").find("(the straggler)"), std::string::npos);
}

// A link that stretches averages without failing them: the heartbeats' TCP backlogs name it
// once it stood out for a heartbeat timeout (3 s here), nothing else happens, and the all-clear
// follows when it stops.
TEST(Membership, ASlowLinkThatFailsNothingIsNamedFromTheHeartbeats) {
  Job job = Job::formed(kSites, 2);
  EXPECT_EQ(job.live(5000ms, kSites), "");
  job.backlog_ms[{"north", 1}] = 9000;
  job.backlog_ms[{"west", 0}] = 40;
  const std::string before = job.live(2000ms, kSites);
  EXPECT_EQ(before.find("outbound link is slow"), std::string::npos) << before;
  const std::string warned = job.live(2000ms, kSites);
  EXPECT_NE(warned.find("site north's outbound link is slow: its TCP backlog has stood out for "
                        "3.0 s and needs 9.00 s to drain, the other links' at most 0.04 s"),
            std::string::npos)
      << warned;
  EXPECT_EQ(job.live(5000ms, kSites).find("outbound link is slow"), std::string::npos)
      << "named once";
  EXPECT_EQ(job.membership().epoch, 1u) << "nothing failed: no recovery";
  EXPECT_FALSE(job.roster.state().recovering);
  job.backlog_ms[{"north", 1}] = 30;
  EXPECT_NE(job.live(1000ms, kSites).find("site north's TCP backlog is back in line"),
            std::string::npos);
  job.backlog_ms[{"north", 1}] = 9000;
  job.backlog_ms[{"east", 0}] = 2500;  // 3.6x shorter than north's: nobody stands out
  EXPECT_EQ(job.live(6000ms, kSites).find("outbound link is slow"), std::string::npos);
}

// The heartbeats of a throttled ingress: west's and east's backlogs lead to north.
TEST(Membership, ASlowInboundLinkIsNamedFromThePeersBacklogs) {
  Job job = Job::formed(kSites, 1);
  job.backlog_ms[{"west", 0}] = 8000;
  job.backlog_ms[{"east", 0}] = 7000;
  job.backlog_to[{"west", 0}] = "north";
  job.backlog_to[{"east", 0}] = "north";
  const std::string warned = job.live(4000ms, kSites);
  EXPECT_NE(warned.find("site north's inbound link is slow: the TCP backlog of the data other "
                        "sites send it has stood out for 3.0 s and needs 8.00 s to drain, the "
                        "other links' at most 0.00 s"),
            std::string::npos)
      << warned;
  job.backlog_ms[{"west", 0}] = 0;
  job.backlog_ms[{"east", 0}] = 0;
  EXPECT_NE(job.live(1000ms, kSites).find("the TCP backlog toward site north is back in line"),
            std::string::npos);
  // From one host (every rank's control connection from 127.0.0.1) a socket's address names no
  // site: two slow senders, nobody stands out.
  Job local = Job::formed(kSites, 1, {}, true);
  local.backlog_ms[{"west", 0}] = 8000;
  local.backlog_ms[{"east", 0}] = 7000;
  local.backlog_to = job.backlog_to;
  EXPECT_EQ(local.live(5000ms, kSites).find("link is slow"), std::string::npos);
}

// North's ingress throttled: west's sends to it waited, east's happened to finish before the
// average broke, so only west's Recover carries a backlog toward north, and on that alone the
// rule names the sender. East's latest heartbeat still reports its backlog toward north; with
// it north is the end both other sites' links corroborate.
TEST(Membership, AHeartbeatsBacklogIsEvidenceWhereARecoverSawNone) {
  const auto recover = [](Job& job) {
    job.saw("west", 0, 8000, 0, 8000);
    job.saw("east", 0, 300, 0, 0);
    job.saw("north", 0, 8000, 0, 0);
    job.backlog_to[{"west", 0}] = "north";
    job.backlog_to[{"east", 0}] = "north";
    job.report("west", 0, {60});
    job.report("east", 0, {60});
    return job.report("north", 0, {60});
  };
  Job without = Job::formed(kSites, 1);
  const auto blamed = recover(without);
  EXPECT_EQ(departed_sites(without.roster), (std::vector<std::string>{"west"})) << logged(blamed);

  Job job = Job::formed(kSites, 1);
  job.backlog_ms[{"east", 0}] = 7000;
  job.backlog_to[{"east", 0}] = "north";
  job.heartbeat("east", 0, 60);
  const auto d = recover(job);
  EXPECT_EQ(departed_sites(job.roster), (std::vector<std::string>{"north"})) << logged(d);
  EXPECT_NE(logged(d).find("dropping site north"), std::string::npos) << logged(d);
}

// As above, but east finished its sends before the average broke, and its latest heartbeat
// shows no backlog either: what its heartbeats reported while the failed operation ran (8 s,
// the longest any report names) still corroborates north. A backlog from before that operation
// is no evidence of it.
TEST(Membership, AHeartbeatsBacklogDuringTheFailedOperationIsEvidenceAfterItDrained) {
  const auto fail_after = [](std::chrono::milliseconds east_slow_before) {
    Job job = Job::formed(kSites, 1);
    job.backlog_to[{"east", 0}] = "north";
    job.backlog_ms[{"east", 0}] = 7000;
    job.heartbeat("east", 0, 60);
    job.advance(east_slow_before);
    job.backlog_ms[{"east", 0}] = 0;
    job.heartbeat("east", 0, 60);
    job.saw("west", 0, 8000, 0, 8000);
    job.saw("east", 0, 300, 0, 0);
    job.saw("north", 0, 8000, 0, 0);
    job.backlog_to[{"west", 0}] = "north";
    job.report("west", 0, {60});
    job.report("east", 0, {60});
    const auto d = job.report("north", 0, {60});
    return std::pair(departed_sites(job.roster), logged(d));
  };
  const auto [during, why] = fail_after(5000ms);
  EXPECT_EQ(during, (std::vector<std::string>{"north"})) << why;
  EXPECT_NE(why.find("the TCP data other sites sent to site north"), std::string::npos) << why;
  const auto [before, why_before] = fail_after(30000ms);
  EXPECT_EQ(before, (std::vector<std::string>{"west"})) << why_before;
}

TEST(Membership, SiteAddressesLeaveOutAnAddressSeveralSitesShare) {
  std::map<RankId, RankRecord> ranks;
  const IpAddress a = parse_ip_address("10.0.0.1"), b = parse_ip_address("10.0.0.2"),
                  l = parse_ip_address("::1");
  ranks[{"west", 0}].address = a;
  ranks[{"west", 1}].address = a;
  ranks[{"east", 0}].address = b;
  ranks[{"north", 0}].address = l;
  ranks[{"south", 0}].address = l;
  ranks[{"far", 0}].address = kNoAddress;
  const auto at = site_addresses(ranks);
  EXPECT_EQ(at.size(), 2u);
  EXPECT_EQ(at.at(a), "west");
  EXPECT_EQ(at.at(b), "east");
  EXPECT_EQ(ip_text(a), "10.0.0.1");
  EXPECT_EQ(ip_text(l), "::1");
  EXPECT_EQ(ip_text(kNoAddress), "unknown");
  EXPECT_EQ(parse_ip_address("10.0.0"), kNoAddress);
}

// Two sites share their only link: whichever end is slow, the sender is named.
TEST(Membership, FindStragglerNamesTheSenderOfTheOnlySlowLink) {
  std::map<RankId, Recover> reports;
  reports[{"west", 0}].backlog_ms = 6000;
  reports[{"west", 0}].backlog_peer = parse_ip_address("10.0.0.2");
  reports[{"east", 0}].backlog_ms = 5;
  const std::map<IpAddress, std::string> at{{parse_ip_address("10.0.0.1"), "west"},
                                            {parse_ip_address("10.0.0.2"), "east"}};
  const auto s = find_straggler(reports, 4.0, at);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->site, "west");
  EXPECT_FALSE(s->inbound);
  EXPECT_TRUE(s->backlog);
  EXPECT_EQ(s->evidence, 6000ms);
}

// One direction at 1% starves the other direction's ACKs, so both ends of the one link that
// stands out can carry its longest backlog. A backlog of at least 1 s on another link of one
// end names that end; without one (or with noise only) the sender goes.
TEST(Membership, FindStragglerNamesTheEndOfOneSlowLinkWhoseOtherLinksAreSlowToo) {
  const IpAddress west = parse_ip_address("10.0.0.1"), east = parse_ip_address("10.0.0.2"),
                  north = parse_ip_address("10.0.0.3");
  const std::map<IpAddress, std::string> at{{west, "west"}, {east, "east"}, {north, "north"}};
  const auto report = [](std::int64_t ms, IpAddress to) {
    Recover r;
    r.operation_ms = 5000;
    r.backlog_ms = static_cast<std::uint32_t>(ms);
    r.backlog_peer = to;
    return r;
  };
  // north's ingress throttled: west's data to north stands out 8x over east's, yet east's is
  // slow too, and only north's links carry it.
  std::map<RankId, Recover> ingress;
  ingress[{"west", 0}] = report(16000, north);
  ingress[{"east", 0}] = report(2000, north);
  ingress[{"north", 0}] = report(10, west);
  auto s = find_straggler(ingress, 4.0, at);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->site, "north");
  EXPECT_TRUE(s->inbound);
  EXPECT_EQ(s->evidence, 16000ms);
  EXPECT_EQ(s->corroboration, 2000ms);
  // north's egress throttled, the longest backlog west's (its ACKs come back from north):
  // north's own data to east is slow too.
  std::map<RankId, Recover> egress;
  egress[{"west", 0}] = report(12000, north);
  egress[{"east", 0}] = report(10, west);
  egress[{"north", 0}] = report(2500, east);
  s = find_straggler(egress, 4.0, at);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->site, "north");
  // Under a second on the third link is noise: the sender, as between two sites.
  ingress[{"east", 0}] = report(900, north);
  s = find_straggler(ingress, 4.0, at);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->site, "west");
  EXPECT_FALSE(s->inbound);
  EXPECT_EQ(s->corroboration, 0ms);
  // A third-site backlog on the sender's side wins it the drop.
  ingress[{"east", 0}] = report(1500, west);
  ingress[{"north", 0}] = report(10, east);
  s = find_straggler(ingress, 4.0, at);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->site, "west");
  EXPECT_EQ(s->corroboration, 1500ms);
}

TEST(Membership, FindStragglerNeedsTwoSitesAndARatio) {
  std::map<RankId, Recover> reports;
  Recover slow;
  slow.operation_ms = 5000;
  slow.send_wait_ms = 5000;
  reports[{"west", 0}] = slow;
  EXPECT_FALSE(find_straggler(reports, 4.0)) << "one site is nobody's straggler";
  Recover quick;
  quick.operation_ms = 5000;
  quick.send_wait_ms = 1250;
  reports[{"east", 0}] = quick;
  const auto s = find_straggler(reports, 4.0);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->site, "west");
  EXPECT_EQ(s->evidence, 5000ms);
  EXPECT_FALSE(s->backlog);
  EXPECT_EQ(s->others, 1250ms);
  EXPECT_FALSE(find_straggler(reports, 4.1)) << "exactly 4x stands out at 4, not at 4.1";
  EXPECT_FALSE(find_straggler(reports, 0.0));
}

TEST(Membership, CommonRollbackStepIsTheNewestSharedOne) {
  EXPECT_EQ(common_rollback_step({}), std::nullopt);
  EXPECT_EQ(common_rollback_step({{}}), std::nullopt);
  EXPECT_EQ(common_rollback_step({{0}}), 0);
  EXPECT_EQ(common_rollback_step({{3, 7}, {7, 11}}), 7);
  EXPECT_EQ(common_rollback_step({{7, 3}, {3, 7}, {3}}), 3);
  EXPECT_EQ(common_rollback_step({{3}, {7}}), std::nullopt);
}

}  // namespace
}  // namespace desloc::transport
