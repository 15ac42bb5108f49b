// The desloc CLI as a user meets it: help text, exit codes, and errors that name the file,
// line, column and key, with nothing overwritten.
#include <gtest/gtest.h>

#include "desloc/core/file_io.hpp"
#include "desloc/train/checkpoint.hpp"
#include "test_env.hpp"

using namespace desloc::test;

namespace {
std::string cli() { return std::string("'") + DESLOC_CLI + "'"; }
}  // namespace

TEST(Cli, HelpListsTheCommands) {
  const auto r = run_command(cli() + " --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* cmd : {"prepare", "train", "config", "launch", "coordinator", "worker", "plan"})
    EXPECT_NE(r.output.find(cmd), std::string::npos) << r.output;
  const auto t = run_command(cli() + " train --help");
  EXPECT_NE(t.output.find("--resume"), std::string::npos) << t.output;
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
