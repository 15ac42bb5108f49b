// topology.toml parsing (every bad input named) and the planner: ring order on uneven links,
// the star comparison, the smallest Kx within target, Ku/Kv from half-lives, phases, and the
// unmeetable-target message.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "desloc/core/error.hpp"
#include "desloc/sync/sync_policy.hpp"
#include "desloc/topology/planner.hpp"
#include "desloc/topology/regions.hpp"
#include "desloc/topology/simulator.hpp"
#include "desloc/topology/site_batches.hpp"
#include "desloc/topology/topology.hpp"
#include "test_support.hpp"

using namespace desloc;
using namespace desloc::topology;

namespace {

// Symmetric links from a rate table (Mbit/s) for sites named by single letters.
std::string topology_toml(const std::string& sites, double step_ms, double (*mbit)(char, char),
                          double latency_ms = 0.2) {
  std::string t = "[meta]\nsource = \"test\"\n";
  for (char s : sites)
    t += "[[site]]\nname = \"" + std::string(1, s) + "\"\nstep_ms = " + std::to_string(step_ms) +
         "\n";
  for (char a : sites)
    for (char b : sites)
      if (a != b)
        t += "[[link]]\nfrom = \"" + std::string(1, a) + "\"\nto = \"" + std::string(1, b) +
             "\"\nbandwidth_mbit = " + std::to_string(mbit(a, b)) +
             "\nlatency_ms = " + std::to_string(latency_ms) + "\n";
  return t;
}

double triangle(char a, char b) {  // A-B 1 Gbit, B-C 300 Mbit, A-C 100 Mbit
  const std::string p = a < b ? std::string{a, b} : std::string{b, a};
  return p == "AB" ? 1000 : p == "BC" ? 300 : 100;
}

double square(char a, char b) {  // the sides A-B-C-D-A fast, the diagonals slow
  const std::string p = a < b ? std::string{a, b} : std::string{b, a};
  return (p == "AC" || p == "BD") ? 10 : 1000;
}

// The quickstart model's state (3.3 MB) over 100000 steps, within `target`; whole averages.
PlanRequest quickstart_request(double target, bool delayed = false) {
  PlanRequest req;
  req.state_bytes = 3.3e6;
  req.target_overhead = target;
  req.steps = 100000;
  req.mode = delayed ? PlanMode::kDelayed : PlanMode::kBlocking;
  if (delayed) req.fragments = 1;
  return req;
}

// What simulate() predicts for plan p (blocking, or delayed by p.delay) over 2 Kv + Kx steps:
// total time over compute time, less one, as the planner prices a plan.
double simulated_overhead(const Topology& t, const PlanRequest& req, const Plan& p) {
  SimJob job;
  job.schedule = {SyncMethod::kDesloc, p.kx,      p.ku,        p.kv,          0,
                  p.phase_u,           p.phase_v, p.fragments, p.fragments_u, p.fragments_v};
  job.steps = 2 * p.kv + p.kx;
  job.state_bytes = req.state_bytes;
  job.wire_ratio = req.wire_ratio;
  job.codec_s = req.codec_s;
  job.ring = p.chosen.order;
  job.lanes = p.chosen.lanes;
  job.lane_share = p.chosen.lane_share;
  job.mode = p.delay > 0 ? Overlap::kDelayed : Overlap::kNone;  // a blocking plan has no delay
  job.delay = {p.delay, p.delay, p.delay};
  const SimResult r = simulate(t, job);
  return r.total_s / r.compute_s - 1;
}

void expect_config_error(const std::string& text, const std::string& needle) {
  try {
    parse_topology(text, "topo.toml");
    ADD_FAILURE() << "accepted a topology that should fail with '" << needle << "'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Topology, RoundTripsThroughToml) {
  const Topology t = parse_topology(topology_toml("ABC", 88.5, triangle), "a.toml");
  ASSERT_EQ(t.sites.size(), 3u);
  ASSERT_EQ(t.links.size(), 6u);
  EXPECT_DOUBLE_EQ(t.link("B", "C").bandwidth_bps, 300e6 / 8);
  EXPECT_DOUBLE_EQ(t.site("A").step_s, 0.0885);
  const Topology back = parse_topology(to_toml(t), "b.toml");
  ASSERT_EQ(back.links.size(), t.links.size());
  for (std::size_t i = 0; i < t.links.size(); ++i) {
    EXPECT_NEAR(back.links[i].bandwidth_bps, t.links[i].bandwidth_bps, 1e-3);
    EXPECT_NEAR(back.links[i].latency_s, t.links[i].latency_s, 1e-12);
  }
  EXPECT_EQ(back.meta.at("source"), "test");
  EXPECT_EQ(to_toml(t).find("steal_ms_per_mb"), std::string::npos) << "written only when set";
  std::string stolen = topology_toml("AB", 50, triangle);
  stolen.insert(stolen.find("step_ms = ") + 10 + std::to_string(50.0).size() + 1,
                "steal_ms_per_mb = 9.5\n");
  const Topology s = parse_topology(stolen, "s.toml");
  EXPECT_DOUBLE_EQ(s.site("A").steal_s_per_byte, 9.5e-9);
  EXPECT_DOUBLE_EQ(s.site("B").steal_s_per_byte, 0.0);
  EXPECT_DOUBLE_EQ(parse_topology(to_toml(s), "s2.toml").site("A").steal_s_per_byte, 9.5e-9);
  EXPECT_EQ(to_toml(t).find("step_jitter"), std::string::npos) << "written only when set";
  EXPECT_DOUBLE_EQ(s.site("A").step_jitter, 0.0);
  std::string noisy = topology_toml("AB", 50, triangle);
  noisy.insert(noisy.find("step_ms = ") + 10 + std::to_string(50.0).size() + 1,
               "step_jitter = 0.29\n");
  const Topology j = parse_topology(noisy, "j.toml");
  EXPECT_DOUBLE_EQ(j.site("A").step_jitter, 0.29);
  EXPECT_DOUBLE_EQ(j.site("B").step_jitter, 0.0);
  EXPECT_DOUBLE_EQ(parse_topology(to_toml(j), "j2.toml").site("A").step_jitter, 0.29);
}

// From 32 sites on, to_toml writes the links as matrices ([links], row = from, column = to):
// read back, every link, its latency and its contended rate are the same; and the matrix is
// checked as the tables are, each bad cell named by its row and column.
TEST(Topology, ManySitesRoundTripThroughTheLinkMatrix) {
  Topology t;
  t.source = "t";
  for (int s = 0; s < 40; ++s) t.sites.push_back({"s" + std::to_string(s), 0.01 * (1 + s % 3)});
  for (int a = 0; a < 40; ++a)
    for (int b = 0; b < 40; ++b)
      if (a != b) {
        LinkProfile l;
        l.from = t.sites[std::size_t(a)].name;
        l.to = t.sites[std::size_t(b)].name;
        l.bandwidth_bps = (100.0 + a * 40 + b) * 1e6 / 8;
        l.latency_s = 0.001 * ((a + 2 * b) % 7);  // some zero
        l.contended_bps = a == 3 && b == 5 ? 50e6 / 8 : 0.0;
        t.links.push_back(l);
      }
  const std::string text = to_toml(t);
  EXPECT_NE(text.find("[links]"), std::string::npos);
  EXPECT_EQ(text.find("[[link]]"), std::string::npos);
  const Topology back = parse_topology(text, "m.toml");
  ASSERT_EQ(back.links.size(), t.links.size());
  for (const LinkProfile& l : t.links) {
    const LinkProfile& r = back.link(l.from, l.to);
    EXPECT_NEAR(r.bandwidth_bps, l.bandwidth_bps, 1e-3) << l.from << " -> " << l.to;
    EXPECT_NEAR(r.latency_s, l.latency_s, 1e-12) << l.from << " -> " << l.to;
    EXPECT_NEAR(r.contended_bps, l.contended_bps, 1e-3) << l.from << " -> " << l.to;
  }
  const std::string two =
      "[[site]]\nname = \"A\"\nstep_ms = 1\n[[site]]\nname = \"B\"\nstep_ms = 1\n";
  const std::string lat = "latency_ms = [[0, 1], [1, 0]]\n";
  EXPECT_DOUBLE_EQ(parse_topology(two + "[links]\nbandwidth_mbit = [[0, 8], [16, 0]]\n" + lat, "m")
                       .link("B", "A")
                       .bandwidth_bps,
                   2e6);
  expect_config_error(two + "[links]\nbandwidth_mbit = [[0, 8]]\n" + lat,
                      "links.bandwidth_mbit must be an array of 2 rows");
  expect_config_error(two + "[links]\nbandwidth_mbit = [[0, 8], [16]]\n" + lat,
                      "links.bandwidth_mbit row 2 must hold 2 numbers");
  expect_config_error(two + "[links]\nbandwidth_mbit = [[0, 8], [0, 0]]\n" + lat,
                      "links.bandwidth_mbit[2][1] = 0 must be a finite number > 0");
  expect_config_error(two + "[links]\nbandwidth_mbit = [[0, \"fast\"], [1, 0]]\n" + lat,
                      "links.bandwidth_mbit[1][2] must be a number");
  expect_config_error(two + "[links]\nbandwidth_mbit = [[0, 8], [16, 0]]\n",
                      "[links] has no 'latency_ms'");
  expect_config_error(two + "[links]\nbandwidth_mbit = [[0, 8], [16, 0]]\nrtt = 1\n" + lat,
                      "unknown key 'rtt' in [links]");
  expect_config_error(
      two + "[links]\nbandwidth_mbit = [[0, 8], [16, 0]]\n" + lat +
          "[[link]]\nfrom = \"A\"\nto = \"B\"\nbandwidth_mbit = 1\nlatency_ms = 1\n",
      "[links] and [[link]] both give the links");
}

TEST(Topology, BadInputIsNamed) {
  const std::string good = topology_toml("AB", 10, triangle);
  expect_config_error(good + "[[site]]\nname = \"A\"\nstep_ms = 1\n", "duplicate site 'A'");
  std::string unknown = good;
  unknown.replace(unknown.find("to = \"B\""), 8, "to = \"Z\"");
  expect_config_error(unknown, "unknown site 'Z'");
  std::string missing = good.substr(0, good.rfind("[[link]]"));
  expect_config_error(missing, "missing link(s) B -> A");
  for (const char* bad : {"0.0", "-5.0", "nan", "inf"}) {
    std::string b = good;
    const auto at = b.find("bandwidth_mbit = ") + 17;
    b.replace(at, b.find('\n', at) - at, bad);
    expect_config_error(b, "bandwidth_mbit");
  }
  std::string self =
      good + "[[link]]\nfrom = \"A\"\nto = \"A\"\nbandwidth_mbit = 1\nlatency_ms = 1\n";
  expect_config_error(self, "to itself");
  expect_config_error(
      good + "[[link]]\nfrom = \"A\"\nto = \"B\"\nbandwidth_mbit = 1\nlatency_ms = 1\n",
      "duplicate link A -> B");
  std::string typo = good;
  typo.replace(typo.find("step_ms"), 7, "step_mz");
  expect_config_error(typo, "step_ms");
  for (const char* bad : {"-1.0", "nan", "\"fast\""}) {
    std::string b = good;
    b.insert(b.find("step_ms = ") + 10 + std::to_string(10.0).size() + 1,
             std::string("steal_ms_per_mb = ") + bad + "\n");
    expect_config_error(b, "site.steal_ms_per_mb");
  }
  for (const char* bad : {"-0.1", "nan", "2.5", "\"high\""}) {
    std::string b = good;
    b.insert(b.find("step_ms = ") + 10 + std::to_string(10.0).size() + 1,
             std::string("step_jitter = ") + bad + "\n");
    expect_config_error(b, "site.step_jitter");
  }
  expect_config_error("[meta]\n", "no [[site]]");
  expect_config_error("[[site]]\nname = \"A\"\nstep_ms = 1\n[sites]\n", "unknown table 'sites'");
}

TEST(Planner, RingAvoidsSlowDiagonals) {
  const Topology t = parse_topology(topology_toml("ABCD", 50, square), "sq.toml");
  PlanRequest req;
  req.state_bytes = 4e6;
  req.steps = 100000;
  const Plan p = make_plan(t, req);
  ASSERT_EQ(p.chosen.kind, "ring");
  EXPECT_DOUBLE_EQ(p.chosen.bottleneck_bps, 1000e6 / 8) << p.chosen.describe();
  // The model: 2(n-1) steps of P/n bytes each over the slowest ring link, plus latency.
  const double expect = 2.0 * 3 * (0.2e-3 + 1e6 / (1000e6 / 8));
  EXPECT_NEAR(p.chosen.seconds, expect, 1e-12);
}

TEST(Planner, PricesTheStarThatBeatsTheRingOnATriangle) {
  const Topology t = parse_topology(topology_toml("ABC", 50, triangle), "tri.toml");
  PlanRequest req;
  req.state_bytes = 3e6;
  req.steps = 100000;
  const Plan p = make_plan(t, req);
  // Every 3-site ring crosses the 100 Mbit A-C link; a star at B uses 1 Gbit and 300 Mbit.
  EXPECT_DOUBLE_EQ(p.chosen.bottleneck_bps, 100e6 / 8);
  EXPECT_NEAR(star_seconds(t, "B", 3e6), 2 * (0.2e-3 + 3e6 / (300e6 / 8)), 1e-12);
  EXPECT_LT(star_seconds(t, "B", 3e6), p.chosen.seconds);
  bool noted = false;
  for (const auto& line : p.explanation)
    noted = noted || line.find("star at B") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(Planner, ChoosesTheSmallestKxWithinTarget) {
  const Topology t = parse_topology(topology_toml("ABC", 80, triangle), "tri.toml");
  PlanRequest req = quickstart_request(0.05);
  const Plan p = make_plan(t, req);
  EXPECT_EQ(p.ku, 3 * p.kx);
  EXPECT_EQ(p.kv, 6 * p.kx);  // beta 0.9 / 0.95: half-lives 6.6 and 13.5 steps
  const double sync = p.chosen.seconds;
  EXPECT_LE(overhead(sync, 0.08, p.kx, p.ku, p.kv, false), 0.05);
  EXPECT_GT(overhead(sync, 0.08, p.kx - 1, 3 * (p.kx - 1), 6 * (p.kx - 1), false), 0.05);
  EXPECT_NEAR(p.overhead, sync * 1.5 / (p.kx * 0.08), 1e-12);
  // Phases: u and v never on an x step, never on each other.
  EXPECT_NE(p.phase_u % p.kx, 0);
  EXPECT_NE(p.phase_v % p.kx, 0);
  EXPECT_NE(p.phase_u % p.kx, p.phase_v % p.kx);
  EXPECT_NE(p.config_fragment.find("kx = " + std::to_string(p.kx)), std::string::npos);
}

// --delayed: tau hides one average (plus the target's margin) under tau + 1 steps, the averages
// a third of a window apart each leave the link before the next starts, and the simulator,
// given the plan, predicts a step within the target of compute alone, where the blocking plan
// needs a far longer period.
TEST(Planner, DelayedAveragesHideUnderComputeAtAMuchShorterPeriod) {
  const Topology t = parse_topology(topology_toml("ABC", 80, triangle), "tri.toml");
  PlanRequest req = quickstart_request(0.03);
  const Plan blocking = make_plan(t, req);
  req.mode = PlanMode::kDelayed;
  req.fragments = 1;  // whole averages
  const Plan p = make_plan(t, req);
  const double sync = p.chosen.seconds;
  ASSERT_GT(sync, 3 * 0.08);  // an average outlasts several steps
  EXPECT_GE((p.delay + 1) * 0.08, sync * 1.03);
  EXPECT_LT(p.delay * 0.08, sync * 1.03 + 0.08);  // the smallest such tau
  EXPECT_LT(p.delay, p.kx);
  EXPECT_GE((p.kx / 3) * 0.08, sync * 1.03);
  EXPECT_LT(p.kx, blocking.kx);
  EXPECT_LE(p.overhead, 0.03);
  EXPECT_NE(p.config_fragment.find("overlap = \"delayed\"\ndelay = " + std::to_string(p.delay)),
            std::string::npos)
      << p.config_fragment;

  SimJob job;
  job.state_bytes = req.state_bytes;
  job.steps = 60 * p.kx;
  job.schedule = {SyncMethod::kDesloc, p.kx, p.ku, p.kv, 0, p.phase_u, p.phase_v};
  job.mode = Overlap::kDelayed;
  job.delay = {p.delay, p.delay, p.delay};
  const auto r = simulate(t, job);
  EXPECT_LE(r.total_s, job.steps * 0.08 * 1.03 + sync) << "one batch may drain at the end";
  EXPECT_GT(r.total_s, job.steps * 0.08);
  // The same periods blocking: every average on the critical path.
  job.mode = Overlap::kNone;
  job.delay = {};
  EXPECT_GT(simulate(t, job).total_s, job.steps * 0.08 * 1.3);
  job.mode = Overlap::kDelayed;
  job.delay = {1, 1, 1};
  const auto short_tau = simulate(t, job);
  // tau too short: each fold (two steps of compute after its start) waits for the rest of
  // its average; the phases keep every batch to one state.
  EXPECT_NEAR(short_tau.total_s - r.total_s, double(short_tau.syncs) * (sync - 2 * 0.08), sync);
}

// Streaming: fragments leave the wire sooner, so the planner finds a shorter period and a
// shorter delay than whole delayed averages, and the simulator, given that plan, predicts a
// step within the target of compute alone. A fragment count the user fixes is kept, or
// refused with the reason.
TEST(Planner, StreamingFragmentsShortenThePeriodAndTheDelay) {
  const Topology t = parse_topology(topology_toml("ABC", 80, triangle), "tri.toml");
  PlanRequest req = quickstart_request(0.03, true);
  const Plan whole = make_plan(t, req);
  req.fragments = 0;  // the planner chooses
  const Plan p = make_plan(t, req);
  EXPECT_GT(p.fragments, 1);
  EXPECT_LT(p.kx, whole.kx);
  EXPECT_LT(p.delay, whole.delay);
  EXPECT_EQ(p.kx % p.fragments, 0);
  EXPECT_LE(p.overhead, 0.03);
  EXPECT_NE(p.config_fragment.find("delay = " + std::to_string(p.delay) +
                                   "\nfragments = " + std::to_string(p.fragments) + "\n"),
            std::string::npos)
      << p.config_fragment;
  SimJob job;
  job.state_bytes = req.state_bytes;
  job.steps = 20 * p.kv;
  job.schedule = {SyncMethod::kDesloc, p.kx,      p.ku,        p.kv,          0,
                  p.phase_u,           p.phase_v, p.fragments, p.fragments_u, p.fragments_v};
  job.mode = Overlap::kDelayed;
  job.delay = {p.delay, p.delay, p.delay};
  const auto r = simulate(t, job);
  EXPECT_LE(r.total_s, job.steps * 0.08 * 1.03 + p.chosen.seconds) << "one batch may drain";
  // The bytes are the whole plan's per step at its period: 1/P of a state per fragment.
  EXPECT_NEAR(r.bytes_per_site / double(job.steps), 3.3e6 * 2.0 * 2 / 3 * 1.5 / double(p.kx),
              3.3e6 / double(p.fragments));
  // The same periods with whole averages and the plan's delay: the wire cannot keep up.
  job.schedule.fragments = 1;
  job.schedule.fragments_u = job.schedule.fragments_v = 0;
  EXPECT_GT(simulate(t, job).total_s, r.total_s * 1.05);

  req.fragments = 4;
  const Plan four = make_plan(t, req);
  EXPECT_EQ(four.fragments, 4);
  EXPECT_LE(four.overhead, 0.03);
  // --max-delay: a shorter delay for a longer period or more fragments, or a refusal.
  req.fragments = 0;
  req.max_delay = 1;
  const Plan short_delay = make_plan(t, req);
  EXPECT_LE(short_delay.delay, 1);
  EXPECT_GE(short_delay.kx, p.kx);
  job.schedule = {SyncMethod::kDesloc,
                  short_delay.kx,
                  short_delay.ku,
                  short_delay.kv,
                  0,
                  short_delay.phase_u,
                  short_delay.phase_v,
                  short_delay.fragments,
                  short_delay.fragments_u,
                  short_delay.fragments_v};
  job.steps = 20 * short_delay.kv;
  job.mode = Overlap::kDelayed;
  job.delay = {1, 1, 1};
  EXPECT_LE(simulate(t, job).total_s, job.steps * 0.08 * 1.03 + p.chosen.seconds);
  req.fragments = 1;  // whole averages cannot keep tau at 1
  EXPECT_THROW(make_plan(t, req), ConfigError);
  req.max_delay = 0;
  req.fragments = 3;
  req.steps = 6;  // too short for any Kx that hides them
  try {
    make_plan(t, req);
    ADD_FAILURE() << "3 fragments in 6 steps";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("hides averages of 3 fragments"), std::string::npos) << e.message();
  }
}

// The plan weighs a step of delay against steps of period (PlanRequest::delay_weight): among
// the plans within the target it takes the least Kx + W tau. That is the best of the plans
// with the least Kx under each bound on the delay (--max-delay d with W = 0).
double starved(char, char) { return 4.9; }  // the starved e2e bed's links (Mbit/s)

TEST(Planner, AStepOfDelayIsWeighedAgainstStepsOfPeriod) {
  // The starved e2e bed as profiled (22:44 UTC): 3 sites, 4.9 Mbit/s, 20.4 ms one way, a
  // 115 ms step, the quickstart model's averages in int4 (0.133x of fp32).
  const Topology t = parse_topology(topology_toml("ABC", 115, starved, 20.4), "starved.toml");
  PlanRequest req = quickstart_request(0.05, true);
  req.wire_ratio = {0.133, 0.133, 0.133};
  req.codec_s = {0.006, 0.006, 0.006};
  req.fragments = 0;
  req.delay_weight = 0;
  const Plan least = make_plan(t, req);  // the least Kx, then the least tau
  ASSERT_GT(least.delay, 1) << "the bed must offer shorter delays at longer periods";
  for (const double weight : {2.0, 8.0, 50.0}) {
    const auto score = [&](const Plan& p) { return double(p.kx) + weight * double(p.delay); };
    req.delay_weight = weight;
    req.max_delay = 0;
    const Plan weighed = make_plan(t, req);
    EXPECT_LE(weighed.overhead, 0.05);
    EXPECT_LE(score(weighed), score(least)) << weight;
    EXPECT_GE(weighed.kx, least.kx) << weight;
    EXPECT_LE(weighed.delay, least.delay) << weight;
    if (weight >= 8) {
      EXPECT_LT(weighed.delay, least.delay) << "a shorter delay pays here";
    }
    double best = std::numeric_limits<double>::infinity();
    for (std::int64_t d = 1; d <= least.delay; ++d) {
      req.delay_weight = 0;
      req.max_delay = d;
      try {
        best = std::min(best, score(make_plan(t, req)));
      } catch (const ConfigError&) {  // no plan keeps tau within d
      }
    }
    EXPECT_DOUBLE_EQ(score(weighed), best) << weight;
    req.delay_weight = weight;
    req.max_delay = 0;
    bool said = false;
    for (const auto& line : weighed.explanation)
      said |= line.find(fmt::format("delay against period: Kx + {:g} tau = {:g}", weight,
                                    score(weighed))) == 0;
    EXPECT_TRUE(said) << weight;
  }
  req.delay_weight = 1e6;  // the least delay at any period
  const Plan shortest = make_plan(t, req);
  EXPECT_EQ(shortest.delay, 1);
}

// The starved bed's sites swing 0.27-0.30 (sd of ln step time) where three share two cores:
// every batch then starts when the slowest site reaches its step. The steady plan leaves its
// batches too little slack for that; the plan for the measured noise keeps the target under it.
TEST(Planner, NoisyStepsGetAStreamingPlanWithSlackForTheSlowestSite) {
  Topology t = parse_topology(topology_toml("ABC", 108, starved, 20.4), "starved.toml");
  PlanRequest req = quickstart_request(0.05, true);
  req.wire_ratio = {0.133, 0.133, 0.133};
  req.codec_s = {0.006, 0.006, 0.006};
  req.fragments = 0;
  req.max_delay = 4;
  const Plan steady = make_plan(t, req);
  for (auto& s : t.sites) s.step_jitter = 0.3;
  const Plan noisy = make_plan(t, req);
  EXPECT_LE(noisy.overhead, 0.05);
  const auto simulated = [&](const Plan& p) { return simulated_overhead(t, req, p); };
  EXPECT_GT(simulated(steady), 0.05) << "the steady plan misses the target on noisy sites";
  EXPECT_NEAR(simulated(noisy), noisy.overhead, 1e-12);
  EXPECT_GT(delay_score(noisy.kx, noisy.delay, req.delay_weight),
            delay_score(steady.kx, steady.delay, req.delay_weight))
      << "slack costs period or delay";
  bool said = false;
  for (const auto& line : noisy.explanation) said |= line.starts_with("noise: ");
  EXPECT_TRUE(said);
  for (const auto& line : steady.explanation) EXPECT_FALSE(line.starts_with("noise: ")) << line;
}

// Blocking averages wait for the slowest site too: the closed form's Kx misses the target on
// sites that swing, and the plan walks on until the simulated overhead meets it.
TEST(Planner, NoisyStepsLengthenTheBlockingPeriod) {
  Topology t = parse_topology(topology_toml("ABC", 108, starved, 20.4), "starved.toml");
  PlanRequest req = quickstart_request(0.05);
  req.wire_ratio = {0.133, 0.133, 0.133};
  req.codec_s = {0.006, 0.006, 0.006};
  const Plan steady = make_plan(t, req);
  for (auto& s : t.sites) s.step_jitter = 0.3;
  const Plan noisy = make_plan(t, req);
  const auto simulated = [&](const Plan& p) { return simulated_overhead(t, req, p); };
  EXPECT_GT(simulated(steady), 0.05) << "the closed form's Kx misses the target on noisy sites";
  EXPECT_GT(noisy.kx, steady.kx);
  EXPECT_LE(noisy.overhead, 0.05);
  EXPECT_NEAR(simulated(noisy), noisy.overhead, 1e-12);
  bool said = false, walked = false;
  for (const auto& line : noisy.explanation) {
    said |= line.starts_with("noise: ");
    walked |= line.starts_with(fmt::format("Kx = {}: the overhead", noisy.kx)) &&
              line.find(fmt::format("from Kx = {} on", steady.kx)) != std::string::npos;
  }
  EXPECT_TRUE(said);
  EXPECT_TRUE(walked) << "the Kx line says where the closed form stopped and the walk began";
  req.mode = PlanMode::kUnbounded;  // the what-if of unbounded overlap has no rendezvous to wait at
  const std::int64_t overlapped_noisy = make_plan(t, req).kx;
  for (auto& s : t.sites) s.step_jitter = 0;
  EXPECT_EQ(overlapped_noisy, make_plan(t, req).kx);
}

TEST(Planner, KvFollowsTheSecondMomentsHalfLife) {
  const Topology t = parse_topology(topology_toml("AB", 80, triangle), "ab.toml");
  PlanRequest req;
  req.state_bytes = 1e6;
  req.steps = 100000;
  req.beta2 = 0.999;  // half-life 693 steps: the clamp (8 x Ku) applies
  const Plan p = make_plan(t, req);
  EXPECT_EQ(p.kv, 24 * p.kx);
  EXPECT_NEAR(half_life(0.9), 6.579, 1e-3);
}

TEST(Planner, AnUnmeetableTargetSaysWhatItWouldNeed) {
  const Topology t = parse_topology(topology_toml("ABC", 10, triangle), "tri.toml");
  PlanRequest req;
  req.state_bytes = 400e6;  // 100M parameters over 100 Mbit
  req.steps = 100;
  req.target_overhead = 0.01;
  try {
    make_plan(t, req);
    FAIL() << "planned an impossible target";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("needs Kx >="), std::string::npos) << m;
    EXPECT_NE(m.find("at Kx = 100 the overhead would be"), std::string::npos) << m;
  }
  req.target_overhead = -1;
  EXPECT_THROW(make_plan(t, req), ConfigError);
}

TEST(Simulator, ClosedFormsWithoutNoise) {
  const Topology t = parse_topology(topology_toml("ABC", 100, triangle), "tri.toml");
  SimJob job;
  job.state_bytes = 3e6;
  job.steps = 600;
  job.schedule.kx = 16;
  job.schedule.ku = 48;
  job.schedule.kv = 96;
  const double sync = ring_seconds(t, {"A", "B", "C"}, 3e6);
  job.schedule.method = SyncMethod::kNone;
  EXPECT_NEAR(simulate(t, job).total_s, 60.0, 1e-9);
  job.schedule.method = SyncMethod::kDdp;
  auto ddp = simulate(t, job);
  EXPECT_NEAR(ddp.total_s, 600 * (0.1 + sync), 1e-9);
  EXPECT_NEAR(ddp.bytes_per_site, 600 * 3e6 * 4.0 / 3.0, 1e-3);
  job.schedule.method = SyncMethod::kLocalAdam;
  EXPECT_EQ(simulate(t, job).syncs, 3 * (600 / 16));
  job.schedule.method = SyncMethod::kFavg;
  EXPECT_EQ(simulate(t, job).syncs, 600 / 16);
  job.schedule.method = SyncMethod::kDesloc;
  const auto d = simulate(t, job);
  EXPECT_EQ(d.syncs, 600 / 16 + 600 / 48 + 600 / 96);
  EXPECT_NEAR(d.total_s, 60.0 + double(d.syncs) * sync, 1e-9);
  EXPECT_NEAR(d.wait_s, 0.0, 1e-12);
  // Overlapped, the syncs hide under 16 steps of compute: only the last one shows.
  job.overlap = true;
  EXPECT_LT(simulate(t, job).total_s, 60.0 + 3 * sync + 1e-9);
}

// sync.overlap = "step": a step with averages takes max(compute, averages); DDP still blocks.
TEST(Simulator, StepOverlapHidesAveragesUnderOneStepOfCompute) {
  const Topology t = parse_topology(topology_toml("ABC", 100, triangle), "tri.toml");
  SimJob job;
  job.state_bytes = 3e6;
  job.steps = 600;
  job.schedule = {SyncMethod::kDesloc, 16, 48, 96, 0, 0, 0};
  job.mode = Overlap::kStep;
  const double sync = ring_seconds(t, {"A", "B", "C"}, 3e6);
  ASSERT_GT(sync, 0.1);  // one state's average outlasts the 0.1 s step: only the rest hides
  const auto d = simulate(t, job);
  std::int64_t x_only = 0, x_u = 0, x_u_v = 0;
  for (std::int64_t step = 1; step <= job.steps; ++step) {
    const int n = job.schedule.at(step).states();
    x_only += n == 1, x_u += n == 2, x_u_v += n == 3;
  }
  EXPECT_NEAR(d.total_s,
              60.0 + double(x_only) * (sync - 0.1) + double(x_u) * (2 * sync - 0.1) +
                  double(x_u_v) * (3 * sync - 0.1),
              1e-9);
  EXPECT_EQ(d.syncs, x_only + 2 * x_u + 3 * x_u_v);
  // A state that fits under a step costs nothing.
  job.state_bytes = 1e5;
  EXPECT_NEAR(simulate(t, job).total_s, 60.0, 1e-9);
  // DDP's gradient average cannot start before the gradient exists.
  job.schedule.method = SyncMethod::kDdp;
  EXPECT_NEAR(simulate(t, job).total_s, 600 * (0.1 + ring_seconds(t, {"A", "B", "C"}, 1e5)), 1e-9);
}

// Delayed averages: the control exchange runs on the communication thread, so a batch that
// leaves the wire before its folds costs nothing, round trips or not; a fold that comes too
// early waits for its own state's average only (x, u and v travel one after the other).
TEST(Simulator, ADelayedAverageWaitsOnlyAtAFoldThatComesBeforeIt) {
  const Topology t = parse_topology(topology_toml("ABC", 100, triangle, 20), "tri.toml");
  SimJob job;
  job.state_bytes = 1e6;
  job.steps = 950;  // the last batch (x at 944) is drained at 950, long after it left the wire
  job.schedule = {SyncMethod::kDesloc, 16, 48, 96, 0, 0, 0};
  const double sync = ring_seconds(t, {"A", "B", "C"}, 1e6);
  const double exchange = exchange_seconds(t, {"A", "B", "C"});
  ASSERT_GT(exchange, 0.03);
  ASSERT_LT(exchange + 3 * sync, 1.0);
  job.mode = Overlap::kDelayed;
  job.delay = {8, 12, 14};
  EXPECT_NEAR(simulate(t, job).total_s, 95.0, 1e-9);
  // u folded two steps after its start (after that step's compute: 0.3 s) waits for the
  // exchange, x's average and its own, not for v's.
  job.mode = Overlap::kDelayed;
  job.delay = {8, 2, 14};
  std::int64_t u_starts = 0;
  for (std::int64_t step = 1; step + 2 <= job.steps; ++step) u_starts += job.schedule.at(step).u;
  EXPECT_EQ(u_starts, 19);
  EXPECT_NEAR(simulate(t, job).total_s, 95.0 + double(u_starts) * (exchange + 2 * sync - 0.3),
              1e-9);
}

// Overlapped averages take their sites' steal (per byte sent) and the codec's work from the
// compute, spread over the delay; blocking averages take none (the sites wait for them anyway).
// The planner lengthens a delayed plan's period until that cost is within target too.
TEST(Simulator, OverlappedAveragesTakeTheStealAndTheCodecFromTheCompute) {
  Topology t = parse_topology(topology_toml("ABC", 100, triangle, 20), "tri.toml");
  SimJob job;
  job.state_bytes = 1e6;
  job.steps = 950;
  job.schedule = {SyncMethod::kDesloc, 16, 48, 96, 0, 0, 0};
  job.mode = Overlap::kDelayed;
  job.delay = {8, 12, 14};
  const SimResult free = simulate(t, job);
  ASSERT_NEAR(free.total_s, 95.0, 1e-9);
  EXPECT_EQ(free.steal_s, 0.0);
  for (auto& s : t.sites) s.steal_s_per_byte = 2e-9;  // 2 ms per MB
  // 59 x, 19 u and 9 v averages start; a site sends 2 (n - 1) / n of the state for each.
  const double per_average = 2e-9 * 1e6 * 4.0 / 3.0;
  std::int64_t starts = 0;
  for (std::int64_t step = 1; step <= job.steps; ++step) starts += job.schedule.at(step).states();
  const SimResult stolen = simulate(t, job);
  ASSERT_EQ(starts, 59 + 19 + 9);
  // The last x average (at 944) spreads its steal over steps 944 to 951: 7 of 8 in the job.
  const double expect = (double(starts) - 1.0 + 7.0 / 8.0) * per_average;
  EXPECT_NEAR(stolen.steal_s, expect, 1e-9);
  EXPECT_NEAR(stolen.total_s, 95.0 + expect, 1e-6) << "no site waits: each one's compute grows";
  job.codec_s = {0.004, 0.004, 0.004};
  EXPECT_NEAR(simulate(t, job).steal_s, expect * (per_average + 0.004) / per_average, 1e-9);
  job.codec_s = {};
  job.mode = Overlap::kNone;
  job.delay = {};  // blocking: the steal costs nothing beyond the wire
  const SimResult blocking = simulate(t, job);
  EXPECT_EQ(blocking.steal_s, 0.0);
  for (auto& s : t.sites) s.steal_s_per_byte = 0.0;
  EXPECT_NEAR(simulate(t, job).total_s, blocking.total_s, 1e-12);

  PlanRequest req = quickstart_request(0.05, true);
  const Plan wire = make_plan(t, req);
  for (auto& s : t.sites) s.steal_s_per_byte = 10e-9;  // 10 ms per MB: 44 ms per x average
  const Plan p = make_plan(t, req);
  EXPECT_GT(p.kx, wire.kx);
  EXPECT_EQ(p.delay, wire.delay) << "the wire's time is the same";
  EXPECT_LE(p.overhead, 0.05);
  // 44 ms per x window (x, u a third and v a sixth as often: 66 ms) within 5% of Kx steps.
  EXPECT_GE(double(p.kx) * 0.1 * 0.05, 10e-9 * 3.3e6 * 4.0 / 3.0 * 1.5 * 0.9);
  bool said = false;
  for (const auto& line : p.explanation) said |= line.find("steal: ") == 0;
  EXPECT_TRUE(said) << "the explanation names the steal";
}

// The simulator and the trainer share one due rule: for every method, with and without
// phases, the simulator performs exactly the averages the trainer's SyncPolicy makes.
TEST(Simulator, CountsExactlyTheAveragesTheTrainerMakes) {
  const Topology t = parse_topology(topology_toml("ABC", 100, triangle), "tri.toml");
  for (const SyncMethod m : kSyncMethods)
    for (const std::int64_t phase : {0, 3}) {
      sync::SyncConfig c{.method = m, .sites = 3, .kx = 4, .phase_x = phase};
      if (m == SyncMethod::kDesloc) {
        c.ku = 10;
        c.kv = 14;
        c.phase_u = phase + 1;
        c.phase_v = phase + 2;
      }
      const sync::SyncPolicy policy(c);
      SimJob job;
      job.state_bytes = 1e6;
      job.steps = 97;
      job.schedule = c.schedule();
      std::int64_t averages = 0;
      for (std::int64_t step = 1; step <= job.steps; ++step) averages += policy.at(step).states();
      SCOPED_TRACE(fmt::format("{} phase {}", to_string(m), phase));
      EXPECT_EQ(simulate(t, job).syncs, averages);
      if (m != SyncMethod::kNone) {
        EXPECT_GT(averages, 0);
      }
    }
}

// Hierarchical DES-LOC (issue 15, item 6): regions [A, B] and [C, D] on 1 Gbit, 20 Mbit
// between them. Over 24 steps with Kx = 8 (Ku 24, Kv 48) and region Kx = 2 (Ku 6, Kv 12), the
// regions alone average x 9 times, u 3 and v 2 (each region at once), the job 4 times
// (x at 8, 16, 24; u at 24): the closed form of the blocking run.
double two_regions(char a, char b) {
  const bool same = (a <= 'B') == (b <= 'B');
  return same ? 1000 : 20;
}
TEST(Simulator, RegionsAverageOverTheirOwnRingsAndOnlyTheirSitesWait) {
  const Topology t = parse_topology(topology_toml("ABCD", 100, two_regions, 1.0), "r.toml");
  SimJob job;
  job.state_bytes = 4e6;
  job.steps = 24;
  job.ring = {"A", "B", "C", "D"};
  job.schedule = {SyncMethod::kDesloc, 8, 24, 48, 0, 0, 0};
  job.regions = {{"A", "B"}, {"C", "D"}};
  job.region_schedule = {SyncMethod::kDesloc, 2, 6, 12, 0, 0, 0};
  const SimResult r = simulate(t, job);
  const double region = ring_seconds(t, {"A", "B"}, 4e6), global = ring_seconds(t, job.ring, 4e6);
  EXPECT_EQ(r.syncs, 4 + 2 * 14);
  EXPECT_NEAR(r.total_s, 24 * 0.1 + 14 * region + 4 * global, 1e-9);
  EXPECT_NEAR(r.bytes_per_site, 14 * 4e6 + 4 * 4e6 * 1.5, 1.0);
  // Flat at the region's periods: every one of those averages crosses the 20 Mbit links.
  SimJob flat = job;
  flat.regions.clear();
  flat.schedule = job.region_schedule;
  EXPECT_GT(simulate(t, flat).total_s, r.total_s * 3);
  // Overlapped with the step: a region average (2 x 32 ms on 1 Gbit) hides under 100 ms.
  SimJob step = job;
  step.mode = Overlap::kStep;
  EXPECT_LT(simulate(t, step).total_s, r.total_s - 10 * region);
  // A codec compresses the job-wide averages only: int4 (1/8 of the bytes) shortens those and
  // adds its seconds; a region's averages stay fp32.
  SimJob int4 = job;
  int4.wire_ratio = {0.125, 0.125, 0.125};
  int4.codec_s = {0.01, 0.01, 0.01};
  const SimResult c = simulate(t, int4);
  EXPECT_NEAR(c.total_s,
              24 * 0.1 + 14 * region + 4 * (ring_seconds(t, job.ring, 4e6 * 0.125) + 0.01), 1e-9);
  EXPECT_NEAR(c.bytes_per_site, 14 * 4e6 + 4 * 4e6 * 0.125 * 1.5, 1.0);
  // Delayed averages: the regions average every state they are due at the step's start (18
  // averages each, the job-wide steps included), the job-wide batches stream. With a state
  // small enough that a batch (its exchange and its averages) takes less than the two steps of
  // compute before its fold, nothing waits for the wide-area links.
  SimJob delayed = job;
  delayed.mode = Overlap::kDelayed;
  delayed.delay = {1, 1, 1};
  delayed.state_bytes = 4e4;
  const double small_region = ring_seconds(t, {"A", "B"}, 4e4);
  ASSERT_LT(exchange_seconds(t, job.ring) + 2 * ring_seconds(t, job.ring, 4e4), 0.2);
  const SimResult d = simulate(t, delayed);
  EXPECT_EQ(d.syncs, 4 + 2 * 18);
  EXPECT_NEAR(d.total_s, 24 * 0.1 + 18 * small_region, 1e-9);
  EXPECT_NEAR(d.bytes_per_site, 18 * 4e4 + 4 * 4e4 * 1.5, 1e-3);
  // At the full state each batch outlasts the steps before its fold, which waits for it.
  delayed.state_bytes = 4e6;
  EXPECT_GT(simulate(t, delayed).total_s, 24 * 0.1 + 18 * region + 3 * global);
  // Fragments stream the job-wide averages (with delayed averages only, as the trainer runs).
  delayed.schedule.fragments = 2;
  EXPECT_NO_THROW(simulate(t, delayed));
  SimJob fragments = job;
  fragments.schedule.fragments = 2;
  EXPECT_THROW(simulate(t, fragments), ConfigError);
}

// The hierarchical price beside a flat plan (issue 15, item 4): on 1 Gbit regions under
// 20 Mbit between them, the regions can average far more often at the same target, and the
// job-wide Kx is the flat plan's rounded up to a multiple of theirs. A region as slow as the
// links between regions gains nothing, and says so.
TEST(Planner, RegionsArePricedBesideTheFlatPlan) {
  const Topology t = parse_topology(topology_toml("ABCD", 100, two_regions, 1.0), "r.toml");
  PlanRequest req;
  req.state_bytes = 4e6;
  req.steps = 1000000;
  req.lanes = 2;
  const Plan flat = make_plan(t, req);
  const RegionPlan r = plan_regions(t, flat, {{"A", "B"}, {"C", "D"}});
  EXPECT_TRUE(r.worthwhile);
  EXPECT_NEAR(r.region_seconds, ring_seconds(t, {"A", "B"}, 4e6), 1e-12);
  EXPECT_LT(r.region_kx * 10, flat.kx);
  EXPECT_LE(r.region_overhead, req.target_overhead + 1e-12);
  EXPECT_GT(overhead(r.region_seconds, flat.step_s, r.region_kx - 1, 3 * (r.region_kx - 1),
                     6 * (r.region_kx - 1), false),
            req.target_overhead);
  EXPECT_EQ(r.kx % r.region_kx, 0);
  EXPECT_GE(r.kx, flat.kx);
  EXPECT_LT(r.kx, flat.kx + r.region_kx);
  EXPECT_NE(r.config_fragment.find("regions = [[\"A\", \"B\"], [\"C\", \"D\"]]"), std::string::npos)
      << r.config_fragment;
  const RegionPlan slow = plan_regions(t, flat, {{"A", "C"}, {"B", "D"}});
  EXPECT_FALSE(slow.worthwhile);
  EXPECT_NE(slow.explanation.back().find("not worth it"), std::string::npos);
  EXPECT_FALSE(r.plan);  // blocking: keys beside the flat plan, no whole plan
}

// With delayed averages the hierarchical plan is one whole plan (issue 43, item 4): the
// job-wide averages planned again with the regions' blocking averages in the simulation, Kx a
// multiple of the regions' period, u's and v's phases within the regions' periods (the config
// requires both), and a simulated overhead within the target plus the regions' own share.
// Against the flat streaming plan on the same links it averages across the regions no more
// often than that plan allows, and its fragment is complete: the regions' keys beside the
// streaming ones.
TEST(Planner, DelayedRegionsGiveOneHierarchicalStreamingPlan) {
  const Topology t = parse_topology(topology_toml("ABCD", 100, two_regions, 1.0), "r.toml");
  PlanRequest req;
  req.state_bytes = 4e6;
  req.steps = 1000000;
  req.lanes = 2;
  req.mode = PlanMode::kDelayed;
  req.max_delay = 4;
  const Plan flat = make_plan(t, req);
  ASSERT_GT(flat.fragments, 1) << fmt::format("{}", fmt::join(flat.explanation, "\n"));
  const RegionPlan r = plan_regions(t, flat, {{"A", "B"}, {"C", "D"}});
  ASSERT_TRUE(r.plan) << fmt::format("{}", fmt::join(r.explanation, "\n"));
  const Plan& h = *r.plan;
  EXPECT_EQ(h.kx % r.region_kx, 0);
  EXPECT_EQ(r.kx, h.kx);
  EXPECT_GT(h.delay, 0);
  EXPECT_LE(h.delay, 4);
  EXPECT_LT(h.phase_u, 3 * r.region_kx);
  EXPECT_LT(h.phase_v, 6 * r.region_kx);
  EXPECT_GE(h.kx, flat.kx);
  EXPECT_LE(h.overhead, req.target_overhead + r.region_overhead + 1e-12);
  // The simulation counted the regions' averages: the same schedule without them is cheaper.
  SimJob job;
  job.schedule = {SyncMethod::kDesloc, h.kx,      h.ku,        h.kv,          0,
                  h.phase_u,           h.phase_v, h.fragments, h.fragments_u, h.fragments_v};
  job.steps = 2 * h.kv + h.kx;
  job.state_bytes = 4e6;
  job.ring = h.chosen.order;
  job.lanes = h.chosen.lanes;
  job.lane_share = h.chosen.lane_share;
  job.mode = Overlap::kDelayed;
  job.delay = {h.delay, h.delay, h.delay};
  const SimResult alone = simulate(t, job);
  job.regions = {{"A", "B"}, {"C", "D"}};
  job.region_schedule = {SyncMethod::kDesloc, r.region_kx, 3 * r.region_kx, 6 * r.region_kx, 0,
                         h.phase_u,           h.phase_v};
  const SimResult both = simulate(t, job);
  EXPECT_NEAR(h.overhead, both.total_s / both.compute_s - 1, 1e-9);
  EXPECT_GT(both.total_s, alone.total_s);
  for (const std::string& key : std::vector<std::string>{
           "overlap = \"delayed\"", "region_kx = " + std::to_string(r.region_kx),
           "regions = [[\"A\", \"B\"], [\"C\", \"D\"]]", "kx = " + std::to_string(h.kx)})
    EXPECT_NE(r.config_fragment.find(key), std::string::npos) << key << "\n" << r.config_fragment;
}

TEST(Simulator, ComputeNoiseMakesSitesWaitAtSyncs) {
  const Topology t = parse_topology(topology_toml("ABC", 100, triangle), "tri.toml");
  SimJob job;
  job.state_bytes = 3e6;
  job.steps = 960;
  job.schedule.kx = 96;
  job.schedule.ku = 288;
  job.schedule.kv = 576;
  job.jitter = 0.3;
  const auto noisy = simulate(t, job);
  EXPECT_GT(noisy.wait_s, 0.0);
  EXPECT_EQ(simulate(t, job).total_s, noisy.total_s);  // a fixed seed: reproducible
  job.jitter = 0;
  EXPECT_GT(noisy.total_s, simulate(t, job).total_s * 0.9);
  job.schedule.kx = 0;
  EXPECT_THROW(simulate(t, job), ConfigError);
}

// Without job.jitter each site's steps swing by its measured step_jitter (desloc profile's);
// job.jitter overrides every site's, 0 included. The noise keeps the mean step: a site alone
// takes step_s per step on average, and the sites of a job only wait for each other.
TEST(Simulator, EachSiteSwingsByItsMeasuredNoise) {
  Topology t = parse_topology(topology_toml("ABC", 100, triangle), "tri.toml");
  SimJob job;
  job.state_bytes = 3e6;
  job.steps = 960;
  job.schedule = {SyncMethod::kDesloc, 16, 48, 96, 0, 0, 0};
  const SimResult steady = simulate(t, job);
  EXPECT_EQ(steady.wait_s, 0.0) << "equal steps, no noise: nobody waits";
  for (auto& s : t.sites) s.step_jitter = 0.3;
  const SimResult measured = simulate(t, job);
  EXPECT_GT(measured.wait_s, 0.0);
  EXPECT_GT(measured.total_s, steady.total_s);
  job.jitter = 0.3;
  EXPECT_EQ(simulate(t, job).total_s, measured.total_s) << "the same draws";
  job.jitter = 0.0;
  EXPECT_EQ(simulate(t, job).total_s, steady.total_s) << "--jitter 0 overrides the topology";
  // One site: no rendezvous, so the mean step is step_s whatever the noise.
  const Topology one =
      parse_topology("[[site]]\nname = \"A\"\nstep_ms = 100\nstep_jitter = 0.3\n", "one.toml");
  SimJob alone;
  alone.state_bytes = 3e6;
  alone.steps = 20000;
  alone.schedule.method = SyncMethod::kNone;
  EXPECT_NEAR(simulate(one, alone).step_s, 0.1, 0.1 * 0.01);
}

TEST(Planner, TwoLanesUseBothDirectionsAndHalveTheRingTime) {
  const Topology t = parse_topology(topology_toml("ABC", 50, triangle, 0.0), "tri.toml");
  const double one = ring_seconds(t, {"A", "B", "C"}, 6e6, 1);
  const double two = ring_seconds(t, {"A", "B", "C"}, 6e6, 2);
  EXPECT_NEAR(two, one / 2, 1e-12);  // symmetric links, zero latency
  // On the triangle, the reversed ring's halves match the star at B.
  EXPECT_NEAR(two, star_seconds(t, "B", 6e6), 1e-12);
  PlanRequest req;
  req.state_bytes = 6e6;
  req.steps = 100000;
  req.lanes = 2;
  const Plan p = make_plan(t, req);
  EXPECT_EQ(p.chosen.lanes, 2);
  EXPECT_NE(p.config_fragment.find("lanes = 2"), std::string::npos) << p.config_fragment;
  EXPECT_NE(p.chosen.describe().find("2 lanes"), std::string::npos);
  // Two sites have one link, already used both ways: no second lane.
  const Topology ab = parse_topology(topology_toml("AB", 50, triangle), "ab.toml");
  EXPECT_EQ(make_plan(ab, req).chosen.lanes, 1);
}

// Capacity-weighted lanes (issue 15, item 3): where the ring's direction is 4x faster than the
// reverse's, the plan puts about 4/5 of each shard on the ring, both lanes then finish
// together, the all-reduce is faster than at the even split (still priced, as a candidate),
// and the config fragment carries the share. Alike directions keep 0.5 and no key.
double forward_fast(char a, char b) {  // A>B, B>C, C>A 1 Gbit; their reverse 250 Mbit
  const std::string p{a, b};
  return (p == "AB" || p == "BC" || p == "CA") ? 1000 : 250;
}
TEST(Planner, LanesAreWeighedByTheCapacityOfEachDirection) {
  const Topology t = parse_topology(topology_toml("ABC", 50, forward_fast, 0.0), "fwd.toml");
  const std::vector<std::string> ring{"A", "B", "C"};
  const double share = balanced_lane_share(t, ring, 6e6);
  EXPECT_NEAR(share, 0.8, 0.011);
  const double even = ring_seconds(t, ring, 6e6, 2), weighed = ring_seconds(t, ring, 6e6, 2, share);
  // Even: the reverse lane's 3 MB at 250 Mbit bounds it; weighed: 4.8 MB at 1 Gbit and 1.2 MB
  // at 250 Mbit, each 0.4 of that.
  EXPECT_NEAR(weighed / even, 0.4, 0.01);
  PlanRequest req;
  req.state_bytes = 6e6;
  req.steps = 100000;
  req.lanes = 2;
  const Plan p = make_plan(t, req);
  EXPECT_EQ(p.chosen.lanes, 2);
  // The planner may pick either direction as "the ring": its share puts 4/5 on the fast one.
  const bool forward = p.chosen.order == ring;
  EXPECT_NEAR(p.chosen.lane_share, forward ? 0.8 : 0.2, 0.011) << p.chosen.describe();
  EXPECT_NE(p.config_fragment.find("lane_share = "), std::string::npos) << p.config_fragment;
  EXPECT_NE(p.chosen.describe().find("% on the ring"), std::string::npos);
  bool priced_even = false;
  for (const Schedule& c : p.candidates)
    if (c.kind == "ring" && c.lanes == 2 && c.lane_share == 0.5 && c.order == p.chosen.order) {
      priced_even = true;
      EXPECT_GT(c.seconds, p.chosen.seconds * 1.5);
    }
  EXPECT_TRUE(priced_even);
  // Alike directions: the even split, and the fragment says nothing of it.
  const Topology tri = parse_topology(topology_toml("ABC", 50, triangle, 0.0), "tri.toml");
  EXPECT_EQ(balanced_lane_share(tri, ring, 6e6), 0.5);
  const Plan q = make_plan(tri, req);
  EXPECT_EQ(q.chosen.lane_share, 0.5);
  EXPECT_EQ(q.config_fragment.find("lane_share"), std::string::npos) << q.config_fragment;
}

// A link of 1e-17 Mbit/s or a target of 1e-30 once sent the search for Kx on a walk of about
// 1e20 steps; both are refused from the closed form at once, naming what Kx they would need.
TEST(Planner, AbsurdLinksAndTargetsAreRefusedAtOnce) {
  std::string text = topology_toml("AB", 50, triangle);
  text.replace(text.find("bandwidth_mbit = 1000.000000"), 28, "bandwidth_mbit = 1e-17");
  const Topology t = parse_topology(text, "slow.toml");
  PlanRequest req;
  req.state_bytes = 1e6;
  req.steps = 1000;
  const test_support::Watchdog watchdog(std::chrono::seconds(30), "make_plan");
  const auto start = std::chrono::steady_clock::now();
  try {
    make_plan(t, req);
    FAIL() << "planned over a 1e-17 Mbit/s link";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("needs Kx >= "), std::string::npos) << m;
    EXPECT_NE(m.find("train.steps = 1000"), std::string::npos) << m;
  }
  const Topology fast = parse_topology(topology_toml("AB", 50, triangle), "ab.toml");
  req.target_overhead = 1e-30;
  req.steps = std::numeric_limits<std::int64_t>::max();  // Kv = 6 Kx must still fit
  try {
    make_plan(fast, req);
    FAIL() << "planned a 1e-30 overhead";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--target-overhead 1e-30"), std::string::npos) << e.what();
  }
  // A steal no Kx within train.steps pays, with whole averages and with fragments: refused
  // naming it, without walking (or simulating) every Kx up to the steps.
  Topology thief = parse_topology(topology_toml("ABC", 100, triangle, 20), "thief.toml");
  thief.sites[1].steal_s_per_byte = 1e-3;  // a second per KB
  PlanRequest d;
  d.state_bytes = 3.3e6;
  d.steps = 100000;
  d.mode = PlanMode::kDelayed;
  for (const int fragments : {1, 0}) {
    d.fragments = fragments;
    try {
      make_plan(thief, d);
      FAIL() << "planned around a steal of 1e6 ms per MB, fragments " << fragments;
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("steal up to 1e+06 ms per MB sent, site B"), std::string::npos) << m;
      EXPECT_NE(m.find("train.steps = 100000"), std::string::npos) << m;
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // Within reach, the largest allowed Kx still plans.
  req.target_overhead = 0.05;
  req.steps = 100000;
  EXPECT_NO_THROW(make_plan(fast, req));
}

// Compressed averages (sync.codec_*): the simulator sends each state's encoded bytes and adds
// its codec time; the planner prices the weighted mean of x's, u's and v's and so finds a
// shorter period, and repeats the codec keys in its config fragment.
TEST(Planner, CodecsShrinkTheAveragesAndThePeriod) {
  const Topology t = parse_topology(topology_toml("ABC", 100, triangle, 0.0), "tri.toml");
  SimJob job;
  job.state_bytes = 3e6;
  job.steps = 96;
  job.schedule = {SyncMethod::kDesloc, 16, 48, 96, 0, 0, 0};
  const auto fp32 = simulate(t, job);
  job.wire_ratio = {0.25, 0.5, 1.0};
  job.codec_s = {0.01, 0.02, 0.0};
  const auto coded = simulate(t, job);
  const double per_state = 3e6 * 4.0 / 3.0;  // a ring sends 2(n-1)/n of the payload
  EXPECT_NEAR(fp32.bytes_per_site, per_state * (6 + 2 + 1), 1e-3);
  EXPECT_NEAR(coded.bytes_per_site, per_state * (6 * 0.25 + 2 * 0.5 + 1 * 1.0), 1e-3);
  const std::vector<std::string> ring = {"A", "B", "C"};
  const double expect = 9.6 + 6 * (ring_seconds(t, ring, 0.75e6) + 0.01) +
                        2 * (ring_seconds(t, ring, 1.5e6) + 0.02) + ring_seconds(t, ring, 3e6);
  EXPECT_NEAR(coded.total_s, expect, 1e-9);

  PlanRequest req;
  req.state_bytes = 3.3e6;
  req.steps = 100000;
  const Plan plain = make_plan(t, req);
  req.wire_ratio = {0.25, 0.25, 0.25};
  req.codec_keys = "codec_x = \"int8\"\ncodec_u = \"int8\"\ncodec_v = \"int8\"";
  const Plan coded_plan = make_plan(t, req);
  // No latency: a quarter of the bytes is a quarter of the time, and of the period (rounded).
  EXPECT_NEAR(double(coded_plan.kx), double(plain.kx) / 4.0, 1.0);
  EXPECT_NE(coded_plan.config_fragment.find("codec_u = \"int8\""), std::string::npos);
  bool said = false;
  for (const auto& line : coded_plan.explanation) said = said || line.starts_with("codecs: ");
  EXPECT_TRUE(said);
  // Codec time counts like wire time.
  req.codec_s = {10 * coded_plan.chosen.seconds, 10 * coded_plan.chosen.seconds,
                 10 * coded_plan.chosen.seconds};
  EXPECT_GT(make_plan(t, req).kx, 5 * coded_plan.kx);
}

namespace {

// `regions` sites in groups of `per_region`, named r<i>s<j>: `inside` Mbit/s within a group,
// between groups i and j `between(i, j)`.
Topology grouped(int regions, int per_region, double inside, double (*between)(int, int)) {
  Topology t;
  auto name = [&](int s) { return fmt::format("r{}s{}", s / per_region, s % per_region); };
  const int n = regions * per_region;
  for (int s = 0; s < n; ++s) t.sites.push_back({name(s), 0.1});
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) {
        const int ra = a / per_region, rb = b / per_region;
        const double mbit = ra == rb ? inside : between(std::min(ra, rb), std::max(ra, rb));
        t.links.push_back({name(a), name(b), mbit * 1e6 / 8, 1e-3, 0.0});
      }
  return t;
}

}  // namespace

TEST(Regions, TwoRegionsOfTwoAreFoundWithTheirReasons) {
  const Topology t =
      parse_topology(topology_toml("ABCD", 100,
                                   [](char a, char b) {
                                     const bool same = (a < 'C') == (b < 'C');
                                     return same ? 1000.0 : (a == 'A' || b == 'A' ? 20.0 : 18.0);
                                   }),
                     "t.toml");
  const RegionProposal p = propose_regions(t);
  ASSERT_EQ(p.regions.size(), 2u) << p.explanation.at(0);
  EXPECT_EQ(p.regions[0], (std::vector<std::string>{"A", "B"}));
  EXPECT_EQ(p.regions[1], (std::vector<std::string>{"C", "D"}));
  EXPECT_NEAR(p.inside_min_bps / p.between_max_bps, 1000.0 / 20.0, 1e-6);
  EXPECT_NE(p.explanation.at(0).find("proposed 2 regions: [A, B] [C, D]"), std::string::npos)
      << p.explanation.at(0);
  EXPECT_NE(p.explanation.at(0).find("50.0x apart"), std::string::npos) << p.explanation.at(0);
}

TEST(Regions, NoneWhereTheLinksAreEvenOrChained) {
  // Even links: no grouping at all.
  const RegionProposal even = propose_regions(
      parse_topology(topology_toml("ABCD", 100, [](char, char) { return 100.0; }), "t.toml"));
  EXPECT_TRUE(even.regions.empty());
  EXPECT_NE(even.explanation.at(0).find("none proposed"), std::string::npos);
  // A gap of 2x only: named with the best grouping's figures, and refused.
  const RegionProposal small = propose_regions(parse_topology(
      topology_toml("ABCD", 100,
                    [](char a, char b) { return (a < 'C') == (b < 'C') ? 200.0 : 100.0; }),
      "t.toml"));
  EXPECT_TRUE(small.regions.empty());
  EXPECT_NE(small.explanation.at(0).find("only 2.0x faster"), std::string::npos)
      << small.explanation.at(0);
  // A chain: A-B and B-C fast, A-C slow. A, B, C are not one region (A-C would be inside it).
  const RegionProposal chain = propose_regions(parse_topology(
      topology_toml("ABCD", 100,
                    [](char a, char b) {
                      const std::string p = a < b ? std::string{a, b} : std::string{b, a};
                      return p == "AB" || p == "BC" ? 1000.0 : 10.0;
                    }),
      "t.toml"));
  for (const auto& r : chain.regions)
    EXPECT_FALSE(std::find(r.begin(), r.end(), "A") != r.end() &&
                 std::find(r.begin(), r.end(), "C") != r.end())
        << chain.explanation.at(0);
}

TEST(Regions, EightRegionsOfSixtyFourSitesAndAThousandSitesQuickly) {
  // The synthetic topology: 8 regions of 8 (100 Gbit inside; 1 to 25 Gbit between).
  const Topology t =
      grouped(8, 8, 100000, [](int a, int b) { return 1000.0 + 3000.0 * ((a + b) % 9); });
  auto t0 = std::chrono::steady_clock::now();
  const RegionProposal p = propose_regions(t);
  const double s64 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(p.regions.size(), 8u) << p.explanation.at(0);
  for (std::size_t r = 0; r < 8; ++r) {
    ASSERT_EQ(p.regions[r].size(), 8u);
    EXPECT_EQ(p.regions[r][0], fmt::format("r{}s0", r));
  }
  EXPECT_NEAR(p.inside_min_bps * 8 / 1e6, 100000, 1e-6);
  EXPECT_NEAR(p.between_max_bps * 8 / 1e6, 25000, 1e-6);
  // 1024 sites (32 regions of 32): still one call well under a second.
  const Topology big =
      grouped(32, 32, 100000, [](int a, int b) { return 1000.0 + 100.0 * ((a * 7 + b) % 50); });
  t0 = std::chrono::steady_clock::now();
  const RegionProposal q = propose_regions(big);
  const double s1024 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(q.regions.size(), 32u);
  EXPECT_LT(s1024, 5.0) << "1024 sites took " << s1024 << " s (64 sites: " << s64 << " s)";
  std::printf("propose_regions: 64 sites %.3f s, 1024 sites %.3f s\n", s64, s1024);
}

// ------------------------------------------------------------------------- unequal sites

namespace {
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}
// Sites A, B and C whose steps took 100, 200 and 400 ms at a batch of 8 per rank (C's
// recorded, A's and B's the request's).
Topology unequal_speeds(const std::string& extra_c = "") {
  std::string t = topology_toml("ABC", 100, triangle);
  t = replaced(t, "name = \"B\"\nstep_ms = 100.000000", "name = \"B\"\nstep_ms = 200");
  t = replaced(t, "name = \"C\"\nstep_ms = 100.000000",
               "name = \"C\"\nstep_ms = 400\nbatch = 8\n" + extra_c);
  return parse_topology(t, "unequal.toml");
}
}  // namespace

// Every average waits for the slowest site: the simulator says which site waits how long.
TEST(Simulator, EachSitesWaitAtTheAveragesIsItsOwn) {
  const Topology t = unequal_speeds();
  SimJob job;
  job.state_bytes = 3e6;
  job.steps = 64;
  job.schedule = {SyncMethod::kDesloc, 16, 48, 96, 0, 0, 0};
  const SimResult r = simulate(t, job);
  ASSERT_EQ(r.wait_by_site.size(), 3u);
  // Between averages A computes 16 x 100 ms, C 16 x 400 ms: A waits 4.8 s a period, B 3.2 s.
  EXPECT_NEAR(r.wait_by_site[0], 4 * 16 * 0.3, 1e-9);
  EXPECT_NEAR(r.wait_by_site[1], 4 * 16 * 0.2, 1e-9);
  EXPECT_NEAR(r.wait_by_site[2], 0.0, 1e-9);
  EXPECT_NEAR(r.wait_s, (r.wait_by_site[0] + r.wait_by_site[1]) / 3.0, 1e-9);
}

// A batch per rank in proportion to each site's speed: 2 ranks each of 8 sequences (48 a step)
// become 8 x 16/7 x 4, 2/7 x 4 ... rounded: every site then steps in about the same time, the job
// keeps its 48 sequences a step, and its step drops from 400 ms to about 230.
TEST(SiteBatches, BatchesFollowTheSitesSpeedAndKeepTheSequencesPerStep) {
  const Topology t = unequal_speeds();
  SiteBatchRequest req;
  req.sites = {"A", "B", "C"};
  req.ranks = {2, 2, 2};
  req.batch = {8, 8, 8};
  const SiteBatchPlan p = balance_site_batches(t, req);
  EXPECT_EQ(p.sequences, 48);
  EXPECT_EQ(p.balanced_sequences, 48);
  EXPECT_EQ(p.batch, (std::vector<int>{14, 7, 3}));  // 13.7, 6.9, 3.4 rounded by the steps
  EXPECT_NEAR(p.configured_job_step_s, 0.4, 1e-12);
  EXPECT_LT(p.job_step_s, 0.24);
  EXPECT_TRUE(p.pace_setter.empty());
  for (double s : p.step_s) EXPECT_NEAR(s, 0.18, 0.06);
  EXPECT_NE(p.explanation.at(0).find("every average waits for C"), std::string::npos)
      << p.explanation.at(0);
}

// A site so slow that even a batch of 1 takes longer than the others' balanced step sets the
// pace, and the plan names it with the cost; a site whose memory holds little takes what it
// holds and the rest goes to the others.
TEST(SiteBatches, ASiteTooSlowOrTooSmallIsNamedWithWhatItCosts) {
  const Topology slow =
      parse_topology(replaced(topology_toml("AB", 10, triangle),
                              "name = \"B\"\nstep_ms = 10.000000", "name = \"B\"\nstep_ms = 4000"),
                     "slow.toml");
  SiteBatchRequest req;
  req.sites = {"A", "B"};
  req.ranks = {1, 1};
  req.batch = {4, 4};
  const SiteBatchPlan p = balance_site_batches(slow, req);
  EXPECT_EQ(p.batch, (std::vector<int>{7, 1}));
  EXPECT_EQ(p.pace_setter, "B");
  EXPECT_NE(p.explanation.back().find("at its smallest batch (1)"), std::string::npos)
      << p.explanation.back();

  const Topology small = parse_topology(
      replaced(topology_toml("ABC", 100, triangle), "name = \"A\"\nstep_ms = 100.000000",
               "name = \"A\"\nstep_ms = 100\nmemory_mb = 10\n"),
      "small.toml");
  SiteBatchRequest three;
  three.sites = {"A", "B", "C"};
  three.ranks = {1, 1, 1};
  three.batch = {8, 8, 8};
  three.memory_at = [](int batch) { return 1e6 * batch; };  // 1 MB a sequence
  const SiteBatchPlan q = balance_site_batches(small, three);
  EXPECT_EQ(q.memory_cap, (std::vector<int>{10, 0, 0}));
  EXPECT_EQ(q.batch, (std::vector<int>{8, 8, 8}));          // alike speeds: nothing moves
  three.memory_at = [](int batch) { return 2e6 * batch; };  // A holds 5
  const SiteBatchPlan r = balance_site_batches(small, three);
  EXPECT_EQ(r.batch, (std::vector<int>{5, 10, 9}));
  EXPECT_EQ(r.balanced_sequences, 24);
  EXPECT_NE(r.explanation.at(2).find("holds a batch of at most 5"), std::string::npos)
      << r.explanation.at(2);
}

TEST(Topology, ASitesBatchAndMemoryRoundTrip) {
  const Topology t = unequal_speeds("memory_mb = 2048\n");
  EXPECT_EQ(t.site("C").batch, 8);
  EXPECT_EQ(t.site("C").memory_bytes, 2048e6);
  EXPECT_EQ(t.site("A").batch, 0);
  const Topology back = parse_topology(to_toml(t), "back.toml");
  EXPECT_EQ(back.site("C").batch, 8);
  EXPECT_EQ(back.site("C").memory_bytes, 2048e6);
  expect_config_error(replaced(topology_toml("AB", 10, triangle), "step_ms = 10.000000",
                               "step_ms = 10\nbatch = 2.5"),
                      "whole number of sequences");
}
