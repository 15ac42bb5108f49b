// Every pair of sync features, as the table of `desloc config --features` has it (one test per
// pair, in the manner of the collective conformance suite):
//   - a pair the table refuses is refused at load, with the table's reason;
//   - a pair that works loads, trains in one process, and, where a networked form exists,
//     `desloc launch` reproduces the in-process run bit for bit: every site's loss at every
//     step, the validation losses and every site's final x, u, v and optimizer step.
// A feature added to the table without a way to turn it on here fails
// EveryFeatureOfTheTableIsTurnedOnHere.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cluster_env.hpp"
#include "desloc/core/error.hpp"
#include "desloc/train/checkpoint.hpp"
#include "desloc/train/config.hpp"
#include "test_env.hpp"

namespace desloc::test {
namespace {

using Sections = std::map<std::string, std::map<std::string, std::string>>;  // table -> key -> TOML

constexpr int kSteps = 16;
const std::vector<std::string> kSites{"west", "east", "north"};

// 3 sites, DES-LOC with x every 2 steps, u every 4, v every 8.
Sections base() {
  return {{"sync", {{"method", "\"desloc\""}, {"kx", "2"}, {"ku", "4"}, {"kv", "8"}}},
          {"job", {{"sites", "[\"west\", \"east\", \"north\"]"}, {"token", "\"features\""}}}};
}

// How the suite turns each feature of the table on (on top of base()). `erase`: keys the
// feature's settings make invalid.
struct TurnOn {
  std::map<std::string, std::map<std::string, std::string>> set;
  std::vector<std::string> erase;  // "sync.ku"
  bool networked = true;           // has a multi-process form
};
const std::map<std::string, TurnOn>& turn_on() {
  static const std::map<std::string, TurnOn> m = {
      {"no parameter average",
       {{{"sync", {{"method", "\"ddp\""}}}}, {"sync.kx", "sync.ku", "sync.kv"}}},
      {"favg_reset", {{{"sync", {{"method", "\"favg_reset\""}}}}, {"sync.ku", "sync.kv"}}},
      {"step overlap", {{{"sync", {{"overlap", "\"step\""}}}}, {}}},
      {"delayed averages", {{{"sync", {{"overlap", "\"delayed\""}, {"delay", "1"}}}}, {}}},
      {"fragments", {{{"sync", {{"fragments", "2"}}}}, {}}},
      {"codecs", {{{"sync", {{"codec_x", "\"int8\""}}}}, {}}},
      {"error feedback", {{{"sync", {{"codec_x", "\"int8\""}, {"error_feedback", "true"}}}}, {}}},
      {"outer step", {{{"sync", {{"outer", "\"nesterov\""}}}}, {}}},
      {"regions",
       {{{"sync", {{"region_kx", "1"}, {"region_ku", "2"}, {"region_kv", "4"}}},
         {"job", {{"regions", "[[\"west\", \"east\"], [\"north\"]]"}}}},
        {}}},
      {"period switches", {{{"sync", {{"switches", "[{ after = 8, kx = 4 }]"}}}}, {}}},
      {"re-planning",
       // A drift of 10^5 never happens: the networked run switches nothing, as in one process.
       {{{"sync", {{"replan", "true"}, {"replan_drift", "100000"}}}}, {}}},
      {"elastic join",
       {{{"sync", {{"join_step", "6"}, {"join_workers", "4"}}}}, {}, /*networked=*/false}},
  };
  return m;
}

void apply(Sections& s, const TurnOn& t) {
  for (const auto& key : t.erase) {
    const auto dot = key.find('.');
    s[key.substr(0, dot)].erase(key.substr(dot + 1));
  }
  for (const auto& [table, keys] : t.set)
    for (const auto& [k, v] : keys) s[table][k] = v;
}

// The tiny job of the integration tests, with `extra`'s tables merged in.
std::string job_toml(const fs::path& out, const Sections& extra) {
  std::string toml = with_steps(tiny_job_toml(out), kSteps);
  toml.replace(toml.find("eval_every = 10"), 15, "eval_every = 8");
  toml.replace(toml.find("checkpoint_every = 0"), 20, "checkpoint_every = 8");
  for (const auto& [table, keys] : extra) {
    toml += "[" + table + "]\n";
    for (const auto& [k, v] : keys) toml += k + " = " + v + "\n";
  }
  return toml + "[transport]\ndeadline_s = 20\n";
}

struct Pair {
  std::string a, b;
};
void PrintTo(const Pair& p, std::ostream* os) { *os << p.a << " with " << p.b; }
std::vector<Pair> all_pairs() {
  std::vector<Pair> out;
  const auto names = train::sync_feature_names();
  for (std::size_t i = 0; i < names.size(); ++i)
    for (std::size_t j = i + 1; j < names.size(); ++j) out.push_back({names[i], names[j]});
  return out;
}

std::string test_name(const Pair& p) {
  std::string out;
  for (const std::string& part : {p.a, std::string("_with_"), p.b})
    for (char c : part) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

// The final state of every site (x, u, v and the optimizer step) in `dir`'s run, as one
// process holds them (train) or as each site's rank 0 wrote them (launch).
std::vector<train::SiteState> final_sites(const fs::path& run, bool launched) {
  std::vector<train::SiteState> out;
  for (std::size_t s = 0; s < kSites.size(); ++s) {
    if (!launched && s > 0) break;
    const fs::path dir = !launched || s == 0 ? run : run / "ranks" / (kSites[s] + "-0");
    auto ck =
        train::load_checkpoint(train::checkpoint_path((dir / "checkpoints").string(), kSteps));
    for (auto& w : ck.sites) out.push_back(std::move(w));
  }
  return out;
}

// The job of `sections` in `dir` loads, trains in one process, and where `networked`,
// `desloc launch` reproduces it bit for bit.
void expect_trains_and_launch_equals_train(const fs::path& dir, const Sections& sections,
                                           bool networked) {
  const fs::path cfg = write_text(dir / "job.toml", job_toml(dir / "run", sections));
  ASSERT_NO_THROW(train::load_config(cfg.string())) << read_text(cfg);
  const auto trained = run_command(std::string(DESLOC_CLI) + " train --no-progress --config " +
                                   cfg.string() + " --out-dir " + (dir / "train").string());
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  if (!networked) return;
  const auto launched = run_command(std::string(DESLOC_CLI) + " launch --quiet --config " +
                                    cfg.string() + " --out-dir " + (dir / "launch").string());
  ASSERT_EQ(launched.exit_code, 0) << launched.output;
  EXPECT_EQ(train_field(dir / "launch" / "metrics.jsonl", "val_loss"),
            train_field(dir / "train" / "metrics.jsonl", "val_loss"));
  const auto one = final_sites(dir / "train", false), many = final_sites(dir / "launch", true);
  ASSERT_EQ(one.size(), kSites.size());
  ASSERT_EQ(many.size(), kSites.size());
  for (std::size_t s = 0; s < kSites.size(); ++s) {
    const auto& x = one[s];
    const auto& y = many[s];
    ASSERT_EQ(x.params.size(), y.params.size());
    const std::size_t bytes = x.params.size() * sizeof(float);
    EXPECT_EQ(0, std::memcmp(x.params.data(), y.params.data(), bytes)) << kSites[s] << " x";
    EXPECT_EQ(0, std::memcmp(x.u.data(), y.u.data(), bytes)) << kSites[s] << " u";
    EXPECT_EQ(0, std::memcmp(x.v.data(), y.v.data(), bytes)) << kSites[s] << " v";
    EXPECT_EQ(x.optim_t, y.optim_t) << kSites[s];
  }
}

class SyncFeatures : public ::testing::TestWithParam<Pair> {};

TEST_P(SyncFeatures, ThePairIsRefusedWithTheTablesReasonOrTrainsAndLaunchEqualsTrain) {
  const Pair& p = GetParam();
  const auto conflict = train::sync_feature_conflict(p.a, p.b);
  if (conflict && conflict->starts_with("two values of"))
    GTEST_SKIP() << p.a << " and " << p.b << " are " << *conflict << ": no config sets both";
  const auto a = turn_on().find(p.a), b = turn_on().find(p.b);
  ASSERT_TRUE(a != turn_on().end() && b != turn_on().end())
      << "no way to turn on " << p.a << " or " << p.b;
  Sections sections = base();
  apply(sections, a->second);
  apply(sections, b->second);
  const fs::path dir = fresh_dir("features_" + test_name(p));
  const fs::path cfg = write_text(dir / "job.toml", job_toml(dir / "run", sections));
  bool networked = a->second.networked && b->second.networked;
  if (conflict) {
    try {
      train::load_config(cfg.string());
      ADD_FAILURE() << "the table refuses " << p.a << " with " << p.b << ", the loader not:\n"
                    << read_text(cfg);
    } catch (const ConfigError& e) {
      EXPECT_NE(e.message().find(*conflict), std::string::npos) << e.message();
    }
    // A pair that works with a third feature on: the three train, and launch equals train.
    const auto unless = train::sync_feature_unless(p.a, p.b);
    if (!unless) return;
    const auto c = turn_on().find(*unless);
    ASSERT_NE(c, turn_on().end()) << "no way to turn on " << *unless;
    apply(sections, c->second);
    networked = networked && c->second.networked;
  }
  expect_trains_and_launch_equals_train(dir, sections, networked);
}

INSTANTIATE_TEST_SUITE_P(Pairs, SyncFeatures, ::testing::ValuesIn(all_pairs()),
                         [](const auto& info) { return test_name(info.param); });

TEST(SyncFeatureTable, EveryFeatureOfTheTableIsTurnedOnHere) {
  for (const std::string& name : train::sync_feature_names())
    EXPECT_TRUE(turn_on().contains(name)) << "no way to turn on '" << name << "' in this suite";
}

// docs/sync.md shows the table `desloc config --features` prints, as it prints it.
TEST(SyncFeatureTable, TheDocsShowTheTableTheCommandPrints) {
  const auto printed = run_command(std::string(DESLOC_CLI) + " config --features");
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  EXPECT_EQ(printed.output, train::sync_feature_table());
  const std::string docs = read_text(fs::path(DESLOC_SOURCE_DIR) / "docs" / "sync.md");
  EXPECT_NE(docs.find(printed.output), std::string::npos)
      << "docs/sync.md does not hold the table `desloc config --features` prints:\n"
      << printed.output;
}

}  // namespace
}  // namespace desloc::test
