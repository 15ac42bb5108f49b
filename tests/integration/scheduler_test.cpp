// desloc started by the schedulers users already run, for real: Open MPI's `mpirun` and a
// one-node Slurm cluster from Debian's packages (scripts/slurm_local.sh: munged, slurmctld and
// slurmd on loopback, started and torn down by each test). A 2-site x 2-rank job started by
// `mpirun`, by `srun` and by the sbatch example (scripts/desloc.sbatch) ends bit for bit as
// `desloc launch` of the same config ends; a rank that dies under `srun` is reported like any
// other failed rank, and the other sites finish. docs/cluster.md.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cluster_env.hpp"
#include "desloc/train/checkpoint.hpp"
#include "http_env.hpp"
#include "test_env.hpp"

namespace desloc::test {
namespace {

using namespace std::chrono_literals;

// Every rank of two runs of one job (a and b: run directories, the leader's at the top and the
// others under ranks/<site>-<r>) ended bit for bit alike: losses at every step, and x, u, v and
// the optimizer step of the checkpoint at `step`.
void expect_ranks_match(const fs::path& a_root, const fs::path& b_root,
                        const std::vector<std::string>& sites, const std::vector<int>& ranks,
                        std::int64_t step) {
  for (std::size_t s = 0; s < sites.size(); ++s)
    for (int r = 0; r < ranks.at(s); ++r) {
      const fs::path sub =
          s == 0 && r == 0 ? fs::path() : fs::path("ranks") / (sites[s] + "-" + std::to_string(r));
      const fs::path a_dir = a_root / sub, b_dir = b_root / sub;
      EXPECT_EQ(train_field(b_dir / "metrics.jsonl", "loss_by_site"),
                train_field(a_dir / "metrics.jsonl", "loss_by_site"))
          << sites[s] << "/" << r;
      const auto a =
          train::load_checkpoint(train::checkpoint_path((a_dir / "checkpoints").string(), step));
      const auto b =
          train::load_checkpoint(train::checkpoint_path((b_dir / "checkpoints").string(), step));
      ASSERT_EQ(a.sites.size(), 1u);
      ASSERT_EQ(b.sites.size(), 1u);
      const auto& x = a.sites[0];
      const auto& y = b.sites[0];
      ASSERT_EQ(x.params.size(), y.params.size());
      const std::size_t bytes = x.params.size() * sizeof(float);
      EXPECT_EQ(0, std::memcmp(x.params.data(), y.params.data(), bytes)) << sites[s] << "/" << r;
      EXPECT_EQ(0, std::memcmp(x.u.data(), y.u.data(), bytes)) << sites[s] << "/" << r;
      EXPECT_EQ(0, std::memcmp(x.v.data(), y.v.data(), bytes)) << sites[s] << "/" << r;
      EXPECT_EQ(x.optim_t, y.optim_t);
    }
}

// The job `toml` (in dir/job.toml) run twice: by `desloc launch` into dir/launch, and by `world`
// `desloc worker`s under mpirun into dir/mpi, against a coordinator of its own. As a user runs
// it (docs/cluster.md); --allow-run-as-root for containers that run as root, --oversubscribe
// for more ranks than cores.
void run_launch_and_mpirun(const fs::path& dir, const std::string& toml, int world) {
  const fs::path cfg = write_text(dir / "job.toml", toml);
  const auto launched = run_command(std::string(DESLOC_CLI) + " launch --config " + cfg.string());
  ASSERT_EQ(launched.exit_code, 0) << launched.output;
  Cluster c{dir};
  c.start(cfg);
  Process mpi = Process::start(
      {"/usr/bin/mpirun", "--allow-run-as-root", "--oversubscribe", "-n", std::to_string(world),
       DESLOC_CLI, "worker", "--config", cfg.string(), "--coordinator",
       "127.0.0.1:" + std::to_string(c.port), "--out-dir", (dir / "mpi").string(), "--no-progress"},
      dir / "mpirun.log");
  ASSERT_EQ(mpi.wait(std::chrono::seconds(180)), 0) << mpi.output();
  EXPECT_EQ(c.coordinator.wait(std::chrono::seconds(30)), 0) << c.coordinator.output();
}

TEST(Scheduler, MpirunRunsTheJobAsLaunchDoesBitForBit) {
  const char* mpirun = "/usr/bin/mpirun";
  DESLOC_REQUIRE_PROGRAM(mpirun, "openmpi-bin");
  const fs::path dir = fresh_dir("mpirun");
  const std::vector<std::string> sites = {"west", "east"};
  std::string toml = with_steps(multi_site_toml(dir / "launch", "\"west\", \"east\"", 2), 12);
  toml.replace(toml.find("[job]\n"), 6, "[job]\ntoken = \"mpirun-test\"\n");
  run_launch_and_mpirun(dir, toml, 4);
  if (HasFatalFailure()) return;
  expect_ranks_match(dir / "launch", dir / "mpi", sites, {2, 2}, 12);
}

// Sites of unequal rank counts under mpirun: west 1 rank (batch 4), east 2 (batch 3). Global
// ranks count each site's ranks in job.sites order (0 is west/0, 1 and 2 east/0 and east/1),
// and the job equals `desloc launch`'s bit for bit.
TEST(Scheduler, MpirunRunsSitesOfUnequalRankCountsAsLaunchDoesBitForBit) {
  const char* mpirun = "/usr/bin/mpirun";
  DESLOC_REQUIRE_PROGRAM(mpirun, "openmpi-bin");
  const fs::path dir = fresh_dir("mpirun_unequal");
  const std::vector<std::string> sites = {"west", "east"};
  std::string toml = with_steps(multi_site_toml(dir / "launch", "\"west\", \"east\"", 1), 12);
  const std::string shorthand = "sites = [\"west\", \"east\"]\nranks_per_site = 1\n";
  toml.erase(toml.find(shorthand), shorthand.size());
  toml.replace(toml.find("\nbatch = 4\n"), 11, "\n");
  toml.replace(toml.find("[job]\n"), 6, "[job]\ntoken = \"mpirun-test\"\n");
  toml +=
      "[[job.site]]\nname = \"west\"\nranks = 1\nbatch = 4\n"
      "[[job.site]]\nname = \"east\"\nranks = 2\nbatch = 3\n";
  run_launch_and_mpirun(dir, toml, 3);
  if (HasFatalFailure()) return;
  expect_ranks_match(dir / "launch", dir / "mpi", sites, {1, 2}, 12);
}

// A one-node Slurm cluster for one test, on loopback, its files in the test's directory.
class Slurm : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* p : {"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd",
                          "/usr/bin/srun", "/usr/bin/sbatch", "/usr/bin/sinfo"})
      DESLOC_REQUIRE_PROGRAM(p, "munge, slurmctld, slurmd and slurm-client");
    if (::geteuid() != 0) {
      if (under_ci()) FAIL() << "the Slurm tests need root (slurmd runs the tasks)";
      GTEST_SKIP() << "the Slurm tests need root (slurmd runs the tasks)";
    }
    dir_ = fresh_dir("slurm");
    // Short: slurmd's step sockets live under it, and a Unix socket path has 108 bytes.
    char cluster[] = "/tmp/dslurm.XXXXXX";
    ASSERT_NE(::mkdtemp(cluster), nullptr);
    cluster_ = cluster;
    const auto up = run_command(std::string(DESLOC_SOURCE_DIR) + "/scripts/slurm_local.sh up '" +
                                cluster_.string() + "' < /dev/null");
    ASSERT_EQ(up.exit_code, 0) << up.output;
    up_ = true;
    ::setenv("SLURM_CONF", (cluster_ / "slurm.conf").c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("SLURM_CONF");
    if (up_)
      run_command(std::string(DESLOC_SOURCE_DIR) + "/scripts/slurm_local.sh down '" +
                  cluster_.string() + "' < /dev/null");
    if (!cluster_.empty()) {
      std::error_code ignored;
      if (HasFailure()) {  // keep its logs beside the test's files
        fs::copy(cluster_ / "log", dir_ / "slurm-logs", fs::copy_options::recursive, ignored);
      }
      fs::remove_all(cluster_, ignored);
    }
  }
  // A 2 x 2 job of `steps` with its token in the config, and `desloc launch`'s run of it.
  fs::path reference_job(int steps) {
    std::string toml = with_steps(multi_site_toml(dir_ / "launch", "\"west\", \"east\"", 2), steps);
    toml.replace(toml.find("[job]\n"), 6, "[job]\ntoken = \"slurm-test\"\n");
    const fs::path cfg = write_text(dir_ / "job.toml", toml);
    const auto launched = run_command(std::string(DESLOC_CLI) + " launch --config " + cfg.string());
    EXPECT_EQ(launched.exit_code, 0) << launched.output;
    return cfg;
  }
  fs::path dir_, cluster_;
  bool up_ = false;
};

TEST_F(Slurm, SrunRunsTheJobAsLaunchDoesBitForBit) {
  const fs::path cfg = reference_job(12);
  Cluster c{dir_};
  c.start(cfg);
  // As a user runs it (docs/cluster.md); --oversubscribe for four tasks on fewer cores.
  Process srun = Process::start(
      {"/usr/bin/srun", "-n", "4", "--oversubscribe", DESLOC_CLI, "worker", "--config",
       cfg.string(), "--coordinator", "127.0.0.1:" + std::to_string(c.port), "--out-dir",
       (dir_ / "srun").string(), "--no-progress"},
      dir_ / "srun.log");
  ASSERT_EQ(srun.wait(180s), 0) << srun.output();
  EXPECT_EQ(c.coordinator.wait(30s), 0) << c.coordinator.output();
  expect_ranks_match(dir_ / "launch", dir_ / "srun", {"west", "east"}, {2, 2}, 12);
}

TEST_F(Slurm, TheSbatchExampleRunsTheJobAsLaunchDoesBitForBit) {
  const fs::path cfg = reference_job(12);
  const auto r = run_command(
      "cd '" + dir_.string() + "' && DESLOC=" + DESLOC_CLI +
      " DESLOC_COORD_HOST=127.0.0.1 timeout 300 /usr/bin/sbatch --wait --ntasks=4 --oversubscribe "
      "--output=sbatch.out " +
      std::string(DESLOC_SOURCE_DIR) + "/scripts/desloc.sbatch " + cfg.string() + " --out-dir " +
      (dir_ / "sbatch").string() + " --no-progress");
  std::ifstream out(dir_ / "sbatch.out");
  const std::string log((std::istreambuf_iterator<char>(out)), {});
  ASSERT_EQ(r.exit_code, 0) << r.output << "\n" << log;
  EXPECT_TRUE(contains(log, "desloc.sbatch: coordinator on 127.0.0.1:")) << log;
  expect_ranks_match(dir_ / "launch", dir_ / "sbatch", {"west", "east"}, {2, 2}, 12);
}

// The pid of a `desloc worker` whose environment holds SLURM_PROCID=`procid`; -1 if none.
pid_t slurm_task(int procid) {
  const std::string want = "SLURM_PROCID=" + std::to_string(procid);
  return find_process([&](pid_t, const fs::path& proc) {
    const auto args = proc_strings(proc / "cmdline");
    if (args.size() < 2 || args[0] != DESLOC_CLI || args[1] != "worker") return false;
    const auto env = proc_strings(proc / "environ");
    return std::find(env.begin(), env.end(), want) != env.end();
  });
}

// A rank the scheduler started dies (SIGKILL) mid-run: the coordinator names it and drops its
// site, as for any failed rank, and the other sites train to the end; srun reports the task.
TEST_F(Slurm, ARankThatDiesUnderSrunIsReportedAndTheOtherSitesFinish) {
  std::string toml =
      with_steps(multi_site_toml(dir_ / "srun", "\"west\", \"east\", \"north\"", 1), 600);
  toml.replace(toml.find("[job]\n"), 6,
               "[job]\ntoken = \"slurm-test\"\nheartbeat_ms = 200\nheartbeat_timeout_ms = "
               "1500\nrecovery_timeout_s = 10\n");
  toml.replace(toml.find("deadline_s = 20"), 15, "deadline_s = 5");
  const fs::path cfg = write_text(dir_ / "job.toml", toml);
  Cluster c{dir_};
  c.start(cfg);
  Process srun = Process::start(
      {"/usr/bin/srun", "-n", "3", "--oversubscribe", DESLOC_CLI, "worker", "--config",
       cfg.string(), "--coordinator", "127.0.0.1:" + std::to_string(c.port), "--no-progress"},
      dir_ / "srun.log");
  const fs::path metrics = dir_ / "srun" / "metrics.jsonl";
  auto leader_step = [&] {
    const auto steps = train_field(metrics, "step");
    return steps.empty() ? 0L : std::stol(steps.back());
  };
  ASSERT_TRUE(eventually([&] { return leader_step() >= 100; }, 120)) << srun.output();
  const pid_t north = slurm_task(2);  // global rank 2: site north, rank 0
  ASSERT_GT(north, 0) << srun.output();
  ::kill(north, SIGKILL);
  const int srun_status = srun.wait(240s);
  EXPECT_NE(srun_status, 0) << "srun hid a task that was killed:\n" << srun.output();
  EXPECT_NE(srun_status, -1) << "srun hung:\n" << srun.output();
  const int coord_status = c.coordinator.wait(60s);
  EXPECT_NE(coord_status, -1) << c.coordinator.output();
  const std::string coord = c.coordinator.output();
  EXPECT_TRUE(contains(coord, "north/0 disconnected")) << coord;
  EXPECT_TRUE(contains(coord, "dropped site(s) [north]")) << coord;
  EXPECT_EQ(leader_step(), 600) << srun.output();
  EXPECT_TRUE(fs::exists(dir_ / "srun" / "ranks" / "east-0" / "checkpoints"));
}

}  // namespace
}  // namespace desloc::test
