// Whole-job restart: S sites x R ranks as threads over real UCX loopback groups (site group and
// WAN group, as a `desloc worker` builds them) agree on the newest checkpoint step every rank
// holds intact, identically on every rank, and name who lacks each newer step.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/train/checkpoint.hpp"
#include "desloc/train/resume_agreement.hpp"
#include "desloc/transport/ucx_collective.hpp"
#include "test_support.hpp"

using namespace desloc;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using test_support::Watchdog;

namespace {

const std::vector<std::string> kSites = {"east", "west", "north"};

// A scan with these valid steps (any order) and no rejected files.
train::CheckpointScan valid_steps(std::vector<std::int64_t> steps) {
  train::CheckpointScan scan;
  std::sort(steps.begin(), steps.end(), std::greater<>());
  for (std::int64_t s : steps) scan.valid.push_back({s, 0, 0, "step"});
  return scan;
}

// Runs agree_on_resume_step on sites of site_ranks[s] ranks (the ranks counted site by site
// get scans in that order) and returns every rank's choice. A site of one rank passes no site
// group, as the trainer does; a rank of several segments passes each one's ring.
std::vector<train::ResumeChoice> agree(const std::vector<int>& site_ranks,
                                       const std::vector<train::CheckpointScan>& scans) {
  Watchdog watchdog(60s);
  test_support::WorldOptions world;
  world.collective.deadline = 20s;
  world.wan_chunk_headers = false;
  world.lone_site_group = false;
  const int S = static_cast<int>(site_ranks.size());
  std::vector<std::size_t> first(site_ranks.size() + 1, 0);
  for (std::size_t s = 0; s < site_ranks.size(); ++s)
    first[s + 1] = first[s] + std::size_t(site_ranks[s]);
  std::vector<train::ResumeChoice> got(first.back());
  test_support::run_world(site_ranks, world, [&](int s, int r, test_support::Groups& groups) {
    const std::size_t me = first[std::size_t(s)] + std::size_t(r);
    train::ResumeAgreementOptions opts;
    opts.site_names = {kSites.begin(), kSites.begin() + S};
    opts.who = fmt::format("{}/{}", kSites[std::size_t(s)], r);
    std::vector<transport::Collective*> rings;
    for (const sync::WanRing& w : groups.wan_rings()) rings.push_back(w.ring);
    got[me] = train::agree_on_resume_step(scans[me], groups.site.get(), rings, opts);
  });
  // Every rank decided the same thing.
  for (const auto& c : got) {
    EXPECT_EQ(c.step, got[0].step);
    EXPECT_EQ(c.passed_over, got[0].passed_over);
  }
  return got;
}

std::vector<train::ResumeChoice> agree(int S, int R,
                                       const std::vector<train::CheckpointScan>& scans) {
  return agree(std::vector<int>(static_cast<std::size_t>(S), R), scans);
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST(ResumeAgreement, ChoosesTheNewestCommonStepAndNamesWhoLacksNewerOnes) {
  // east/0, east/1, west/0, west/1. Common: {300}; 400 and 500 are passed over.
  const auto got = agree(2, 2,
                         {valid_steps({100, 200, 300, 400}), valid_steps({100, 200, 300}),
                          valid_steps({200, 300, 400}), valid_steps({100, 300, 400, 500})});
  ASSERT_EQ(got[0].step, std::optional<std::int64_t>(300));
  ASSERT_EQ(got[0].passed_over.size(), 2u);
  const std::string& s500 = got[0].passed_over[0];
  const std::string& s400 = got[0].passed_over[1];
  EXPECT_TRUE(s500.starts_with("step 500: held by 1 of 4 ranks")) << s500;
  EXPECT_TRUE(contains(s500, "east/0 has no checkpoint at step 500")) << s500;
  EXPECT_FALSE(contains(s500, "west/1")) << s500;
  EXPECT_TRUE(s400.starts_with("step 400: held by 3 of 4 ranks")) << s400;
  EXPECT_TRUE(contains(s400, "east/1 has no checkpoint at step 400")) << s400;
  EXPECT_FALSE(contains(s400, "east/0")) << s400;
}

// Sites of unequal rank counts (east 1, west 3, north 2): each site's own ranks are counted,
// the single rank gathering over each of its three rings.
TEST(ResumeAgreement, SitesOfUnequalRankCountsAgreeAndNameTheRankThatLacksAStep) {
  const auto got = agree(std::vector<int>{1, 3, 2},
                         {valid_steps({100, 200}), valid_steps({100, 200}), valid_steps({100, 200}),
                          valid_steps({100}), valid_steps({100, 200}), valid_steps({100, 200})});
  ASSERT_EQ(got.size(), 6u);
  ASSERT_EQ(got[0].step, std::optional<std::int64_t>(100));
  ASSERT_EQ(got[0].passed_over.size(), 1u);
  EXPECT_TRUE(got[0].passed_over[0].starts_with("step 200: held by 5 of 6 ranks"))
      << got[0].passed_over[0];
  EXPECT_TRUE(contains(got[0].passed_over[0], "west/2 has no checkpoint at step 200"))
      << got[0].passed_over[0];
}

TEST(ResumeAgreement, NoCommonStepGivesNulloptOnEveryRank) {
  const auto got = agree(
      2, 2, {valid_steps({100}), valid_steps({200}), valid_steps({100, 200}), valid_steps({})});
  EXPECT_FALSE(got[0].step.has_value());
  ASSERT_EQ(got[0].passed_over.size(), 2u);
  EXPECT_TRUE(contains(got[0].passed_over[0], "west/1 has no valid checkpoint at all"))
      << got[0].passed_over[0];
}

// Real checkpoint directories: every rank saved steps 100 and 200, but west/1's step 200 is
// corrupt (a flipped bit) and east/1's step 200 is partial (cut short): all resume from 100.
TEST(ResumeAgreement, CorruptNewestFileFallsBackToTheOlderCommonStep) {
  const fs::path root = fs::temp_directory_path() / ("desloc_resume_" + std::to_string(::getpid()));
  fs::remove_all(root);
  train::Checkpoint ck;
  ck.sites.resize(1);
  ck.sites[0].params.assign(1000, 1.0f);
  ck.sites[0].u.assign(1000, 0.0f);
  ck.sites[0].v.assign(1000, 0.0f);
  std::vector<train::CheckpointScan> scans;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string dir = (root / std::to_string(rank)).string();
    fs::create_directories(dir);
    for (std::int64_t step : {100, 200}) {
      ck.step = step;
      train::save_checkpoint(train::checkpoint_path(dir, step), ck);
    }
    const std::string newest = train::checkpoint_path(dir, 200);
    auto bytes = read_file(newest);
    if (rank == 3) bytes[bytes.size() / 2] ^= 0x01;
    if (rank == 1) bytes.resize(bytes.size() - 7);
    std::ofstream(newest, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    scans.push_back(train::scan_checkpoints(dir));
  }
  fs::remove_all(root);
  ASSERT_EQ(scans[3].rejected.size(), 1u);
  const auto got = agree(2, 2, scans);
  ASSERT_EQ(got[0].step, std::optional<std::int64_t>(100));
  ASSERT_EQ(got[0].passed_over.size(), 1u);
  const std::string& line = got[0].passed_over[0];
  EXPECT_TRUE(line.starts_with("step 200: held by 2 of 4 ranks")) << line;
  EXPECT_TRUE(contains(line, "west/1 has it but rejected it (is corrupt: payload CRC32C mismatch)"))
      << line;
  EXPECT_TRUE(contains(line, "east/1 has it but rejected it (is truncated: the header promises"))
      << line;
  EXPECT_TRUE(contains(line, "payload bytes but")) << line;  // the reason arrives whole
}

// A rank offers only its 64 newest valid steps: an older step every rank holds is not chosen,
// and the message says why.
TEST(ResumeAgreement, OffersAtMostTheNewest64Steps) {
  std::vector<std::int64_t> many;
  for (std::int64_t s = 1; s <= 70; ++s) many.push_back(s * 10);
  const auto got = agree(2, 1, {valid_steps(many), valid_steps({10, 700})});
  EXPECT_EQ(got[0].step, std::optional<std::int64_t>(700));
  const auto older = agree(2, 1, {valid_steps(many), valid_steps({10})});
  EXPECT_FALSE(older[0].step.has_value());
  ASSERT_FALSE(older[0].passed_over.empty());
  // 65 steps (east/0's 700..70 and west/0's 10) are passed over: 8 lines, then a count.
  EXPECT_EQ(older[0].passed_over.size(), 9u);
  EXPECT_TRUE(contains(older[0].passed_over.back(), "57 older")) << older[0].passed_over.back();
}

// Odd and degenerate world shapes: one rank alone (no site group, a WAN group of 1), one site
// of 3 ranks, 3 sites of 1 rank, 3 sites of 2. Ranks hold steps {rank+1 .. 8} x 10, so the
// newest common step is 80 and the oldest rank's steps decide nothing else.
class ResumeAgreementShapes : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(ResumeAgreementShapes, AllRanksAgree) {
  const auto [S, R] = GetParam();
  std::vector<train::CheckpointScan> scans;
  for (int i = 0; i < S * R; ++i) {
    std::vector<std::int64_t> steps;
    for (int k = i + 1; k <= 8; ++k) steps.push_back(k * 10);
    if (i == S * R - 1) steps.erase(steps.end() - 1);  // the last rank lacks 80
    if (i == 0) steps.push_back(90);                   // the first rank alone has 90
    scans.push_back(valid_steps(steps));
  }
  const auto got = agree(S, R, scans);
  const std::int64_t expect = S * R == 1 ? 90 : 70;
  EXPECT_EQ(got[0].step, std::optional<std::int64_t>(expect));
  EXPECT_EQ(got[0].passed_over.size(), S * R == 1 ? 0u : 2u);
}

INSTANTIATE_TEST_SUITE_P(SitesByRanks, ResumeAgreementShapes,
                         ::testing::Values(std::make_pair(1, 1), std::make_pair(1, 3),
                                           std::make_pair(3, 1), std::make_pair(3, 2)),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "x" +
                                  std::to_string(info.param.second);
                         });
