// What the status endpoint is built from (issue 17): a rank's SyncMeter (its averages' duration
// histogram and lane rates), the heartbeat that carries them, the coordinator's JobHistory
// (epochs, bounded loss curves, bytes per link) and the views rendered from a JobStatus.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "desloc/core/error.hpp"
#include "desloc/sync/sync_meter.hpp"
#include "desloc/transport/job_history.hpp"
#include "desloc/transport/status_http.hpp"
#include "desloc/transport/wire.hpp"

namespace desloc {
namespace {

using transport::JobHistory;
using transport::Membership;
using transport::RankReport;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// A membership of `ring` (site names in ring order), over a site table of `sites`.
Membership membership(std::uint64_t epoch, const std::vector<std::string>& sites,
                      const std::vector<std::string>& ring, std::string note = "") {
  Membership m;
  m.epoch = epoch;
  m.sites = sites;
  for (const auto& s : ring)
    m.ring_order.push_back(
        static_cast<std::uint32_t>(std::find(sites.begin(), sites.end(), s) - sites.begin()));
  m.note = std::move(note);
  return m;
}

RankReport lanes(std::uint64_t lane0, std::uint64_t lane1, float loss = 3.0f) {
  RankReport r;
  r.loss = loss;
  r.lanes[0].bytes_sent = lane0;
  r.lanes[1].bytes_sent = lane1;
  return r;
}

TEST(SyncMeter, BucketsEveryDurationAndRatesTheLastSyncsOfEachLane) {
  sync::SyncMeter meter;
  const sync::SyncMeter::LaneSample a[] = {{1000, 0.5}, {3000, 0.5}};
  meter.record(0.003, a);  // (0, 0.005]
  meter.record(0.25, a);   // (0.1, 0.25]: the bound itself belongs to its bucket
  meter.record(40.0, a);   // past the last bound
  RankReport r;
  meter.fill(r);
  EXPECT_EQ(r.sync_buckets[0], 1u);
  EXPECT_EQ(r.sync_buckets[5], 1u);
  EXPECT_EQ(r.sync_buckets[transport::kSyncBuckets - 1], 1u);
  EXPECT_EQ(r.syncs(), 3u);
  EXPECT_DOUBLE_EQ(r.sync_seconds, 40.253);
  EXPECT_EQ(r.lanes[0].bytes_sent, 3000u);
  EXPECT_EQ(r.lanes[1].bytes_sent, 9000u);
  EXPECT_FLOAT_EQ(r.lanes[0].recent_bytes_per_s, 2000.0f);
  EXPECT_FLOAT_EQ(r.lanes[1].recent_bytes_per_s, 6000.0f);

  // The rate is over the last kRecentSyncs syncs only: a slow link shows within them.
  const sync::SyncMeter::LaneSample slow[] = {{1000, 10.0}};
  for (std::size_t i = 0; i < sync::SyncMeter::kRecentSyncs; ++i) meter.record(10.0, slow);
  meter.fill(r);
  EXPECT_FLOAT_EQ(r.lanes[0].recent_bytes_per_s, 100.0f);
  EXPECT_EQ(r.lanes[0].bytes_sent, 3000u + 1000u * sync::SyncMeter::kRecentSyncs);
  EXPECT_FLOAT_EQ(r.lanes[1].recent_bytes_per_s, 6000.0f);  // no new sync on lane 1
}

TEST(SyncMeter, MoreLanesThanTheRingsIsAnError) {
  sync::SyncMeter meter;
  const sync::SyncMeter::LaneSample three[3] = {};
  EXPECT_THROW(meter.record(1.0, three), Error);
}

TEST(Heartbeat, CarriesTheWholeReportAndKeepsItsSize) {
  transport::Heartbeat hb{7, 1234, {}};
  hb.report = lanes(5, 6, std::numeric_limits<float>::quiet_NaN());
  hb.report.tokens_per_s = 4096.5f;
  hb.report.wan_bytes_sent = 1u << 30;
  hb.report.sync_buckets[3] = 11;
  hb.report.sync_seconds = 1.25;
  hb.report.lanes[1].recent_bytes_per_s = 1.5e6f;
  hb.report.guard_rejections = 2;
  hb.report.kx = 268;
  hb.report.replans = 1;
  hb.report.region_lane = {9, 3.5f};
  hb.report.tcp_backlog_ms = 9010;
  hb.report.tcp_backlog_peer = transport::parse_ip_address("10.77.0.3");
  hb.report.last_wait_ms = 412;
  hb.report.wait_seconds = 17.5;
  const auto frame = transport::encode(hb);
  const auto back = transport::decode<transport::Heartbeat>(
      {transport::MessageType::kHeartbeat,
       std::vector<std::uint8_t>(frame.begin() + transport::kFrameHeaderBytes, frame.end())});
  EXPECT_EQ(transport::encode(back), frame);  // bytes: the NaN loss is kept, and NaN != NaN
  EXPECT_TRUE(std::isnan(back.report.loss));
  EXPECT_EQ(back.report.sync_buckets[3], 11u);
  EXPECT_EQ(back.report.lanes[1].bytes_sent, 6u);
  EXPECT_EQ(back.report.guard_rejections, 2u);
  EXPECT_EQ(back.report.kx, 268);
  EXPECT_EQ(back.report.replans, 1u);
  EXPECT_EQ(back.report.region_lane, (transport::LaneReport{9, 3.5f}));
  EXPECT_EQ(back.report.tcp_backlog_ms, 9010u);
  EXPECT_EQ(transport::ip_text(back.report.tcp_backlog_peer), "10.77.0.3");
  EXPECT_EQ(back.report.last_wait_ms, 412u);
  EXPECT_EQ(back.report.wait_seconds, 17.5);
  // Fixed size whatever the job: 2 x 8 + 4 + 4 + 8 + 13 x 8 + 8 + 2 x 12 + 8 + 8 + 4 + 12 + 4
  // + 16 + 4 + 8 bytes.
  EXPECT_EQ(frame.size() - transport::kFrameHeaderBytes, 232u);
}

TEST(JobHistory, RecordsEachEpochOnceWithItsRing) {
  JobHistory h;
  const std::vector<std::string> sites = {"west", "east", "north"};
  h.membership(membership(1, sites, {"west", "east", "north"}), 1.0);
  h.membership(membership(1, sites, {"west", "east", "north"}), 2.0);
  h.membership(membership(2, sites, {"west", "east"}, "site north lost"), 3.0);
  ASSERT_EQ(h.epochs().size(), 2u);
  EXPECT_EQ(h.epochs()[1].ring, (std::vector<std::string>{"west", "east"}));
  EXPECT_EQ(h.epochs()[1].note, "site north lost");
  EXPECT_DOUBLE_EQ(h.epochs()[1].at_s, 3.0);
}

// desloc_site_rejoins_total is a counter: it must not fall when old epochs are trimmed.
TEST(JobHistory, RejoinsCountEveryEpochEvenOnceOldEpochsAreTrimmed) {
  JobHistory h;
  const std::vector<std::string> sites = {"a", "b"};
  for (std::uint64_t e = 1; e <= 2 * JobHistory::kMaxEpochs; ++e) {
    Membership m = membership(e, sites, {"a", "b"}, e == 1 ? "" : "b rejoins");
    if (e > 1) m.joining = {"b"};
    h.membership(m, double(e));
  }
  EXPECT_EQ(h.epochs().size(), JobHistory::kMaxEpochs);
  EXPECT_EQ(h.epochs().front().epoch, 1u);
  EXPECT_EQ(h.epochs().back().epoch, 2 * JobHistory::kMaxEpochs);
  EXPECT_EQ(h.rejoins(), 2 * JobHistory::kMaxEpochs - 1);
}

TEST(JobHistory, ALossCurveStaysBoundedAndKeepsItsNewestPoint) {
  JobHistory h;
  h.membership(membership(1, {"a"}, {"a"}), 0.0);
  for (std::uint64_t step = 1; step <= 100000; ++step)
    h.heartbeat("a", 0, step, lanes(0, 0, 1.0f / float(step)));
  h.heartbeat("a", 1, 100001, lanes(0, 0, 9.0f));  // rank 1 does not speak for its site
  const auto& curve = h.losses().at("a");
  EXPECT_LE(curve.size(), JobHistory::kMaxPoints);
  EXPECT_GE(curve.size(), JobHistory::kMaxPoints / 2);
  EXPECT_EQ(curve.front().step, 1u);
  EXPECT_GE(curve.back().step, 100000u - 2 * 100000u / JobHistory::kMaxPoints);
  for (std::size_t i = 1; i < curve.size(); ++i) EXPECT_LT(curve[i - 1].step, curve[i].step);
}

TEST(JobHistory, LinkBytesGoToTheNeighboursOfTheRingOfTheirTime) {
  JobHistory h;
  const std::vector<std::string> sites = {"a", "b", "c"};
  h.membership(membership(1, sites, {"a", "b", "c"}), 0.0);
  EXPECT_EQ(h.neighbours("a"), (std::pair<std::string, std::string>{"b", "c"}));
  h.heartbeat("a", 0, 10, lanes(100, 40));
  h.heartbeat("a", 1, 10, lanes(50, 0));
  h.heartbeat("a", 0, 20, lanes(300, 40));  // +200 on lane 0, nothing new on lane 1
  // b is lost: a's ring neighbour is c now, and two sites need no second lane.
  h.membership(membership(2, sites, {"a", "c"}, "site b lost"), 1.0);
  EXPECT_EQ(h.neighbours("a"), (std::pair<std::string, std::string>{"c", ""}));
  h.heartbeat("a", 0, 30, lanes(350, 40));
  // A restarted rank counts from zero again.
  h.heartbeat("a", 1, 30, lanes(20, 0));
  using transport::LinkKey;
  EXPECT_EQ(h.link_bytes().at(LinkKey("a", "b")), 350u);
  EXPECT_EQ(h.link_bytes().at(LinkKey("a", "c")), 40u + 50u + 20u);
}

// Hierarchical DES-LOC: a rank's region lane goes to the next live site of its region's ring,
// and the region's links are listed with their rate (issue 15: bytes per level and per link).
TEST(JobHistory, RegionBytesGoToTheNextLiveSiteOfTheRegion) {
  JobHistory h;
  h.set_regions({{"a", "b", "c"}, {"d", "e"}});
  const std::vector<std::string> sites = {"a", "b", "c", "d", "e"};
  h.membership(membership(1, sites, {"a", "d", "b", "e", "c"}), 0.0);
  EXPECT_EQ(h.region_next("a"), "b");
  EXPECT_EQ(h.region_next("c"), "a");
  EXPECT_EQ(h.region_next("e"), "d");
  RankReport r = lanes(100, 10);
  r.region_lane.bytes_sent = 7000;
  h.heartbeat("a", 0, 10, r);
  r.region_lane.bytes_sent = 9000;
  h.heartbeat("a", 0, 20, r);
  // b is lost: a's region ring goes on to c.
  h.membership(membership(2, sites, {"a", "d", "e", "c"}, "site b lost"), 1.0);
  EXPECT_EQ(h.region_next("a"), "c");
  r.region_lane.bytes_sent = 9500;
  h.heartbeat("a", 0, 30, r);
  using transport::LinkKey;
  EXPECT_EQ(h.link_bytes().at(LinkKey("a", "b")), 9000u);
  EXPECT_EQ(h.link_bytes().at(LinkKey("a", "c")), 500u + 10u);  // and lane 1's first 10 bytes
  h.membership(membership(3, sites, {"a", "d", "e"}, "site c lost"), 2.0);
  EXPECT_EQ(h.region_next("a"), "");  // alone in its region now

  transport::JobStatus s;
  s.job.sites = sites;
  s.membership = membership(1, sites, {"a", "d", "b", "e", "c"});
  s.history.set_regions({{"a", "b", "c"}, {"d", "e"}});
  s.history.membership(*s.membership, 0.0);
  transport::RankProgress p;
  p.id = {"a", 0};
  p.report.region_lane = {4000, 2e6f};
  s.ranks.push_back(p);
  s.history.heartbeat("a", 0, 5, p.report);
  const auto links = transport::link_status(s);
  const auto ab = std::find_if(links.begin(), links.end(),
                               [](const auto& l) { return l.from == "a" && l.to == "b"; });
  ASSERT_NE(ab, links.end());
  EXPECT_TRUE(ab->in_ring);
  EXPECT_EQ(ab->bytes_sent, 4000u);
  EXPECT_DOUBLE_EQ(ab->recent_bytes_per_s, 2e6);
}

transport::JobStatus two_site_status() {
  transport::JobStatus s;
  s.job.sites = {"west", "east"};
  s.job.ranks_per_site = 2;
  s.job.steps = 100;
  s.job.plan = {{"method", "desloc"}, {"kx", "4"}};
  s.job.planned_bytes_per_s[{"west", "east"}] = 1.25e7;
  s.membership = membership(1, s.job.sites, {"west", "east"});
  s.history.membership(*s.membership, 0.0);
  for (std::uint32_t r = 0; r < 2; ++r)
    for (const std::string site : {"west", "east"}) {
      transport::RankProgress p;
      p.id = {site, r};
      p.step = 50;
      p.connected = true;
      p.report = lanes(1000, 0);
      p.report.lanes[0].recent_bytes_per_s = 4e6f;
      p.report.sync_buckets = {1, 0, 2};
      p.report.sync_seconds = 0.03;
      s.ranks.push_back(p);
      s.history.heartbeat(site, r, 50, p.report);
    }
  return s;
}

TEST(StatusViews, ALinkSumsItsSitesRanksAndMeetsItsPlan) {
  const auto links = transport::link_status(two_site_status());
  ASSERT_EQ(links.size(), 2u);
  EXPECT_EQ(links[0].from, "west");
  EXPECT_EQ(links[0].to, "east");
  EXPECT_TRUE(links[0].in_ring);
  EXPECT_EQ(links[0].bytes_sent, 2000u);
  EXPECT_DOUBLE_EQ(links[0].recent_bytes_per_s, 8e6);
  EXPECT_EQ(links[0].planned_bytes_per_s, 1.25e7);
  EXPECT_FALSE(links[1].planned_bytes_per_s.has_value());
}

TEST(StatusViews, TheHistogramIsCumulativeAndTheDroppedSiteIsNotLive) {
  auto s = two_site_status();
  std::string text = transport::prometheus_text(s);
  EXPECT_TRUE(contains(text, "# TYPE desloc_sync_duration_seconds histogram")) << text;
  EXPECT_TRUE(contains(
      text, "desloc_sync_duration_seconds_bucket{site=\"west\",rank=\"0\",le=\"0.005\"} 1\n"));
  EXPECT_TRUE(contains(
      text, "desloc_sync_duration_seconds_bucket{site=\"west\",rank=\"0\",le=\"0.025\"} 3\n"));
  EXPECT_TRUE(contains(
      text, "desloc_sync_duration_seconds_bucket{site=\"west\",rank=\"0\",le=\"+Inf\"} 3\n"));
  EXPECT_TRUE(contains(text, "desloc_sync_duration_seconds_count{site=\"west\",rank=\"0\"} 3\n"));
  EXPECT_TRUE(
      contains(text, "desloc_link_achieved_bytes_per_second{from=\"west\",to=\"east\"} 8000000\n"));
  EXPECT_TRUE(
      contains(text, "desloc_link_planned_bytes_per_second{from=\"west\",to=\"east\"} 12500000\n"));
  EXPECT_TRUE(contains(text, "desloc_site_live{site=\"east\"} 1\n"));

  s.membership = membership(2, s.job.sites, {"west"}, "site east lost");
  s.history.membership(*s.membership, 5.0);
  text = transport::prometheus_text(s);
  EXPECT_TRUE(contains(text, "desloc_site_live{site=\"east\"} 0\n")) << text;
  EXPECT_TRUE(contains(text, "desloc_recoveries_total 1\n"));
  // Its bytes stay counted; the link is no longer in the ring, so it has no rate.
  EXPECT_TRUE(contains(text, "desloc_link_bytes_sent_total{from=\"east\",to=\"west\"} 2000\n"));
  EXPECT_FALSE(contains(text, "desloc_link_achieved_bytes_per_second{from=\"east\""));
  const std::string json = transport::status_json(s);
  EXPECT_TRUE(contains(json, "\"site_state\":{\"west\":\"live\",\"east\":\"dropped\"}")) << json;
  EXPECT_TRUE(contains(json, "\"note\":\"site east lost\""));
}

TEST(StatusViews, SitesOfUnequalRankCountsExpectTheirSum) {
  auto s = two_site_status();
  EXPECT_TRUE(contains(transport::prometheus_text(s), "desloc_ranks_expected 4\n"));
  EXPECT_FALSE(contains(transport::status_json(s), "site_ranks"));
  s.job.site_ranks = {1, 2};
  EXPECT_TRUE(contains(transport::prometheus_text(s), "desloc_ranks_expected 3\n"));
  const std::string json = transport::status_json(s);
  EXPECT_TRUE(contains(json, "\"site_ranks\":[1,2],\"ranks_expected\":3")) << json;
}

}  // namespace
}  // namespace desloc
