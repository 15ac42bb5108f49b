// The M-worker trainer on the Brown corpus: DES-LOC with equal periods is Local Adam bit for
// bit, one worker is single-site training bit for bit, phases and byte counts in the metrics
// follow the config, resume is bit-exact with several workers, and an elastic join works.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>

#include "desloc/sync/sync_policy.hpp"
#include "desloc/train/checkpoint.hpp"
#include "desloc/train/trainer.hpp"
#include "test_env.hpp"

using namespace desloc;
using desloc::test::fresh_dir;

namespace {
train::JobConfig job(const std::filesystem::path& out, const std::string& sync_toml,
                     std::int64_t steps = 12) {
  std::string text = test::tiny_job_toml(out) + "[sync]\n" + sync_toml;
  text = std::regex_replace(text, std::regex("steps = 20"), "steps = " + std::to_string(steps));
  return train::parse_config(text, (out / "job.toml").string());
}
train::Checkpoint final_state(const train::JobConfig& cfg) {
  return train::load_checkpoint(
      train::checkpoint_path(train::checkpoint_dir(cfg), cfg.train.steps));
}
std::vector<std::string> field_per_step(const std::filesystem::path& metrics,
                                        const std::string& field) {
  std::ifstream in(metrics);
  std::string line;
  std::vector<std::string> out;
  const std::regex re("\"" + field + "\":\"?([^,\"}]*)");
  while (std::getline(in, line)) {
    if (line.find("\"type\":\"train\"") == std::string::npos) continue;
    std::smatch m;
    out.push_back(std::regex_search(line, m, re) ? m[1].str() : "<missing>");
  }
  return out;
}
}  // namespace

class SyncTrainer : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(test::have_prepared_corpus()); }
};

TEST_F(SyncTrainer, DeslocWithEqualPeriodsIsLocalAdamBitwise) {
  const auto a =
      job(fresh_dir("desloc_eq"), "method = \"desloc\"\nworkers = 3\nkx = 4\nku = 4\nkv = 4\n");
  const auto b = job(fresh_dir("local_adam"), "method = \"local_adam\"\nworkers = 3\nkx = 4\n");
  train::run_training(a, {.progress = 0});
  train::run_training(b, {.progress = 0});
  test::expect_bitwise_equal(final_state(a), final_state(b));
  // ... and the workers really synchronised: all three replicas hold the same x after t = 12.
  const auto s = final_state(a);
  EXPECT_NE(s.sites[0].params, s.sites[1].params)
      << "x was averaged at t=12, then each worker stepped locally";
}

// Hierarchical DES-LOC (issue 15, item 2): regions [[A, B], [C, D]] with region_kx = 2 under
// kx = 4 train neither like flat DES-LOC at kx = 2 nor at kx = 4, and their wide-area bytes lie
// between the two: the region averages cross 2-site rings (1x the payload per average, against
// 1.5x over all four sites). Which sites each average mixes is RegionalAverager's unit test.
constexpr const char* kFourSites = "[job]\nsites = [\"A\", \"B\", \"C\", \"D\"]\n";
TEST_F(SyncTrainer, RegionsTrainBetweenFlatDeslocAtTheirTwoPeriodsAndSendBytesInBetween) {
  const auto regional =
      job(fresh_dir("regions"), std::string("method = \"desloc\"\nkx = 4\nregion_kx = 2\n") +
                                    kFourSites + "regions = [[\"A\", \"B\"], [\"C\", \"D\"]]\n");
  const auto fast =
      job(fresh_dir("flat2"), std::string("method = \"desloc\"\nkx = 2\n") + kFourSites);
  const auto slow =
      job(fresh_dir("flat4"), std::string("method = \"desloc\"\nkx = 4\n") + kFourSites);
  const auto r = train::run_training(regional, {.progress = 0});
  const auto f = train::run_training(fast, {.progress = 0});
  const auto l = train::run_training(slow, {.progress = 0});
  EXPECT_NE(final_state(regional).sites[0].params, final_state(fast).sites[0].params);
  EXPECT_NE(final_state(regional).sites[0].params, final_state(slow).sites[0].params);
  EXPECT_LT(r.bytes_sent_per_site, f.bytes_sent_per_site);
  EXPECT_GT(r.bytes_sent_per_site, l.bytes_sent_per_site);
  // Per level in the metrics: at step 2 only the regions averaged (x: 2-site rings), at 4 all.
  const auto region =
      field_per_step(regional.train.out_dir + "/metrics.jsonl", "region_bytes_sent");
  const auto job_wide = field_per_step(regional.train.out_dir + "/metrics.jsonl", "bytes_sent");
  ASSERT_GE(region.size(), 4u);
  EXPECT_NE(region[1], "0");
  EXPECT_EQ(job_wide[1], "0");
  EXPECT_EQ(region[3], region[1]) << "step 4's x average spans every site";
  EXPECT_NE(job_wide[3], "0");
}

// One region holding every site in the ring's order: the region averages are the job-wide ones,
// so the run equals flat DES-LOC at the region's periods bit for bit, with the same bytes. At
// the default two lanes a region of four sites sends half of each shard round the reversed
// ring, as the flat ring does; with one lane the sums run in another order, and the run
// differs.
TEST_F(SyncTrainer, OneRegionOfEverySiteIsFlatDeslocAtTheRegionPeriods) {
  const std::string one_lane = "[transport]\nlanes = 1\n";
  const std::string regions =
      kFourSites + std::string("regions = [[\"A\", \"B\", \"C\", \"D\"]]\n");
  const auto regional =
      job(fresh_dir("one_region"), "method = \"desloc\"\nkx = 4\nregion_kx = 2\n" + regions);
  const auto flat =
      job(fresh_dir("flat"), std::string("method = \"desloc\"\nkx = 2\n") + kFourSites);
  const auto one = job(fresh_dir("one_region_one_lane"),
                       "method = \"desloc\"\nkx = 4\nregion_kx = 2\n" + regions + one_lane);
  const auto a = train::run_training(regional, {.progress = 0});
  const auto b = train::run_training(flat, {.progress = 0});
  train::run_training(one, {.progress = 0});
  test::expect_bitwise_equal(final_state(regional), final_state(flat));
  EXPECT_EQ(a.last_val_loss, b.last_val_loss);
  EXPECT_EQ(a.bytes_sent_per_site, b.bytes_sent_per_site);
  EXPECT_NE(final_state(one).sites[0].params, final_state(regional).sites[0].params)
      << "one lane sums in another order than two";
}

// sync.overlap = "step" starts a step's averages of x, u and v before its gradient and
// finishes them before its update: the same numbers as the blocking step, bit for bit, for
// every method that averages states (the outer step and favg_reset's zeroing included).
TEST_F(SyncTrainer, OverlappedAveragesEqualBlockingOnesBitwise) {
  for (const std::string method :
       {"method = \"desloc\"\nkx = 2\nphase_u = 1\n", "method = \"local_adam\"\nkx = 3\n",
        "method = \"favg_reset\"\nkx = 2\n",
        "method = \"desloc\"\nkx = 2\nouter = \"nesterov\"\n"}) {
    const auto blocking = job(fresh_dir("blocking"), method + "workers = 3\n");
    const auto overlap = job(fresh_dir("overlap"), method + "workers = 3\noverlap = \"step\"\n");
    const auto a = train::run_training(blocking, {.progress = 0});
    const auto b = train::run_training(overlap, {.progress = 0});
    test::expect_bitwise_equal(final_state(blocking), final_state(overlap));
    EXPECT_EQ(a.last_val_loss, b.last_val_loss) << method;
    EXPECT_EQ(a.bytes_sent_per_site, b.bytes_sent_per_site) << method;
    EXPECT_GT(b.bytes_sent_per_site, 0u) << method;
  }
}

// sync.overlap = "delayed": averages folded tau steps after they started change the numbers
// (not the bytes), and a run stopped at a checkpoint and resumed equals the straight run with
// the same checkpoints bit for bit (a checkpoint drains what is in flight).
TEST_F(SyncTrainer, DelayedAveragesMoveTheSameBytesAndResumeBitExact) {
  const std::string base = "method = \"desloc\"\nkx = 4\nkv = 6\nworkers = 3\n";
  const std::string delayed = base + "overlap = \"delayed\"\ndelay = 2\ndelay_v = 5\n";
  const auto blocking = job(fresh_dir("d_blocking"), base, 14);
  auto straight_ck = job(fresh_dir("d_straight"), delayed, 14);
  auto resumed = job(fresh_dir("d_resumed"), delayed, 14);
  straight_ck.train.checkpoint_every = resumed.train.checkpoint_every = 7;
  const auto a = train::run_training(blocking, {.progress = 0});
  const auto b = train::run_training(straight_ck, {.progress = 0});
  train::run_training(resumed, {.stop_after = 7, .progress = 0});
  const auto c = train::run_training(resumed, {.resume = true, .progress = 0});
  test::expect_bitwise_equal(final_state(straight_ck), final_state(resumed));
  EXPECT_EQ(b.last_val_loss, c.last_val_loss);
  EXPECT_EQ(a.bytes_sent_per_site, b.bytes_sent_per_site);
  EXPECT_NE(final_state(blocking).sites[0].params, final_state(straight_ck).sites[0].params);
  EXPECT_TRUE(std::isfinite(b.last_val_loss));
  // Without the checkpoint at step 7 the average of v started at step 6 is folded at step 11
  // instead of drained at step 7: other numbers.
  auto uncheckpointed = job(fresh_dir("d_uncheckpointed"), delayed, 14);
  uncheckpointed.train.checkpoint_every = 0;
  train::run_training(uncheckpointed, {.progress = 0});
  EXPECT_NE(final_state(uncheckpointed).sites[0].v, final_state(straight_ck).sites[0].v);
}

// sync.fragments: the averages cut into staggered fragments move the same bytes as whole ones
// over the periods, the step-overlapped engine equals the blocking one bit for bit, and
// streaming (fragments with delayed averages) resumes bit-exact from a checkpoint.
TEST_F(SyncTrainer, FragmentsMoveTheSameBytesOverlapExactlyAndStreamingResumesBitExact) {
  const std::string base = "method = \"desloc\"\nkx = 4\nkv = 6\nworkers = 3\n";
  const std::string frag = base + "fragments = 2\n";
  const auto whole = job(fresh_dir("f_whole"), base, 12);
  const auto blocking = job(fresh_dir("f_blocking"), frag, 12);
  const auto overlap = job(fresh_dir("f_overlap"), frag + "overlap = \"step\"\n", 12);
  const auto a = train::run_training(whole, {.progress = 0});
  const auto b = train::run_training(blocking, {.progress = 0});
  const auto c = train::run_training(overlap, {.progress = 0});
  // Over 12 steps x, u and v are averaged 3, 1 and 2 times whole, or as often per fragment.
  EXPECT_EQ(a.bytes_sent_per_site, b.bytes_sent_per_site);
  EXPECT_NE(final_state(whole).sites[0].params, final_state(blocking).sites[0].params);
  test::expect_bitwise_equal(final_state(blocking), final_state(overlap));
  EXPECT_EQ(b.last_val_loss, c.last_val_loss);

  const std::string streaming = frag + "overlap = \"delayed\"\ndelay = 3\ndelay_v = 5\n";
  auto straight = job(fresh_dir("f_straight"), streaming, 14);
  auto resumed = job(fresh_dir("f_resumed"), streaming, 14);
  straight.train.checkpoint_every = resumed.train.checkpoint_every = 7;
  const auto d = train::run_training(straight, {.progress = 0});
  train::run_training(resumed, {.stop_after = 7, .progress = 0});
  const auto e = train::run_training(resumed, {.resume = true, .progress = 0});
  test::expect_bitwise_equal(final_state(straight), final_state(resumed));
  EXPECT_EQ(d.last_val_loss, e.last_val_loss);
  EXPECT_TRUE(std::isfinite(d.last_val_loss));

  // Streaming with the outer step (Streaming DiLoCo's form): its reference and momentum move
  // at each fragment's fold, and the checkpoint, written after the folds in flight, resumes
  // bit-exact.
  const std::string diloco = streaming + "outer = \"nesterov\"\n";
  auto outer_straight = job(fresh_dir("f_outer_straight"), diloco, 14);
  auto outer_resumed = job(fresh_dir("f_outer_resumed"), diloco, 14);
  outer_straight.train.checkpoint_every = outer_resumed.train.checkpoint_every = 7;
  const auto f = train::run_training(outer_straight, {.progress = 0});
  train::run_training(outer_resumed, {.stop_after = 7, .progress = 0});
  const auto g = train::run_training(outer_resumed, {.resume = true, .progress = 0});
  test::expect_bitwise_equal(final_state(outer_straight), final_state(outer_resumed));
  EXPECT_EQ(f.last_val_loss, g.last_val_loss);
  EXPECT_NE(final_state(outer_straight).sites[0].params, final_state(straight).sites[0].params)
      << "the outer step changed nothing";
  EXPECT_FALSE(final_state(outer_straight).outer_momentum.empty());
}

// sync.codec_*: compressed averages send fewer bytes, stay within reach of the fp32 run, overlap
// exactly, and resume bit-exact (references and error feedback are in the checkpoint), also
// when streaming.
TEST_F(SyncTrainer, CompressedAveragesSendFewerBytesOverlapExactlyAndResumeBitExact) {
  const std::string base = "method = \"desloc\"\nkx = 4\nkv = 6\nworkers = 3\n";
  const std::string codec =
      base + "codec_x = \"int8\"\ncodec_u = \"int4\"\ncodec_v = \"int8\"\nerror_feedback = true\n";
  const auto fp32 = job(fresh_dir("c_fp32"), base, 12);
  const auto blocking = job(fresh_dir("c_blocking"), codec, 12);
  const auto overlap = job(fresh_dir("c_overlap"), codec + "overlap = \"step\"\n", 12);
  const auto a = train::run_training(fp32, {.progress = 0});
  const auto b = train::run_training(blocking, {.progress = 0});
  const auto c = train::run_training(overlap, {.progress = 0});
  // The ring of encoded segments sends 2(S-1)/S of 1.06 bytes a value for int8 (blocks of 64,
  // scales included) and 0.56 for int4, against fp32's 4: at most 0.27x of fp32's bytes.
  EXPECT_LT(double(b.bytes_sent_per_site), 0.27 * double(a.bytes_sent_per_site));
  EXPECT_GT(b.bytes_sent_per_site, 0u);
  EXPECT_NE(final_state(fp32).sites[0].params, final_state(blocking).sites[0].params);
  EXPECT_NEAR(a.last_val_loss, b.last_val_loss, 0.02 * a.last_val_loss);
  test::expect_bitwise_equal(final_state(blocking), final_state(overlap));
  EXPECT_EQ(b.last_val_loss, c.last_val_loss);

  for (const std::string& mode :
       {std::string(""),
        std::string("overlap = \"delayed\"\ndelay = 3\ndelay_v = 5\nfragments = 2\n")}) {
    auto straight = job(fresh_dir("c_straight"), codec + mode, 14);
    auto resumed = job(fresh_dir("c_resumed"), codec + mode, 14);
    straight.train.checkpoint_every = resumed.train.checkpoint_every = 7;
    const auto d = train::run_training(straight, {.progress = 0});
    train::run_training(resumed, {.stop_after = 7, .progress = 0});
    const auto e = train::run_training(resumed, {.resume = true, .progress = 0});
    test::expect_bitwise_equal(final_state(straight), final_state(resumed));
    EXPECT_EQ(d.last_val_loss, e.last_val_loss) << mode;
    EXPECT_FALSE(final_state(straight).codec_ref[1].empty());
  }
}

TEST_F(SyncTrainer, OneWorkerIsSingleSiteTrainingBitwise) {
  const auto single = job(fresh_dir("single"), "method = \"none\"\n");
  const auto desloc = job(fresh_dir("desloc_m1"), "method = \"desloc\"\nworkers = 1\nkx = 2\n");
  const auto r1 = train::run_training(single, {.progress = 0});
  const auto r2 = train::run_training(desloc, {.progress = 0});
  test::expect_bitwise_equal(final_state(single), final_state(desloc));
  EXPECT_EQ(r1.last_train_loss, r2.last_train_loss);
  EXPECT_EQ(r1.last_val_loss, r2.last_val_loss);
  EXPECT_EQ(r2.bytes_sent_per_site, 0u);
}

TEST_F(SyncTrainer, PhasesAndBytesInMetricsFollowTheConfig) {
  const auto dir = fresh_dir("phases");
  const auto cfg = job(dir,
                       "method = \"desloc\"\nworkers = 2\nkx = 4\nku = 6\nkv = 8\nphase_x = "
                       "1\nphase_u = 2\nphase_v = 7\n",
                       16);
  train::run_training(cfg, {.progress = 0});
  const auto synced = field_per_step(dir / "metrics.jsonl", "synced");
  const sync::SyncPolicy policy(cfg.sync);
  ASSERT_EQ(synced.size(), 16u);
  std::uint64_t x = 0, u = 0, v = 0;
  for (std::int64_t t = 1; t <= 16; ++t) {
    const auto d = policy.at(t);
    const std::string expect = std::string(d.x ? "x" : "") + (d.u ? "u" : "") + (d.v ? "v" : "");
    EXPECT_EQ(synced[static_cast<std::size_t>(t - 1)], expect) << "step " << t;
    x += d.x;
    u += d.u;
    v += d.v;
  }
  EXPECT_EQ(x, 4u);  // t = 1, 5, 9, 13
  EXPECT_EQ(u, 3u);  // t = 2, 8, 14
  EXPECT_EQ(v, 2u);  // t = 7, 15
  // Two workers: a ring all-reduce sends 2(M-1)/M = 1 payload per average.
  const auto state = final_state(cfg);
  const std::uint64_t model_bytes = state.sites[0].params.size() * sizeof(float);
  const auto sent = field_per_step(dir / "metrics.jsonl", "bytes_sent");
  EXPECT_EQ(std::stoull(sent.back()), (x + u + v) * model_bytes);
}

TEST_F(SyncTrainer, DdpMovesOneModelPerStepAndKeepsReplicasIdentical) {
  const auto dir = fresh_dir("ddp");
  const auto cfg = job(dir, "method = \"ddp\"\nworkers = 3\n", 6);
  const auto r = train::run_training(cfg, {.progress = 0});
  const auto s = final_state(cfg);
  EXPECT_EQ(s.sites[0].params, s.sites[1].params);
  EXPECT_EQ(s.sites[1].params, s.sites[2].params);
  const std::uint64_t model_bytes = s.sites[0].params.size() * sizeof(float);
  EXPECT_EQ(r.bytes_sent_per_site, 6 * (model_bytes * 2 * 2 / 3));  // 2(M-1)/M per average
}

// Unequal sites ([[job.site]]: 3 ranks of 2 sequences, 1 of 4, 2 of 3) in one process: DDP
// keeps every replica equal, each site reads its own ranks' partitions, and a DES-LOC run with
// the outer step resumes bit for bit (each site's loaders restored from the checkpoint).
static std::string unequal_job(const std::filesystem::path& out, const std::string& sync_toml,
                               std::int64_t steps) {
  std::string text = test::tiny_job_toml(out);
  text.replace(text.find("\nbatch = 4\n"), 11, "\n");
  text = std::regex_replace(text, std::regex("steps = 20"), "steps = " + std::to_string(steps));
  return text + "[sync]\n" + sync_toml +
         "[[job.site]]\nname = \"west\"\nranks = 3\nbatch = 2\n"
         "[[job.site]]\nname = \"east\"\nranks = 1\nbatch = 4\n"
         "[[job.site]]\nname = \"north\"\nranks = 2\nbatch = 3\n";
}

TEST_F(SyncTrainer, UnequalSitesTrainWithDdpAndResumeBitExact) {
  const auto ddp_dir = fresh_dir("unequal_ddp");
  const auto ddp = train::parse_config(unequal_job(ddp_dir, "method = \"ddp\"\n", 4), "ddp.toml");
  const auto r = train::run_training(ddp, {.progress = 0});
  EXPECT_EQ(r.sites, 3);
  const auto s = final_state(ddp);
  EXPECT_EQ(s.sites[0].params, s.sites[1].params);
  EXPECT_EQ(s.sites[1].params, s.sites[2].params);
  // Each site's ranks read their own partitions: the loaders moved by its own batch.
  EXPECT_EQ(s.sites[0].loader.cursor, 4u * 2);
  EXPECT_EQ(s.sites[1].loader.cursor, 4u * 4);
  EXPECT_EQ(s.sites[2].loader.cursor, 4u * 3);

  const std::string sync = "method = \"desloc\"\nkx = 3\nouter = \"nesterov\"\n";
  const auto straight =
      train::parse_config(unequal_job(fresh_dir("unequal_straight"), sync, 14), "straight.toml");
  const auto resumed =
      train::parse_config(unequal_job(fresh_dir("unequal_resumed"), sync, 14), "resumed.toml");
  train::run_training(straight, {.progress = 0});
  train::run_training(resumed, {.stop_after = 7, .progress = 0});
  train::run_training(resumed, {.resume = true, .progress = 0});
  test::expect_bitwise_equal(final_state(straight), final_state(resumed));
}

TEST_F(SyncTrainer, ResumeWithSeveralWorkersIsBitExact) {
  const std::string sync = "method = \"desloc\"\nworkers = 2\nkx = 3\nouter = \"nesterov\"\n";
  const auto straight = job(fresh_dir("m_straight"), sync, 14);
  const auto resumed = job(fresh_dir("m_resumed"), sync, 14);
  train::run_training(straight, {.progress = 0});
  train::run_training(resumed, {.stop_after = 7, .progress = 0});
  train::run_training(resumed, {.resume = true, .progress = 0});
  test::expect_bitwise_equal(final_state(straight), final_state(resumed));
  EXPECT_FALSE(final_state(resumed).outer_ref.empty());
}

TEST_F(SyncTrainer, ElasticJoinStartsNewWorkersFromTheAverage) {
  const auto dir = fresh_dir("join");
  const auto cfg =
      job(dir, "method = \"desloc\"\nworkers = 2\nkx = 4\njoin_step = 6\njoin_workers = 4\n", 10);
  const auto r = train::run_training(cfg, {.progress = 0});
  EXPECT_EQ(r.sites, 4);
  EXPECT_EQ(final_state(cfg).sites.size(), 4u);
  std::ifstream in(dir / "metrics.jsonl");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The first sync at or after step 6 is the x average at t = 8: the join happens before it.
  EXPECT_NE(text.find(R"({"type":"join","step":7,"workers_before":2,"workers_after":4})"),
            std::string::npos)
      << text;
  EXPECT_TRUE(std::isfinite(r.last_val_loss));
  // Per-worker bytes: the newcomers (workers 2, 3) missed the averages before step 8.
  const std::regex last_record(
      R"re("step":10,.*"bytes_sent_by_worker":\[(\d+),(\d+),(\d+),(\d+)\])re");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, last_record)) << text;
  EXPECT_EQ(m[1].str(), m[2].str());
  EXPECT_EQ(m[3].str(), m[4].str());
  EXPECT_GT(std::stoull(m[1].str()), std::stoull(m[3].str()));
}
