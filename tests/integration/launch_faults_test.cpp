// `desloc launch` when things go wrong: an unreachable coordinator, a wrong token, a config-hash
// mismatch, a site killed mid-sync (every surviving rank exits within its deadline naming the
// failed peer, every written checkpoint valid), resumes the ranks disagree on or that would
// overwrite another run, a second run into a directory in use, a killed launch, and Ctrl-C.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cluster_env.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/train/checkpoint.hpp"
#include "test_env.hpp"

namespace desloc::test {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Port 1 (tcpmux) is reserved and nothing listens there: connecting is refused at once.
constexpr int kClosedPort = 1;

TEST(LaunchFaults, UnreachableCoordinatorFailsWithinTheRendezvousDeadlineNamingIt) {
  const fs::path dir = fresh_dir("unreachable");
  std::string toml = multi_site_toml(dir / "out", "\"west\", \"east\"", 1);
  toml.replace(toml.find("rendezvous_timeout_s = 20"), 25,
               "rendezvous_timeout_s = 3\ntoken = \"s3cret\"");
  write_text(dir / "job.toml", toml);
  const auto t0 = Clock::now();
  Process w = Process::start(
      {DESLOC_CLI, "worker", "--config", (dir / "job.toml").string(), "--site", "west", "--rank",
       "0", "--coordinator", "127.0.0.1:" + std::to_string(kClosedPort)},
      dir / "worker.log");
  const int status = w.wait(30s);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_NE(status, 0) << w.output();
  EXPECT_NE(status, -1) << "the worker hung: " << w.output();
  EXPECT_LT(secs, 15.0);
  EXPECT_NE(w.output().find("127.0.0.1:1"), std::string::npos) << w.output();
}

std::string faults_toml(const fs::path& out, const std::string& token, const std::string& lr,
                        int steps) {
  std::string toml = multi_site_toml(out, "\"west\", \"east\", \"north\"", 1);
  toml.replace(toml.find("rendezvous_timeout_s = 20"), 25,
               "rendezvous_timeout_s = 10\ntoken = \"" + token + "\"\nheartbeat_timeout_ms = 2000");
  toml.replace(toml.find("deadline_s = 20"), 15, "deadline_s = 5");
  toml.replace(toml.find("lr = 0.01"), 9, "lr = " + lr);
  return with_steps(toml, steps);
}

TEST(LaunchFaults, WrongTokenIsRefusedAndNeverJoins) {
  Cluster c{fresh_dir("token"), {}, 0};
  const fs::path good =
      write_text(c.dir / "good.toml", faults_toml(c.dir / "out", "right", "0.01", 12));
  const fs::path bad =
      write_text(c.dir / "bad.toml", faults_toml(c.dir / "out", "wrong", "0.01", 12));
  c.start(good);
  Process intruder = c.worker(bad, "west", 0);
  EXPECT_NE(intruder.wait(20s), 0);
  EXPECT_NE(intruder.output().find("token"), std::string::npos) << intruder.output();
  EXPECT_EQ(intruder.output().find("membership epoch"), std::string::npos) << intruder.output();
  ::kill(c.coordinator.pid, SIGTERM);
  c.coordinator.wait(10s);
  EXPECT_NE(c.coordinator.output().find("refusing connection"), std::string::npos)
      << c.coordinator.output();
}

TEST(LaunchFaults, ConfigHashMismatchIsRefusedWithTheReason) {
  Cluster c{fresh_dir("hash"), {}, 0};
  const fs::path good =
      write_text(c.dir / "good.toml", faults_toml(c.dir / "out", "t", "0.01", 12));
  const fs::path other =
      write_text(c.dir / "other.toml", faults_toml(c.dir / "out", "t", "0.02", 12));
  c.start(good);
  Process stranger = c.worker(other, "east", 0);
  EXPECT_NE(stranger.wait(20s), 0);
  EXPECT_NE(stranger.output().find("config hash"), std::string::npos) << stranger.output();
  // The refusal names the key that differs, with both values.
  EXPECT_NE(
      stranger.output().find("differs from the coordinator's in schedule.lr (this rank: 0.02, the "
                             "coordinator: 0.01)"),
      std::string::npos)
      << stranger.output();
  // So it does for every key a rank must share: a codec (the compressed average would fail
  // epochs later), error feedback set alone (the job would finish computing something else).
  std::string codec = faults_toml(c.dir / "out", "t", "0.01", 12);
  codec.replace(codec.find("kx = 2"), 6, "kx = 2\ncodec_x = \"int8\"");
  Process int8 = c.worker(write_text(c.dir / "codec.toml", codec), "west", 0);
  EXPECT_NE(int8.wait(20s), 0);
  EXPECT_NE(int8.output().find("in sync.codec_x (this rank: \"int8\", the coordinator: "
                               "\"fp32\")"),
            std::string::npos)
      << int8.output();
  std::string feedback = codec;
  feedback.replace(feedback.find("codec_x = \"int8\""), 16, "error_feedback = true");
  feedback.replace(feedback.find("kx = 2"), 6, "kx = 2\ncodec_u = \"int8\"");
  Process ef = c.worker(write_text(c.dir / "feedback.toml", feedback), "north", 0);
  EXPECT_NE(ef.wait(20s), 0);
  EXPECT_NE(ef.output().find("sync.codec_u"), std::string::npos) << ef.output();
  EXPECT_NE(ef.output().find("sync.error_feedback (this rank: true, the coordinator: false)"),
            std::string::npos)
      << ef.output();
  ::kill(c.coordinator.pid, SIGTERM);
  c.coordinator.wait(10s);
}

TEST(LaunchFaults, SiteKilledMidSyncMakesEverySurvivorExitWithinTheDeadlineNamingIt) {
  Cluster c{fresh_dir("killed"), {}, 0};
  // kx = 2 and checkpoints every 2 steps: the kill lands between syncs or inside one.
  std::string toml = faults_toml(c.dir / "out", "t", "0.01", 2000);
  toml.replace(toml.find("checkpoint_every = 0"), 20, "checkpoint_every = 2");
  // This job stops on a failure; tests/integration/fault_test.cpp covers continuing.
  toml.replace(toml.find("heartbeat_timeout_ms = 2000"), 27,
               "heartbeat_timeout_ms = 2000\non_site_failure = \"stop\"");
  const fs::path cfg = write_text(c.dir / "job.toml", toml);
  c.start(cfg);
  Process west = c.worker(cfg, "west", 0);
  Process east = c.worker(cfg, "east", 0);
  Process north = c.worker(cfg, "north", 0);
  // Wait until training is under way (a checkpoint exists), then kill east outright.
  const fs::path ckdir = c.dir / "out" / "checkpoints";
  const auto end = Clock::now() + 60s;
  while (Clock::now() < end &&
         !(fs::exists(ckdir) && !fs::is_empty(ckdir) && fs::exists(c.dir / "out" / "ranks")))
    std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(fs::exists(ckdir) && !fs::is_empty(ckdir)) << west.output();
  std::this_thread::sleep_for(300ms);
  ::kill(east.pid, SIGKILL);
  const auto killed_at = Clock::now();
  EXPECT_EQ(east.wait(5s), 128 + SIGKILL);
  for (Process* p : {&west, &north}) {
    const int status = p->wait(30s);
    const double secs = std::chrono::duration<double>(Clock::now() - killed_at).count();
    EXPECT_NE(status, -1) << "a survivor hung: " << p->output();
    EXPECT_NE(status, 0) << p->output();
    // deadline_s = 5 plus process teardown.
    EXPECT_LT(secs, 5.0 + 5.0) << p->output();
    EXPECT_NE(p->output().find("east/0"), std::string::npos) << p->output();
  }
  // Every checkpoint written before the failure still loads (CRC, sizes).
  std::size_t checked = 0;
  for (const fs::path& root : {c.dir / "out", c.dir / "out" / "ranks" / "north-0"})
    for (const auto& e : fs::directory_iterator(root / "checkpoints"))
      if (e.path().extension() == ".ckpt") {
        EXPECT_NO_THROW(train::load_checkpoint(e.path().string())) << e.path();
        ++checked;
      }
  EXPECT_GT(checked, 0u);
  ::kill(c.coordinator.pid, SIGTERM);
  c.coordinator.wait(10s);
}

// The bytes of every file under dir, by path: to show that nothing was written.
std::map<std::string, std::vector<std::uint8_t>> files_under(const fs::path& dir) {
  std::map<std::string, std::vector<std::uint8_t>> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[e.path().string()] = read_file(e.path().string());
  return out;
}

// Issue 18, item 1: --resume given to some ranks only. Before, the rank without it started a
// fresh one-site run over its old checkpoints while the others died on a mismatched buffer;
// now every rank refuses at the start, naming who was given --resume and who was not, and no
// file of the finished run changes.
TEST(LaunchFaults, ResumeGivenToOnlySomeRanksIsRefusedByEveryRankAndOverwritesNothing) {
  Cluster c{fresh_dir("partial_resume"), {}, 0};
  std::string toml = faults_toml(c.dir / "out", "t", "0.01", 12);
  toml.replace(toml.find("checkpoint_every = 0"), 20, "checkpoint_every = 4");
  const fs::path cfg = write_text(c.dir / "job.toml", toml);
  const auto first = run_command(std::string(DESLOC_CLI) + " launch --config " + cfg.string());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto before = files_under(c.dir / "out");
  c.start(cfg);
  Process west = c.worker(cfg, "west", 0, {}, {"--resume"});
  Process east = c.worker(cfg, "east", 0);
  Process north = c.worker(cfg, "north", 0, {}, {"--resume"});
  for (Process* p : {&west, &east, &north}) {
    const int status = p->wait(30s);
    EXPECT_NE(status, -1) << "a rank hung: " << p->output();
    EXPECT_NE(status, 0) << p->output();
    EXPECT_NE(p->output().find("the ranks disagree on --resume: west/0, north/0 were given it, "
                               "east/0 was not"),
              std::string::npos)
        << p->output();
  }
  ::kill(c.coordinator.pid, SIGTERM);
  c.coordinator.wait(10s);
  EXPECT_EQ(files_under(c.dir / "out"), before);
}

// Issue 18, item 2: a fresh launch into the out_dir of another run refuses on every rank,
// naming each rank's results, and writes nothing.
TEST(LaunchFaults, FreshLaunchOverAnotherRunRefusesAndOverwritesNothing) {
  const fs::path dir = fresh_dir("clobber_launch");
  const fs::path cfg = write_text(
      dir / "job.toml", with_steps(multi_site_toml(dir / "out", "\"west\", \"east\"", 1), 6));
  const auto first = run_command(std::string(DESLOC_CLI) + " launch --config " + cfg.string());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto before = files_under(dir / "out");
  const auto again = run_command(std::string(DESLOC_CLI) + " launch --config " + cfg.string());
  EXPECT_NE(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("already holds another run's results on west/0 (1 checkpoint, "),
            std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("east/0 (1 checkpoint, "), std::string::npos) << again.output;
  EXPECT_EQ(files_under(dir / "out"), before);
}

// Issue 18, item 2: `launch --resume` on a run whose ranks went apart (here: east lacks its
// two newest checkpoints, as a site dropped from the run would) refuses instead of rolling the
// others back and rewriting their newer checkpoints; --force resumes from the common step.
TEST(LaunchFaults, ResumeThatWouldDiscardNewerCheckpointsRefusesUnlessForced) {
  const fs::path dir = fresh_dir("diverged");
  std::string toml = with_steps(multi_site_toml(dir / "out", "\"west\", \"east\"", 1), 8);
  toml.replace(toml.find("checkpoint_every = 0"), 20, "checkpoint_every = 2");
  const fs::path cfg = write_text(dir / "job.toml", toml);
  const auto first = run_command(std::string(DESLOC_CLI) + " launch --config " + cfg.string());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const fs::path east = dir / "out" / "ranks" / "east-0" / "checkpoints";
  for (int step : {6, 8}) fs::remove(train::checkpoint_path(east.string(), step));
  const auto west_before = files_under(dir / "out" / "checkpoints");
  const auto refused =
      run_command(std::string(DESLOC_CLI) + " launch --resume --config " + cfg.string());
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("the ranks' checkpoints went apart: the newest step all of them "
                                "hold is 4, but some hold up to step 8"),
            std::string::npos)
      << refused.output;
  EXPECT_EQ(files_under(dir / "out" / "checkpoints"), west_before);
  const auto forced =
      run_command(std::string(DESLOC_CLI) + " launch --resume --force --config " + cfg.string());
  EXPECT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_NE(forced.output.find("trained steps 4..8"), std::string::npos) << forced.output;
}

// A finished 3-site run of 12 steps (checkpoints every 4) in dir/out, from `toml`.
fs::path finished_run(const fs::path& dir, std::string toml) {
  toml.replace(toml.find("checkpoint_every = 0"), 20, "checkpoint_every = 4");
  const fs::path cfg = write_text(dir / "job.toml", toml);
  const auto r = run_command(std::string(DESLOC_CLI) + " launch --config " + cfg.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return cfg;
}

// Replaces dir/out's `sub` (a rank's directory, or its checkpoints) with `other`'s.
void transplant(const fs::path& dir, const fs::path& other, const std::string& sub) {
  fs::remove_all(dir / "out" / sub);
  fs::copy(other / "out" / sub, dir / "out" / sub, fs::copy_options::recursive);
}

// One site's directory holds the checkpoints of the same job with another train.seed: the
// resume agreement finds it, and every rank refuses before it writes anything. (Before, that
// site alone exited 2, and the others rolled back, dropped it, finished and exited 0.)
TEST(LaunchFaults, ResumeOverAnotherConfigsCheckpointsOnOneSiteIsRefusedByEveryRank) {
  const fs::path dir = fresh_dir("foreign_config"), other = fresh_dir("foreign_config_other");
  const std::string toml = faults_toml(dir / "out", "t", "0.01", 12);
  const fs::path cfg = finished_run(dir, toml);
  std::string seeded = faults_toml(other / "out", "t", "0.01", 12);
  seeded.replace(seeded.find("seed = 3"), 8, "seed = 4");
  finished_run(other, seeded);
  transplant(dir, other, "ranks/east-0");
  const auto before = files_under(dir / "out");
  const auto r = run_command(std::string(DESLOC_CLI) + " launch --resume --config " + cfg.string());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--resume: east/0 (its step 12 belongs to another config (config hash "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("holds no checkpoint of this job's config"), std::string::npos)
      << r.output;
  for (const char* rank : {"[west/0]", "[east/0]", "[north/0]"})
    EXPECT_NE(r.output.find(std::string(rank) + " desloc worker"), std::string::npos)
        << rank << " did not refuse: " << r.output;
  EXPECT_EQ(r.output.find("finished without"), std::string::npos) << r.output;
  EXPECT_EQ(files_under(dir / "out"), before);
}

// One site's checkpoints come from another run of the very same config (its own metrics
// stay): the run ids at the agreed step and in the metrics disagree, and every rank refuses.
// In one process, a checkpoint copied in from another run is refused against the metrics'.
TEST(LaunchFaults, ResumeOverAnotherRunsCheckpointsOfTheSameConfigIsRefused) {
  const fs::path dir = fresh_dir("foreign_run"), other = fresh_dir("foreign_run_other");
  const fs::path cfg = finished_run(dir, faults_toml(dir / "out", "t", "0.01", 12));
  finished_run(other, faults_toml(other / "out", "t", "0.01", 12));
  transplant(dir, other, "ranks/east-0/checkpoints");
  const auto before = files_under(dir / "out");
  const auto r = run_command(std::string(DESLOC_CLI) + " launch --resume --config " + cfg.string());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("belong to different runs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("east/0's checkpoint"), std::string::npos) << r.output;
  EXPECT_EQ(files_under(dir / "out"), before);

  // In-process: run A stops at step 8, run B of the same config reaches 12; B's step 12 is
  // copied into A's checkpoints, where it is the newest.
  const fs::path a = fresh_dir("foreign_run_a"), b = fresh_dir("foreign_run_b");
  auto train_cmd = [](const fs::path& d, const std::string& extra) {
    std::string toml = with_steps(tiny_job_toml(d / "out"), 12);
    toml.replace(toml.find("checkpoint_every = 0"), 20, "checkpoint_every = 4");
    return std::string(DESLOC_CLI) + " train --no-progress --config " +
           write_text(d / "job.toml", toml).string() + extra;
  };
  ASSERT_EQ(run_command(train_cmd(a, " --stop-after 8")).exit_code, 0);
  ASSERT_EQ(run_command(train_cmd(b, "")).exit_code, 0);
  fs::copy_file(b / "out" / "checkpoints" / "step_00000012.ckpt",
                a / "out" / "checkpoints" / "step_00000012.ckpt");
  const auto resumed = run_command(train_cmd(a, " --resume"));
  EXPECT_EQ(resumed.exit_code, 2) << resumed.output;
  EXPECT_NE(resumed.output.find("step_00000012.ckpt' belongs to run"), std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("records the history of run"), std::string::npos) << resumed.output;
}

// Two processes training into one directory at once: the second is refused, naming the first,
// before it writes anything. (Before, both ran and one overwrote the other's checkpoints.)
TEST(LaunchFaults, ASecondRunIntoADirectoryInUseIsRefusedNamingItsHolder) {
  const fs::path dir = fresh_dir("locked");
  std::string toml = with_steps(tiny_job_toml(dir / "out"), 100000);
  toml.replace(toml.find("checkpoint_every = 0"), 20, "checkpoint_every = 5");
  const fs::path cfg = write_text(dir / "job.toml", toml);
  Process first = Process::start({DESLOC_CLI, "train", "--no-progress", "--config", cfg.string()},
                                 dir / "first.log");
  const auto end = Clock::now() + 60s;
  while (Clock::now() < end && !fs::exists(dir / "out" / "checkpoints" / "step_00000005.ckpt"))
    std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(fs::exists(dir / "out" / "checkpoints" / "step_00000005.ckpt")) << first.output();
  const auto second = run_command(std::string(DESLOC_CLI) +
                                  " train --no-progress --resume --config " + cfg.string());
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_NE(second.output.find("is in use by another desloc process (pid " +
                               std::to_string(first.pid) + ": " + DESLOC_CLI + " train"),
            std::string::npos)
      << second.output;
  ::kill(first.pid, SIGINT);
  EXPECT_EQ(first.wait(30s), 130) << first.output();
  // Once the holder is gone, the directory is free.
  const auto third =
      run_command(std::string(DESLOC_CLI) +
                  " train --no-progress --resume --stop-after 1 --config " + cfg.string());
  EXPECT_EQ(third.exit_code, 0) << third.output;
  EXPECT_EQ(third.output.find("in use"), std::string::npos) << third.output;
}

}  // namespace
}  // namespace desloc::test

namespace desloc::test {
namespace {

// Whether this process can listen on loopback's `port` now (no one else listens there).
bool can_listen(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok =
      ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 1) == 0;
  ::close(fd);
  return ok;
}

// The number after `prefix` in `text`, or 0.
int number_after(const std::string& text, const std::string& prefix) {
  const auto at = text.find(prefix);
  return at == std::string::npos ? 0 : std::atoi(text.c_str() + at + prefix.size());
}

// launch killed outright (SIGKILL, the OOM killer): its ranks held none of its listening
// sockets (Asio opens them without close-on-exec), so the coordinator's and the status
// endpoint's ports are free at once; and the ranks learn their parent is gone and stop at a
// common step with a checkpoint, as launch's Ctrl-C stops them, instead of training on
// unwatched. (Before, the ranks kept both ports taken and trained to the end.)
TEST(LaunchFaults, AKilledLaunchLeavesNoPortTakenAndItsRanksStopWithACheckpoint) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);  // the orphaned ranks become ours to reap
  const fs::path dir = fresh_dir("launch_killed");
  const fs::path cfg = write_text(
      dir / "job.toml", with_steps(multi_site_toml(dir / "out", "\"west\", \"east\"", 1), 200000));
  // --quiet: a rank that writes nothing to launch's pipe is not ended by SIGPIPE when launch
  // goes, which is how a rank outlives it.
  Process launch = Process::start(
      {DESLOC_CLI, "launch", "--config", cfg.string(), "--http", "127.0.0.1:0", "--quiet"},
      dir / "launch.log");
  const fs::path metrics = dir / "out" / "metrics.jsonl";
  const auto end = Clock::now() + 60s;
  while (Clock::now() < end && read_text(metrics).find("\"step\":10,") == std::string::npos)
    std::this_thread::sleep_for(50ms);
  const std::string out = launch.output();
  ASSERT_NE(read_text(metrics).find("\"step\":10,"), std::string::npos) << out;
  const int coordinator = number_after(out, "coordinator 127.0.0.1:");
  const int http = number_after(out, "on http://127.0.0.1:");
  ASSERT_NE(coordinator, 0) << out;
  ASSERT_NE(http, 0) << out;
  std::vector<Process> ranks(2);
  ranks[0].pid = child_with_argument(launch.pid, "west");
  ranks[1].pid = child_with_argument(launch.pid, "east");
  ASSERT_GT(ranks[0].pid, 0);
  ASSERT_GT(ranks[1].pid, 0);
  ::kill(launch.pid, SIGKILL);
  EXPECT_EQ(launch.wait(10s), 128 + SIGKILL);
  EXPECT_TRUE(can_listen(coordinator)) << "a rank holds the coordinator's port";
  EXPECT_TRUE(can_listen(http)) << "a rank holds the status endpoint's port";
  for (Process& r : ranks) EXPECT_EQ(r.wait(60s), 130) << "a rank trained on without launch";
  std::vector<std::int64_t> steps;
  for (const fs::path& d : {dir / "out", dir / "out" / "ranks" / "east-0"}) {
    const auto found = train::find_latest_checkpoint((d / "checkpoints").string());
    ASSERT_TRUE(found.has_value()) << d;
    steps.push_back(found->checkpoint.step);
  }
  EXPECT_EQ(steps[0], steps[1]);
  EXPECT_GT(steps[0], 0);
  EXPECT_LT(steps[0], 200000);
}

TEST(Launch, CtrlCStopsEveryRankAtOneStepWithACheckpoint) {
  const fs::path dir = fresh_dir("sigint");
  std::string toml = with_steps(multi_site_toml(dir / "out", "\"west\", \"east\"", 2), 200000);
  const fs::path cfg = write_text(dir / "job.toml", toml);
  Process launch =
      Process::start({DESLOC_CLI, "launch", "--config", cfg.string()}, dir / "launch.log");
  // Interrupt once every rank is training (the leader has logged a step).
  const auto end = Clock::now() + 60s;
  while (Clock::now() < end && launch.output().find("step 10/200000") == std::string::npos)
    std::this_thread::sleep_for(50ms);
  ASSERT_NE(launch.output().find("step 10/200000"), std::string::npos) << launch.output();
  ::kill(launch.pid, SIGINT);
  EXPECT_EQ(launch.wait(60s), 130) << launch.output();
  EXPECT_NE(launch.output().find("every rank checkpointed"), std::string::npos) << launch.output();
  // Every rank stopped after the same step, and its checkpoint of that step loads.
  std::vector<std::int64_t> steps;
  for (const fs::path& d : {dir / "out", dir / "out" / "ranks" / "west-1",
                            dir / "out" / "ranks" / "east-0", dir / "out" / "ranks" / "east-1"}) {
    const auto found = train::find_latest_checkpoint((d / "checkpoints").string());
    ASSERT_TRUE(found.has_value()) << d;
    steps.push_back(found->checkpoint.step);
  }
  for (auto s : steps) EXPECT_EQ(s, steps[0]);
  EXPECT_GT(steps[0], 0);
  EXPECT_LT(steps[0], 200000);
  // kx = 2: sites agree at a sync step.
  EXPECT_EQ(steps[0] % 2, 0);
}

}  // namespace
}  // namespace desloc::test
