// The memory estimate: its closed forms against the model's own layout, the refusal message
// with its figures and keys, and sizes whose byte counts would overflow 64 bits.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <string>

#include "desloc/core/error.hpp"
#include "desloc/model/model.hpp"
#include "desloc/model/param_layout.hpp"
#include "desloc/train/config.hpp"
#include "desloc/train/memory_estimate.hpp"

using namespace desloc;
using train::ProcessRole;

namespace {

train::JobConfig job(const std::string& text) { return train::parse_config(text, "job.toml"); }

std::string refusal(const train::JobConfig& cfg, ProcessRole role, int processes, double bytes) {
  try {
    train::check_memory(cfg, role, processes, {bytes, "a test figure"});
  } catch (const ConfigError& e) {
    return e.message();
  }
  return "<no error>";
}

}  // namespace

TEST(MemoryEstimate, ParameterCountIsTheLayoutsTotal) {
  for (const auto& [V, T, L, H, C] :
       {std::array<int, 5>{256, 128, 4, 4, 128}, std::array<int, 5>{50257, 1024, 12, 12, 768},
        std::array<int, 5>{7, 3, 1, 1, 5}}) {
    const model::GptConfig m{V, T, L, H, C};
    EXPECT_EQ(model::parameter_count(m), static_cast<double>(model::ParamLayout(m).total()));
  }
}

TEST(MemoryEstimate, PartsFollowTheirClosedForms) {
  // 2 sites of 3 in-process ranks, CPU backend: every part below is a multiple of P floats,
  // except the activations.
  const auto cfg =
      job("[model]\nlayers = 2\nd_model = 64\nheads = 4\ncontext = 32\n"
          "[data]\nbatch = 8\n[sync]\nworkers = 2\n[job]\nranks_per_site = 3\n");
  const double P = model::parameter_count(cfg.model);
  const double act = model::cpu_activation_floats(cfg.model, 8);
  const auto e = train::estimate_memory(cfg, ProcessRole::kInProcess);
  EXPECT_EQ(e.parameters, P);
  // Held throughout: model params + grads (2P), x g u v per site (8P), per-rank gradients (6P),
  // activations; at the peak a checkpoint write of 3 copies of x u v per site (18P).
  EXPECT_DOUBLE_EQ(e.bytes(), 4.0 * (2 * P + 8 * P + 6 * P + act + 18 * P));
  for (std::size_t i = 1; i < e.parts.size(); ++i)
    EXPECT_GE(e.parts[i - 1].bytes, e.parts[i].bytes) << "parts are largest first";
  // One networked rank of an elastic job: one site's replica, two snapshots of x u v (6P).
  const auto rank = train::estimate_memory(cfg, ProcessRole::kRank);
  EXPECT_DOUBLE_EQ(rank.bytes(), 4.0 * (2 * P + 4 * P + act + 6 * P + 9 * P));
}

TEST(MemoryEstimate, RefusalNamesTheFiguresAndTheKeys) {
  const auto cfg = job("[model]\nlayers = 100000\n");
  const double need = train::estimate_memory(cfg, ProcessRole::kInProcess).bytes();
  EXPECT_EQ(refusal(cfg, ProcessRole::kInProcess, 1, need), "<no error>");
  const std::string m = refusal(cfg, ProcessRole::kInProcess, 1, need / 2);
  EXPECT_EQ(m.rfind("job.toml: the job needs about ", 0), 0u) << m;
  EXPECT_NE(m.find(train::format_bytes(need)), std::string::npos) << m;
  EXPECT_NE(m.find(train::format_bytes(need / 2) + " available (a test figure)"), std::string::npos)
      << m;
  EXPECT_NE(m.find("model.layers = 100000"), std::string::npos) << m;
  // launch: every rank on one machine.
  const auto two = job("[job]\nsites = [\"a\", \"b\"]\nranks_per_site = 2\n");
  const double rank = train::estimate_memory(two, ProcessRole::kRank).bytes();
  EXPECT_EQ(refusal(two, ProcessRole::kRank, 4, 4 * rank), "<no error>");
  EXPECT_NE(refusal(two, ProcessRole::kRank, 4, 3 * rank).find("its 4 processes on this machine"),
            std::string::npos);
  // An unknown figure refuses nothing.
  EXPECT_EQ(refusal(cfg, ProcessRole::kInProcess, 1, 0), "<no error>");
}

TEST(MemoryEstimate, SizesBeyondSixtyFourBitsDoNotWrap) {
  // 12 C^2 L floats of 4 bytes with C = 5e8 is 2.4e19 bytes, more than 2^64.
  const auto cfg = job("[model]\nd_model = 500000000\nheads = 1\nlayers = 2\n");
  const auto e = train::estimate_memory(cfg, ProcessRole::kInProcess);
  EXPECT_TRUE(std::isfinite(e.bytes()));
  EXPECT_GT(e.bytes(), 1.8e19);
  EXPECT_NE(refusal(cfg, ProcessRole::kInProcess, 1, 64e9).find("model.d_model = 500000000"),
            std::string::npos);
  // The layout itself refuses rather than overflow its int shapes.
  EXPECT_THROW(model::ParamLayout(cfg.model), ConfigError);
  const auto ctx = job("[model]\ncontext = 2000000000\n[data]\nbatch = 2000000000\n");
  EXPECT_TRUE(std::isfinite(train::estimate_memory(ctx, ProcessRole::kRank).bytes()));
}

TEST(MemoryEstimate, AvailableMemoryIsKnownHere) {
  const auto a = train::available_memory();
  EXPECT_GT(a.bytes, 0) << a.source;
  EXPECT_FALSE(a.source.empty());
  EXPECT_EQ(train::format_bytes(41.2 * 1024 * 1024 * 1024), "41.2 GiB");
  EXPECT_EQ(train::format_bytes(512), "512 B");
}
