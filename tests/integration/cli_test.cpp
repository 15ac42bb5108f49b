// The desloc CLI as a user meets it: help text, exit codes, and errors that name the file,
// line, column and key, with nothing overwritten.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <random>
#include <regex>
#include <thread>

#include "cluster_env.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/train/checkpoint.hpp"
#include "test_env.hpp"

using namespace desloc::test;

namespace {
std::string cli() { return std::string("'") + DESLOC_CLI + "'"; }

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// Sets `key = value` in `[table]` of a config, replacing the key's line if it has one.
std::string set_key(std::string toml, const std::string& table, const std::string& key,
                    const std::string& value) {
  const auto start = toml.find("[" + table + "]\n");
  if (start == std::string::npos) return toml + "[" + table + "]\n" + key + " = " + value + "\n";
  const auto stop = toml.find("\n[", start);
  const auto at = toml.find("\n" + key + " = ", start);
  if (at != std::string::npos && at < stop) toml.erase(at + 1, toml.find('\n', at + 1) - at);
  toml.insert(start + table.size() + 3, key + " = " + value + "\n");
  return toml;
}

// A tiny job whose data directory does not exist: whatever the CLI checks up front must fail
// before training would (a run that got that far fails on the data, with exit 1).
std::string job_without_data(const fs::path& out) {
  return tiny_job_toml(out, "/no/such/desloc/data");
}
}  // namespace

TEST(Cli, HelpListsTheCommands) {
  const auto r = run_command(cli() + " --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* cmd : {"prepare", "train", "config", "launch", "coordinator", "worker", "plan"})
    EXPECT_NE(r.output.find(cmd), std::string::npos) << r.output;
  const auto t = run_command(cli() + " train --help");
  EXPECT_NE(t.output.find("--resume"), std::string::npos) << t.output;
}

// A flag's help after an option that takes a value is help, not that value.
TEST(Cli, HelpAfterAnOptionThatTakesAValueIsHelp) {
  const auto r = run_command(cli() + " config --check --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "Usage: config")) << r.output;
  EXPECT_FALSE(contains(r.output, "cannot read config")) << r.output;
}

// A negative --stop-after would be ignored; it is refused, naming the flag.
TEST(Cli, StopAfterMustBeAPositiveStepCount) {
  const auto dir = fresh_dir("cli_stop_after");
  const auto cfg = write_text(dir / "job.toml", tiny_job_toml(dir / "out"));
  for (const std::string n : {"-5", "0"}) {
    const auto r = run_command(cli() + " train --config " + cfg.string() + " --stop-after " + n);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "--stop-after: must be a whole number, at least 1")) << r.output;
    EXPECT_FALSE(fs::exists(dir / "out")) << "nothing was run";
  }
}

TEST(Cli, NoSubcommandIsAnError) { EXPECT_NE(run_command(cli()).exit_code, 0); }

TEST(Cli, ConfigDefaultsRoundTripThroughCheck) {
  const auto dir = fresh_dir("cli_defaults");
  const auto d = run_command(cli() + " config --defaults");
  ASSERT_EQ(d.exit_code, 0);
  write_text(dir / "d.toml", d.output);
  const auto c = run_command(cli() + " config --check " + (dir / "d.toml").string());
  EXPECT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("config hash"), std::string::npos);
}

TEST(Cli, BadConfigExitsNonZeroWithFileLineColumnAndKey) {
  const auto dir = fresh_dir("cli_badcfg");
  const auto out = dir / "out";
  struct Case {
    const char* text;
    const char* expect;
  };
  const Case cases[] = {
      {"[model]\nlayers = 2\nwidth = 64\n", ":3:1: unknown key 'model.width'"},
      {"[model]\nlayers = 2.5\n", ":2:10: model.layers must be an integer"},
      {"[model]\nd_model = 0\n", ":2:11: model.d_model = 0 is out of range"},
      {"[model]\nd_model = 64\nheads = 5\n",
       ":3:9: model.heads = 5 does not divide model.d_model = 64"},
      {"[train]\nsteps = \"many\"\n", ":2:9: train.steps must be an integer"},
  };
  for (const auto& c : cases) {
    const auto path = write_text(dir / "bad.toml", c.text);
    const auto r = run_command(cli() + " train --no-progress --config " + path.string() +
                               " --out-dir " + out.string());
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(path.string() + c.expect), std::string::npos)
        << "expected '" << c.expect << "' in\n"
        << r.output;
    EXPECT_FALSE(std::filesystem::exists(out)) << "a failed run created " << out;
  }
}

TEST(Cli, MissingConfigFileIsNamed) {
  const auto r = run_command(cli() + " train --config /no/such/job.toml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("/no/such/job.toml"), std::string::npos) << r.output;
}

TEST(Cli, ResumeFromOnlyACorruptCheckpointFailsAndKeepsIt) {
  ASSERT_TRUE(have_prepared_corpus());
  const auto dir = fresh_dir("cli_corrupt");
  const auto cfg = write_text(dir / "job.toml", tiny_job_toml(dir / "out"));
  const auto first =
      run_command(cli() + " train --no-progress --config " + cfg.string() + " --stop-after 3");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string ckpt =
      desloc::train::checkpoint_path((dir / "out" / "checkpoints").string(), 3);
  auto bytes = desloc::read_file(ckpt);
  bytes.resize(bytes.size() - 7);
  std::ofstream(ckpt, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  const auto r = run_command(cli() + " train --no-progress --config " + cfg.string() + " --resume");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("skipping checkpoint " + ckpt), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no valid checkpoint"), std::string::npos) << r.output;
  EXPECT_EQ(desloc::read_file(ckpt).size(), bytes.size())
      << "the corrupt checkpoint was overwritten";
}

TEST(Cli, PrepareMissingTextFileIsNamed) {
  const auto dir = fresh_dir("cli_prepare");
  const auto r =
      run_command(cli() + " prepare --source /no/such/corpus.txt --out " + (dir / "d").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("/no/such/corpus.txt"), std::string::npos) << r.output;
}

TEST(Cli, PlanPrintsReasonsAndAFragmentAndNamesBadTopologies) {
  const auto dir = fresh_dir("plan");
  std::string topo = "[meta]\nsource = \"test\"\n";
  for (const char* s : {"west", "east"})
    topo += std::string("[[site]]\nname = \"") + s + "\"\nstep_ms = 50\n";
  topo +=
      "[[link]]\nfrom = \"west\"\nto = \"east\"\nbandwidth_mbit = 100\nlatency_ms = 1\n"
      "[[link]]\nfrom = \"east\"\nto = \"west\"\nbandwidth_mbit = 100\nlatency_ms = 1\n";
  write_text(dir / "topology.toml", topo);
  write_text(dir / "job.toml",
             tiny_job_toml(dir / "out") + "[job]\nsites = [\"west\", \"east\"]\n");
  const auto r =
      run_command(cli() + " plan --topology " + (dir / "topology.toml").string() + " --config " +
                  (dir / "job.toml").string() + " --out " + (dir / "fragment.toml").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* needle : {"schedule: ring west -> east -> west", "Kx = ", "kv = ", "phase_u"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
  EXPECT_TRUE(fs::exists(dir / "fragment.toml"));
  // The fragment completes a job config that launch and worker accept.
  std::ifstream fragment(dir / "fragment.toml");
  const std::string text{std::istreambuf_iterator<char>(fragment), {}};
  write_text(dir / "planned.toml", tiny_job_toml(dir / "out") + text);
  const auto check = run_command(cli() + " config --check " + (dir / "planned.toml").string());
  EXPECT_EQ(check.exit_code, 0) << check.output << "\n" << text;

  // --delayed: a delay and the mode in the fragment, which config --check accepts too; with
  // --fragments 1 whole averages, else the planner's fragment count (streaming) when it gives
  // a shorter period, as it does here (Kx 2 against 3).
  for (const std::string fragments : {"1", "0"}) {
    const fs::path out = dir / ("delayed" + fragments + ".toml");
    const auto d = run_command(cli() + " plan --delayed --fragments " + fragments + " --topology " +
                               (dir / "topology.toml").string() + " --config " +
                               (dir / "job.toml").string() + " --out " + out.string());
    EXPECT_EQ(d.exit_code, 0) << d.output;
    EXPECT_NE(d.output.find(fragments == "1" ? "delay tau = " : "streaming: 2 fragments"),
              std::string::npos)
        << d.output;
    std::ifstream delayed_fragment(out);
    const std::string delayed{std::istreambuf_iterator<char>(delayed_fragment), {}};
    EXPECT_NE(delayed.find("overlap = \"delayed\"\ndelay = "), std::string::npos) << delayed;
    EXPECT_EQ(delayed.find("fragments = ") != std::string::npos, fragments == "0") << delayed;
    write_text(dir / "planned_delayed.toml", tiny_job_toml(dir / "out") + delayed);
    const auto dcheck =
        run_command(cli() + " config --check " + (dir / "planned_delayed.toml").string());
    EXPECT_EQ(dcheck.exit_code, 0) << dcheck.output << "\n" << delayed;
  }

  // --codecs auto: fp32, int8 and int4 each planned, the shortest Kx kept; on a 1 Mbit link
  // the bytes dominate, so int4 wins, and its fragment names every codec.
  std::string slow = topo;
  for (std::size_t at; (at = slow.find("bandwidth_mbit = 100")) != std::string::npos;)
    slow.replace(at, 20, "bandwidth_mbit = 1");
  write_text(dir / "slow.toml", slow);
  const fs::path auto_out = dir / "auto.toml";
  const auto a = run_command(cli() + " plan --codecs auto --target-overhead 0.5 --topology " +
                             (dir / "slow.toml").string() + " --config " +
                             (dir / "job.toml").string() + " --out " + auto_out.string());
  EXPECT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("codecs (--codecs auto"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("chose int4"), std::string::npos) << a.output;
  std::ifstream auto_fragment(auto_out);
  const std::string chosen{std::istreambuf_iterator<char>(auto_fragment), {}};
  EXPECT_NE(chosen.find("codec_x = \"int4\"\ncodec_u = \"int4\"\ncodec_v = \"int4\""),
            std::string::npos)
      << chosen;
  write_text(dir / "planned_auto.toml", tiny_job_toml(dir / "out") + chosen);
  const auto acheck =
      run_command(cli() + " config --check " + (dir / "planned_auto.toml").string());
  EXPECT_EQ(acheck.exit_code, 0) << acheck.output << "\n" << chosen;

  // A NaN bandwidth is refused with the file, line and key.
  std::string bad = topo;
  bad.replace(bad.find("bandwidth_mbit = 100"), 20, "bandwidth_mbit = nan");
  write_text(dir / "bad.toml", bad);
  const auto b = run_command(cli() + " plan --topology " + (dir / "bad.toml").string() +
                             " --config " + (dir / "job.toml").string());
  EXPECT_EQ(b.exit_code, 2) << b.output;
  EXPECT_NE(b.output.find("bad.toml:"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("bandwidth_mbit"), std::string::npos) << b.output;
}

// ---------------------------------------------------------------- issue 18: unchecked input

TEST(Cli, ConfigPathThatIsADirectoryIsRefused) {
  const auto dir = fresh_dir("cli_cfgdir");
  fs::create_directories(dir / "configs");
  write_text(dir / "configs" / "job.toml", tiny_job_toml(dir / "out"));
  const auto c = run_command(cli() + " config --check " + (dir / "configs").string());
  EXPECT_EQ(c.exit_code, 2) << c.output;
  EXPECT_TRUE(contains(c.output, (dir / "configs").string() + ": is a directory")) << c.output;
  EXPECT_TRUE(contains(c.output, (dir / "configs" / "job.toml").string())) << c.output;
  const auto t = run_command(cli() + " train --no-progress -c " + (dir / "configs").string() +
                             " --out-dir " + (dir / "out").string());
  EXPECT_EQ(t.exit_code, 2) << t.output;
  EXPECT_TRUE(contains(t.output, "is a directory")) << t.output;
  EXPECT_FALSE(fs::exists(dir / "out")) << "a directory trained the defaults";
}

TEST(Cli, ThreadsFlagMeetsTheConfigKeysRange) {
  const auto dir = fresh_dir("cli_threads");
  const auto cfg = write_text(dir / "job.toml", job_without_data(dir / "out") +
                                                    "[job]\nsites = [\"west\"]\ntoken = \"t\"\n");
  for (const char* v : {"65536", "1025", "-1"}) {
    const std::string expect =
        std::string("--threads: train.threads = ") + v + " is out of range [0, 1024]";
    const auto t =
        run_command(cli() + " train --no-progress -c " + cfg.string() + " --threads " + v);
    EXPECT_EQ(t.exit_code, 2) << t.output;
    EXPECT_TRUE(contains(t.output, expect)) << t.output;
    const auto w = run_command(cli() + " worker --no-progress -c " + cfg.string() +
                               " --site west --rank 0 --coordinator 127.0.0.1:1 --threads " + v);
    EXPECT_EQ(w.exit_code, 2) << w.output;
    EXPECT_TRUE(contains(w.output, expect)) << w.output;
  }
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(Cli, ModelTooLargeForThisMachineIsRefusedUpFront) {
  const auto dir = fresh_dir("cli_huge");
  struct Case {
    std::vector<std::array<const char*, 3>> keys;  // table, key, value
    const char* named;
  };
  // Each needs far more than any machine has (100 TiB and up), whatever this one holds.
  const Case cases[] = {
      {{{"model", "layers", "100000000"}}, "model.layers"},
      {{{"model", "context", "1000000000"}}, "model.context"},
      {{{"data", "batch", "1000000000"}}, "data.batch"},
      {{{"model", "d_model", "1000000"}}, "model.d_model"},
      {{{"model", "d_model", "2000000000"}, {"model", "heads", "1"}}, "model.d_model"},
  };
  for (const auto& c : cases) {
    std::string toml =
        job_without_data(dir / "out") + "[job]\nsites = [\"west\", \"east\"]\ntoken = \"t\"\n";
    for (const auto& [table, key, value] : c.keys) toml = set_key(toml, table, key, value);
    SCOPED_TRACE(toml);
    const auto cfg = write_text(dir / "job.toml", toml);
    const auto check = run_command(cli() + " config --check " + cfg.string());
    ASSERT_EQ(check.exit_code, 2) << check.output;
    for (const auto& r : {check, run_command(cli() + " train --no-progress -c " + cfg.string()),
                          run_command(cli() + " launch --quiet -c " + cfg.string()),
                          run_command(cli() + " worker --no-progress -c " + cfg.string() +
                                      " --site west --rank 0 --coordinator 127.0.0.1:1")}) {
      EXPECT_EQ(r.exit_code, 2) << r.output;
      EXPECT_TRUE(contains(r.output, cfg.string() + ": ")) << r.output;
      EXPECT_TRUE(contains(r.output, c.named)) << r.output;
      EXPECT_TRUE(contains(r.output, " available (")) << r.output;
      EXPECT_FALSE(contains(r.output, "bad_alloc")) << r.output;
    }
  }
  EXPECT_FALSE(fs::exists(dir / "out"));
  // An ordinary job reports what it needs and passes.
  const auto ok = write_text(dir / "ok.toml", tiny_job_toml(dir / "out"));
  const auto r = run_command(cli() + " config --check " + ok.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "memory: ")) << r.output;
}

// Sites of unequal speed (issue 38): west steps in 100 ms at a batch of 8, east in 300 ms.
// `desloc plan` balances the batches per rank to the sites' speed (the job's 32 sequences a
// step kept), says why, and writes [[job.site]] tables in place of job.sites that complete a
// config `config --check` accepts; `desloc simulate` says how long each site waits.
TEST(Cli, PlanBalancesTheBatchesOfUnequalSitesAndSimulateNamesEachSitesWait) {
  const auto dir = fresh_dir("plan_unequal");
  std::string topo = "[meta]\nsource = \"test\"\n";
  topo += "[[site]]\nname = \"west\"\nstep_ms = 100\nbatch = 8\n";
  topo += "[[site]]\nname = \"east\"\nstep_ms = 300\nbatch = 8\n";
  topo +=
      "[[link]]\nfrom = \"west\"\nto = \"east\"\nbandwidth_mbit = 100\nlatency_ms = 1\n"
      "[[link]]\nfrom = \"east\"\nto = \"west\"\nbandwidth_mbit = 100\nlatency_ms = 1\n";
  write_text(dir / "topology.toml", topo);
  std::string job = tiny_job_toml(dir / "out");
  job.replace(job.find("\nbatch = 4\n"), 11, "\n");
  job +=
      "[sync]\nmethod = \"desloc\"\nkx = 8\n"
      "[[job.site]]\nname = \"west\"\nranks = 2\nbatch = 8\n"
      "[[job.site]]\nname = \"east\"\nranks = 2\nbatch = 8\n";
  write_text(dir / "job.toml", job);
  const auto r =
      run_command(cli() + " plan --topology " + (dir / "topology.toml").string() + " --config " +
                  (dir / "job.toml").string() + " --out " + (dir / "fragment.toml").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* needle :
       {"every average waits for east", "west 8 -> 12 (150 ms), east 8 -> 4 (150 ms)",
        "the job steps in 150 ms instead of 300 ms",
        "[[job.site]]\nname = \"west\"\nranks = 2\nbatch = 12\n"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
  const std::string text = read_text(dir / "fragment.toml");
  EXPECT_EQ(text.find("sites = ["), std::string::npos) << text;
  std::string planned = tiny_job_toml(dir / "out");
  planned.replace(planned.find("\nbatch = 4\n"), 11, "\n");
  write_text(dir / "planned.toml", planned + text);
  const auto check = run_command(cli() + " config --check " + (dir / "planned.toml").string());
  EXPECT_EQ(check.exit_code, 0) << check.output << "\n" << text;

  const auto sim =
      run_command(cli() + " simulate --methods desloc --steps 64 --topology " +
                  (dir / "topology.toml").string() + " --config " + (dir / "job.toml").string());
  ASSERT_EQ(sim.exit_code, 0) << sim.output;
  // 8 averages, each after 8 steps in which west computed 8 x 200 ms less than east.
  EXPECT_NE(sim.output.find("desloc: west 12.800 s, east 0.000 s"), std::string::npos)
      << sim.output;
}

TEST(Cli, PlanEndsOnAbsurdLinksAndTargets) {
  const auto dir = fresh_dir("plan_absurd");
  auto topology = [&](const char* mbit) {
    std::string topo = "[meta]\nsource = \"test\"\n";
    for (const char* s : {"west", "east"})
      topo += std::string("[[site]]\nname = \"") + s + "\"\nstep_ms = 50\n";
    topo += std::string("[[link]]\nfrom = \"west\"\nto = \"east\"\nbandwidth_mbit = ") + mbit +
            "\nlatency_ms = 1\n[[link]]\nfrom = \"east\"\nto = \"west\"\nbandwidth_mbit = 100\n"
            "latency_ms = 1\n";
    return write_text(dir / (std::string("topo_") + mbit + ".toml"), topo);
  };
  const auto job = write_text(dir / "job.toml", tiny_job_toml(dir / "out") +
                                                    "[job]\nsites = [\"west\", "
                                                    "\"east\"]\n");
  // `timeout` turns the old endless loop into exit 124 instead of a hung test.
  const std::string plan = "timeout 60 " + cli() + " plan -c " + job.string() + " --topology ";
  const auto slow = run_command(plan + topology("1e-17").string());
  EXPECT_EQ(slow.exit_code, 2) << slow.output;
  EXPECT_TRUE(contains(slow.output, "train.steps = 20")) << slow.output;
  const auto tiny = run_command(plan + topology("100").string() + " --target-overhead 1e-30");
  EXPECT_EQ(tiny.exit_code, 2) << tiny.output;
  EXPECT_TRUE(contains(tiny.output, "--target-overhead")) << tiny.output;
  for (const char* bad : {"0", "-1", "nan", "inf"}) {
    const auto r = run_command(plan + topology("100").string() + " --target-overhead " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "--target-overhead")) << r.output;
  }
}

TEST(Cli, SimulateRefusesNonsenseNamingTheFlag) {
  const auto dir = fresh_dir("simulate_bad");
  std::string topo = "[meta]\nsource = \"test\"\n";
  for (const char* s : {"west", "east"})
    topo += std::string("[[site]]\nname = \"") + s + "\"\nstep_ms = 50\n";
  topo +=
      "[[link]]\nfrom = \"west\"\nto = \"east\"\nbandwidth_mbit = 100\nlatency_ms = 1\n"
      "[[link]]\nfrom = \"east\"\nto = \"west\"\nbandwidth_mbit = 100\nlatency_ms = 1\n";
  const auto t = write_text(dir / "topology.toml", topo);
  const auto job = write_text(dir / "job.toml", tiny_job_toml(dir / "out") +
                                                    "[job]\nsites = [\"west\", "
                                                    "\"east\"]\n");
  const std::string sim = cli() + " simulate -c " + job.string() + " --topology " + t.string();
  const auto good = run_command(sim);
  ASSERT_EQ(good.exit_code, 0) << good.output;
  struct Case {
    const char* args;
    const char* flag;
  };
  const Case cases[] = {
      {"--link-scale 0", "--link-scale"},
      {"--link-scale -1", "--link-scale"},
      {"--link-scale nan", "--link-scale"},
      {"--link-scale inf", "--link-scale"},
      {"--step-scale 0", "--step-scale"},
      {"--step-scale nan", "--step-scale"},
      {"--steps 0", "--steps"},
      {"--steps -5", "--steps"},
      {"--params 0", "--params"},
      {"--params -3", "--params"},
      {"--params nan", "--params"},
      {"--jitter nan", "--jitter"},
      {"--jitter -0.5", "--jitter"},
      {"--jitter inf", "--jitter"},
      {"--methods ,", "--methods"},
      {"--methods ''", "--methods"},
      {"--methods ddp,adam", "--methods"},
  };
  for (const auto& c : cases) {
    const auto r = run_command(sim + " " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.flag)) << c.args << "\n" << r.output;
    EXPECT_FALSE(contains(r.output, "ms/step")) << "printed results for " << c.args;
  }
}

TEST(Cli, PrepareRefusesToReplaceADatasetUnlessForced) {
  const auto dir = fresh_dir("prepare_twice");
  std::string text;
  for (int i = 0; i < 400; ++i) text += "line " + std::to_string(i) + " of some plain text\n";
  const auto first = write_text(dir / "first.txt", text);
  const auto second = write_text(dir / "second.txt", "another text\n" + text);
  const std::string out = (dir / "data").string();
  const auto a = run_command(cli() + " prepare --source " + first.string() + " --out " + out);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string description = read_text(dir / "data" / "dataset.toml");
  const auto b = run_command(cli() + " prepare --source " + second.string() + " --out " + out);
  EXPECT_EQ(b.exit_code, 2) << b.output;
  for (const char* needle : {"dataset.toml", "train_000.bin", "val.bin", "--force"})
    EXPECT_TRUE(contains(b.output, needle)) << needle << "\n" << b.output;
  EXPECT_TRUE(contains(b.output, out)) << b.output;
  EXPECT_EQ(read_text(dir / "data" / "dataset.toml"), description) << "the dataset was replaced";
  const auto c =
      run_command(cli() + " prepare --force --source " + second.string() + " --out " + out);
  EXPECT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(read_text(dir / "data" / "dataset.toml"), description);
}

TEST(Cli, PrepareRefusesBinaryInputUnlessAllowed) {
  const auto dir = fresh_dir("prepare_binary");
  std::string bytes(64 * 1024, '\0');
  std::mt19937 gen(5);
  for (auto& b : bytes) b = static_cast<char>(gen() & 0xff);
  const auto binary = write_text(dir / "random.bin", bytes);
  const std::string out = (dir / "data").string();
  const auto r = run_command(cli() + " prepare --source " + binary.string() + " --out " + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, binary.string())) << r.output;
  EXPECT_TRUE(contains(r.output, "% of its bytes are not text")) << r.output;
  EXPECT_TRUE(contains(r.output, "--allow-binary")) << r.output;
  EXPECT_FALSE(fs::exists(dir / "data" / "dataset.toml"));
  const auto forced =
      run_command(cli() + " prepare --allow-binary --source " + binary.string() + " --out " + out);
  EXPECT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_TRUE(contains(forced.output, "are not text")) << forced.output;
  // Text with a stray byte or two passes, with a warning that counts them.
  std::string text;
  for (int i = 0; i < 400; ++i) text += "line " + std::to_string(i) + " of some plain text\n";
  text[100] = '\xff';
  const auto mostly = write_text(dir / "mostly.txt", text);
  const auto m = run_command(cli() + " prepare --source " + mostly.string() + " --out " +
                             (dir / "data2").string());
  EXPECT_EQ(m.exit_code, 0) << m.output;
  EXPECT_TRUE(contains(m.output, "1 of its")) << m.output;
}

// ---------------------------------------------------------------- issue 18: messages

TEST(Cli, UnknownSubcommandIsNamedWithTheValidOnes) {
  const auto r = run_command(cli() + " tarin -c job.toml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "unknown command 'tarin'")) << r.output;
  for (const char* cmd : {"prepare", "train", "launch", "coordinator", "worker", "plan", "simulate",
                          "profile", "config", "report"})
    EXPECT_TRUE(contains(r.output, cmd)) << cmd << "\n" << r.output;
  EXPECT_FALSE(contains(r.output, "A subcommand is required")) << r.output;
  EXPECT_TRUE(contains(r.output, "did you mean 'train'")) << r.output;
}

TEST(Cli, WorkerRankMustBeAValidIndex) {
  const auto dir = fresh_dir("cli_rank");
  const auto cfg = write_text(dir / "job.toml", job_without_data(dir / "out") +
                                                    "[job]\nsites = [\"west\"]\ntoken = \"t\"\n");
  for (const std::string args : {"--site west --rank -1", "--rank -1"}) {
    const auto r = run_command(cli() + " worker -c " + cfg.string() + " " + args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "--rank: must be a whole number")) << r.output;
    EXPECT_TRUE(contains(r.output, "got -1")) << r.output;
    EXPECT_FALSE(contains(r.output, "give both")) << r.output;
  }
  const auto big = run_command(cli() + " worker -c " + cfg.string() + " --site west --rank 1");
  EXPECT_EQ(big.exit_code, 2) << big.output;
  EXPECT_TRUE(contains(big.output, "job.ranks_per_site = 1")) << big.output;
}

TEST(Cli, PrepareShardTokensZeroSaysWhatIsWrong) {
  const auto r = run_command(cli() + " prepare --shard-tokens 0");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--shard-tokens")) << r.output;
  EXPECT_TRUE(contains(r.output, "at least 1")) << r.output;
  EXPECT_FALSE(contains(r.output, "0.000000")) << r.output;
}

TEST(Cli, ResumingAFinishedRunSaysThereIsNothingToDo) {
  ASSERT_TRUE(have_prepared_corpus());
  const auto dir = fresh_dir("cli_finished");
  const auto cfg = write_text(dir / "job.toml", tiny_job_toml(dir / "out"));
  const auto first = run_command(cli() + " train --no-progress -c " + cfg.string());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto again = run_command(cli() + " train --no-progress -c " + cfg.string() + " --resume");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "nothing to do: the run already finished at step 20"))
      << again.output;
  EXPECT_FALSE(contains(again.output, "final train loss")) << again.output;
}

TEST(Cli, ValidationLossAboveTheUnigramEntropySaysAbove) {
  ASSERT_TRUE(have_prepared_corpus());
  const auto dir = fresh_dir("cli_above");
  std::string toml = tiny_job_toml(dir / "out");
  toml.replace(toml.find("steps = 20"), 10, "steps = 1");  // loss near ln 256, above 3.1
  const auto cfg = write_text(dir / "job.toml", toml);
  const auto r = run_command(cli() + " train --no-progress -c " + cfg.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "% above the unigram entropy")) << r.output;
  EXPECT_FALSE(contains(r.output, "(-")) << "a negative percentage in\n" << r.output;
}

TEST(Cli, WorkerStoppedDuringStartupExits130) {
  const auto dir = fresh_dir("cli_startup_stop");
  const auto cfg = write_text(dir / "job.toml", tiny_job_toml(dir / "out") +
                                                    "[job]\nsites = [\"west\", \"east\"]\n"
                                                    "token = \"t\"\nrendezvous_timeout_s = 60\n");
  // Port 1: nobody listens, so the worker keeps trying to register (start-up).
  Process w = Process::start({DESLOC_CLI, "worker", "-c", cfg.string(), "--site", "west", "--rank",
                              "0", "--coordinator", "127.0.0.1:1", "--no-progress"},
                             dir / "worker.log");
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < end && !contains(w.output(), "registering"))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ::kill(w.pid, SIGTERM);
  EXPECT_EQ(w.wait(std::chrono::seconds(20)), 130) << w.output();
  EXPECT_TRUE(contains(w.output(), "outside the training loop")) << w.output();
}

// Disabled until launch.cpp treats the ranks it stops as stopped: a rank that gets launch's
// SIGTERM before its main() has installed the start-up handler still dies by the signal (143),
// and launch calls that a failure ("job failed", exit 1), sometimes only after waiting out
// transport.deadline_s for a peer of the dropped site. Passes about half the time today.
TEST(Cli, LaunchStoppedDuringStartupExits130) {
  const auto dir = fresh_dir("cli_launch_stop");
  const auto cfg = write_text(dir / "job.toml", tiny_job_toml(dir / "out") +
                                                    "[job]\nsites = [\"west\", \"east\"]\n"
                                                    "rendezvous_timeout_s = 60\n");
  Process l = Process::start({DESLOC_CLI, "launch", "-c", cfg.string()}, dir / "launch.log");
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < end && !contains(l.output(), "processes on this"))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(l.pid, SIGINT);
  EXPECT_EQ(l.wait(std::chrono::seconds(60)), 130) << l.output();
  EXPECT_FALSE(contains(l.output(), "job failed")) << l.output();
}

TEST(Cli, EveryCommandHasHelp) {
  for (const char* cmd : {"prepare", "train", "launch", "coordinator", "worker", "profile",
                          "config", "plan", "simulate", "report", "export", "sample"}) {
    const auto r = run_command(cli() + " " + cmd + " --help");
    EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "Usage")) << r.output;
  }
  const auto p = run_command(cli() + " prepare --help");
  for (const char* flag : {"--force", "--allow-binary"})
    EXPECT_TRUE(contains(p.output, flag)) << flag << "\n" << p.output;
}

// Issue 15, item 4: a plan says where its periods leave convergence, warns past the validated
// Kx <= 256, and --auto prices blocking and delayed averages with fp32, int8 and int4 side by
// side before settling for a long period.
TEST(Cli, PlanWarnsBeyondTheValidatedPeriodsAndAutoPricesTheAlternatives) {
  const auto dir = fresh_dir("plan_auto");
  std::string topo = "[meta]\nsource = \"test\"\n";
  for (const char* s : {"west", "east"})
    topo += std::string("[[site]]\nname = \"") + s + "\"\nstep_ms = 50\n";
  topo +=
      "[[link]]\nfrom = \"west\"\nto = \"east\"\nbandwidth_mbit = 1\nlatency_ms = 20\n"
      "[[link]]\nfrom = \"east\"\nto = \"west\"\nbandwidth_mbit = 1\nlatency_ms = 20\n";
  write_text(dir / "topology.toml", topo);
  const std::string job = set_key(tiny_job_toml(dir / "out"), "train", "steps", "100000") +
                          "[job]\nsites = [\"west\", \"east\"]\n";
  write_text(dir / "job.toml", job);
  const std::string args = " --topology " + (dir / "topology.toml").string() + " --config " +
                           (dir / "job.toml").string();
  const auto r = run_command(cli() + " plan" + args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "convergence: Kx = ")) << r.output;
  EXPECT_TRUE(contains(r.output, "beyond the validated Kx <= 256")) << r.output;
  EXPECT_TRUE(contains(r.output, "warning: Kx = ")) << r.output;
  EXPECT_TRUE(contains(r.output, "train nearly alone")) << r.output;

  const fs::path out = dir / "auto.toml";
  const auto a = run_command(cli() + " plan --auto" + args + " --out " + out.string());
  EXPECT_EQ(a.exit_code, 0) << a.output;
  EXPECT_TRUE(contains(a.output, "alternatives priced (--auto)")) << a.output;
  for (const char* row : {"blocking  fp32", "blocking  int4", "delayed   fp32", "delayed   int8"})
    EXPECT_TRUE(contains(a.output, row)) << row << "\n" << a.output;
  EXPECT_TRUE(contains(a.output, "<- chosen")) << a.output;
  EXPECT_FALSE(contains(a.output, "chose blocking averages with fp32")) << a.output;
  // The chosen plan's period is shorter than blocking fp32's, and its fragment is a valid job.
  const std::string fragment = read_text(out);
  EXPECT_TRUE(contains(fragment, "codec_x = ")) << fragment;
  write_text(dir / "planned.toml", tiny_job_toml(dir / "out") + fragment);
  const auto check = run_command(cli() + " config --check " + (dir / "planned.toml").string());
  EXPECT_EQ(check.exit_code, 0) << check.output << "\n" << fragment;

  // On a fast link blocking fp32 is within the validated periods and stays.
  std::string fast = topo;
  for (std::size_t at; (at = fast.find("bandwidth_mbit = 1\n")) != std::string::npos;)
    fast.replace(at, 19, "bandwidth_mbit = 10000\n");
  write_text(dir / "topology.toml", fast);
  const auto f = run_command(cli() + " plan --auto" + args);
  EXPECT_EQ(f.exit_code, 0) << f.output;
  EXPECT_TRUE(contains(f.output, "chose blocking averages with fp32")) << f.output;
  EXPECT_FALSE(contains(f.output, "warning:")) << f.output;
  // --auto and --delayed are two answers to one question.
  EXPECT_NE(run_command(cli() + " plan --auto --delayed" + args).exit_code, 0);
}

// Issue 15, items 1 and 4: plan proposes regions from the bandwidth matrix, with its reasons,
// and prices hierarchical DES-LOC over them beside the flat plan; its keys make a config that
// loads.
TEST(Cli, PlanProposesRegionsFromTheBandwidthMatrix) {
  const auto dir = fresh_dir("plan_regions");
  const std::vector<std::string> sites = {"a1", "a2", "b1", "b2"};
  std::string topo = "[meta]\nsource = \"test\"\n";
  for (const auto& s : sites) topo += "[[site]]\nname = \"" + s + "\"\nstep_ms = 50\n";
  for (const auto& x : sites)
    for (const auto& y : sites)
      if (x != y)
        topo += "[[link]]\nfrom = \"" + x + "\"\nto = \"" + y +
                "\"\nbandwidth_mbit = " + (x[0] == y[0] ? "1000" : "20") + "\nlatency_ms = 5\n";
  write_text(dir / "topology.toml", topo);
  write_text(dir / "job.toml", set_key(tiny_job_toml(dir / "out"), "train", "steps", "10000") +
                                   "[job]\nsites = [\"a1\", \"a2\", \"b1\", \"b2\"]\n");
  const auto r = run_command(cli() + " plan --topology " + (dir / "topology.toml").string() +
                             " --config " + (dir / "job.toml").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "regions: proposed 2 regions: [a1, a2] [b1, b2]")) << r.output;
  EXPECT_TRUE(contains(r.output, "50.0x apart")) << r.output;
  EXPECT_TRUE(contains(r.output, "hierarchical: regions [a1, a2] [b1, b2]")) << r.output;
  const auto at = r.output.find("# hierarchical DES-LOC");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string fragment = r.output.substr(at);
  std::smatch kx, region_kx;
  ASSERT_TRUE(std::regex_search(fragment, kx, std::regex("\nkx = (\\d+)"))) << fragment;
  ASSERT_TRUE(std::regex_search(fragment, region_kx, std::regex("region_kx = (\\d+)"))) << fragment;
  EXPECT_LT(std::stoll(region_kx[1]), std::stoll(kx[1]));
  EXPECT_EQ(std::stoll(kx[1]) % std::stoll(region_kx[1]), 0);
  write_text(dir / "hierarchical.toml",
             set_key(tiny_job_toml(dir / "out"), "train", "steps", "10000") +
                 "[sync]\nmethod = \"desloc\"\nkx = " + kx[1].str() +
                 "\nregion_kx = " + region_kx[1].str() +
                 "\n[job]\nsites = [\"a1\", \"a2\", \"b1\", \"b2\"]\n"
                 "regions = [[\"a1\", \"a2\"], [\"b1\", \"b2\"]]\n");
  const auto check = run_command(cli() + " config --check " + (dir / "hierarchical.toml").string());
  EXPECT_EQ(check.exit_code, 0) << check.output;

  // --delayed on the config's own regions (issue 43), with 1 Mbit between them: one whole
  // hierarchical streaming plan, which --out writes and which loads as it is.
  std::string slow = topo;
  for (std::size_t at; (at = slow.find("bandwidth_mbit = 20\n")) != std::string::npos;)
    slow.replace(at, 20, "bandwidth_mbit = 1\n");
  write_text(dir / "slow.toml", slow);
  write_text(dir / "regional.toml", set_key(tiny_job_toml(dir / "out"), "train", "steps", "10000") +
                                        "[sync]\nmethod = \"desloc\"\nkx = 16\nregion_kx = 8\n"
                                        "[job]\nsites = [\"a1\", \"a2\", \"b1\", \"b2\"]\n"
                                        "regions = [[\"a1\", \"a2\"], [\"b1\", \"b2\"]]\n");
  const auto d = run_command(cli() + " plan --delayed --topology " + (dir / "slow.toml").string() +
                             " --config " + (dir / "regional.toml").string() + " --out " +
                             (dir / "planned.toml").string());
  EXPECT_EQ(d.exit_code, 0) << d.output;
  EXPECT_TRUE(contains(d.output, "DES-LOC (docs/sync.md): instead of the fragment above"))
      << d.output;
  EXPECT_TRUE(contains(d.output, "planned again with the regions' averages")) << d.output;
  std::ifstream planned_file(dir / "planned.toml");
  const std::string planned{std::istreambuf_iterator<char>(planned_file), {}};
  for (const char* key : {"overlap = \"delayed\"", "region_kx = ", "regions = [[\"a1\""})
    EXPECT_TRUE(contains(planned, key)) << key << "\n" << planned;
  write_text(dir / "planned_job.toml",
             set_key(tiny_job_toml(dir / "out"), "train", "steps", "10000") + planned);
  const auto dcheck = run_command(cli() + " config --check " + (dir / "planned_job.toml").string());
  EXPECT_EQ(dcheck.exit_code, 0) << dcheck.output << "\n" << planned;
}
