// The single-site training loop.
#include "desloc/train/trainer.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <limits>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"
#include "desloc/data/loader.hpp"
#include "desloc/model/model.hpp"
#include "desloc/optim/optimizer.hpp"
#include "desloc/train/checkpoint.hpp"
#include "train/metrics.hpp"
#include "train/progress.hpp"

namespace desloc::train {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// Installs SIGINT/SIGTERM handlers for the duration of a run, restoring the old ones after.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt::format("{:.7g}", v);
}

float evaluate(model::Model& m, const data::EvalLoader& eval, int batches, int B, int T) {
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tgt(in.size());
  const std::uint64_t n =
      std::min<std::uint64_t>(static_cast<std::uint64_t>(batches), eval.num_batches());
  if (n == 0) return std::numeric_limits<float>::quiet_NaN();
  double sum = 0.0;
  for (std::uint64_t i = 0; i < n; ++i) {
    eval.batch(i, in, tgt);
    sum += m.forward({in, tgt, B, T});
  }
  return static_cast<float>(sum / double(n));
}

}  // namespace

std::string metrics_path(const JobConfig& cfg) {
  return (std::filesystem::path(cfg.train.out_dir) / "metrics.jsonl").string();
}
std::string checkpoint_dir(const JobConfig& cfg) {
  return (std::filesystem::path(cfg.train.out_dir) / "checkpoints").string();
}

TrainResult run_training(const JobConfig& cfg, const TrainOptions& opts) {
  using clock = std::chrono::steady_clock;
  const int B = cfg.data.batch;
  const int T = cfg.seq_len();
  const std::int64_t total = cfg.train.steps;

  const data::DatasetInfo dataset = data::load_dataset(cfg.data.dir);
  if (static_cast<int>(dataset.vocab) > cfg.model.vocab)
    throw ConfigError(
        fmt::format("{}: model.vocab = {} is smaller than the dataset's vocabulary {} ({})",
                    cfg.source, cfg.model.vocab, dataset.vocab, cfg.data.dir));

  auto model = model::make_model(cfg.model, {cfg.train.backend, cfg.train.threads, B, 0});
  const auto& layout = model->layout();
  optim::Optimizer optimizer(cfg.optim, layout);
  data::DataLoader loader(dataset, B, T, cfg.data.seed, /*worker=*/0, /*num_workers=*/1);
  const data::EvalLoader eval(dataset, B, T);

  TrainResult result;
  result.unigram_entropy_nats = dataset.unigram_entropy_nats;
  result.last_val_loss = std::numeric_limits<float>::quiet_NaN();
  std::uint64_t tokens_seen = 0;
  const std::string ckpt_dir = checkpoint_dir(cfg);

  if (opts.resume) {
    auto found = find_latest_checkpoint(ckpt_dir);
    if (!found)
      throw DataError("--resume: no valid checkpoint in '" + ckpt_dir +
                      "'; run without --resume to start fresh");
    Checkpoint& ck = found->checkpoint;
    if (ck.config_hash != cfg.hash())
      throw ConfigError(
          fmt::format("--resume: checkpoint '{}' was written by a job with config hash {:016x}, "
                      "but {} hashes to {:016x}; "
                      "a change to the model, optimizer, schedule, data order, seeds or step count "
                      "cannot resume bit-exactly. "
                      "Restore the original config or use a new train.out_dir",
                      found->path, ck.config_hash, cfg.source, cfg.hash()));
    if (ck.params.size() != layout.total())
      throw DataError(fmt::format("'{}' holds {} parameters; the model has {}", found->path,
                                  ck.params.size(), layout.total()));
    std::copy(ck.params.begin(), ck.params.end(), model->params().begin());
    model->params_updated();
    optimizer.state().u = std::move(ck.u);
    optimizer.state().v = std::move(ck.v);
    optimizer.state().t = ck.optim_t;
    loader.restore(ck.loader);
    tokens_seen = ck.tokens_seen;
    result.start_step = ck.step;
    log::info("resumed from {} at step {}", found->path, ck.step);
  } else {
    model::init_params(layout, cfg.model, cfg.train.seed, model->params());
    model->params_updated();
  }

  MetricsWriter metrics(metrics_path(cfg), opts.resume, result.start_step);
  const bool tty = opts.progress == 1 || (opts.progress == -1 && ::isatty(STDERR_FILENO));
  ProgressReporter progress(result.start_step, total, tty, cfg.train.log_every);
  if (!opts.resume) {
    progress.message(fmt::format(
        "desloc train: {} parameters ({} backend), B={} T={}, {} steps, {} train / {} val tokens, "
        "unigram entropy {:.4f} nats",
        layout.total(), model->backend_name(), B, T, total, dataset.train_tokens,
        dataset.val_tokens, dataset.unigram_entropy_nats));
  }

  auto save = [&](std::int64_t step) {
    Checkpoint ck;
    ck.config_hash = cfg.hash();
    ck.step = step;
    ck.optim_t = optimizer.state().t;
    ck.loader = loader.state();
    ck.tokens_seen = tokens_seen;
    ck.params.assign(model->params().begin(), model->params().end());
    ck.u = optimizer.state().u;
    ck.v = optimizer.state().v;
    const std::string path = checkpoint_path(ckpt_dir, step);
    save_checkpoint(path, ck);
    result.last_checkpoint = path;
  };
  auto run_eval = [&](std::int64_t step) {
    const auto t0 = clock::now();
    const float val = evaluate(*model, eval, cfg.train.eval_batches, B, T);
    const double secs = std::chrono::duration<double>(clock::now() - t0).count();
    result.last_val_loss = val;
    metrics.write_line(fmt::format(R"({{"type":"eval","step":{},"val_loss":{},"eval_s":{}}})", step,
                                   json_number(val), json_number(secs)));
    progress.message(fmt::format("step {}/{}: val_loss {:.4f} (unigram entropy {:.4f})", step,
                                 total, val, dataset.unigram_entropy_nats));
  };

  StopSignals signals;
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(B) * T), targets(inputs.size());
  const std::uint64_t tokens_per_step =
      static_cast<std::uint64_t>(B) * static_cast<std::uint64_t>(T);
  const auto run_start = clock::now();
  std::int64_t step = result.start_step;
  while (step < total) {
    if (opts.stop_after >= 0 && step >= opts.stop_after) break;
    if (g_stop_signal != 0) {
      progress.message(fmt::format("signal {} received: checkpointing at step {} and stopping",
                                   int(g_stop_signal), step));
      result.interrupted = true;
      break;
    }
    const auto t0 = clock::now();
    loader.next(inputs, targets);
    const float loss = model->forward_backward({inputs, targets, B, T});
    if (!std::isfinite(loss))
      throw Error(fmt::format(
          "loss is not finite ({}) at step {}; lower schedule.lr or enable optim.clip "
          "(last good checkpoint: {})",
          loss, step + 1, result.last_checkpoint.empty() ? "none" : result.last_checkpoint));
    auto grads = model->grads();
    const float grad_norm = optim::clip_gradient(grads, cfg.clip);
    const float lr = optim::learning_rate(cfg.schedule, step, total);
    optimizer.step(model->params(), grads, lr);
    model->params_updated();
    ++step;
    tokens_seen += tokens_per_step;
    const double step_s = std::chrono::duration<double>(clock::now() - t0).count();
    const double tps = double(tokens_per_step) / step_s;
    result.last_train_loss = loss;
    metrics.write_line(fmt::format(
        R"({{"type":"train","step":{},"loss":{},"lr":{},"grad_norm":{},"tokens_per_s":{},"step_ms":{},)"
        R"("tokens":{},"bytes_sent":0,"bytes_by_state":{{"grad":0,"x":0,"u":0,"v":0}}}})",
        step, json_number(loss), json_number(lr), json_number(grad_norm), json_number(tps),
        json_number(step_s * 1e3), tokens_seen));
    progress.step(step, loss, lr, tps);

    const bool last = step == total;
    if ((cfg.train.eval_every > 0 && step % cfg.train.eval_every == 0) || last) run_eval(step);
    if ((cfg.train.checkpoint_every > 0 && step % cfg.train.checkpoint_every == 0) || last)
      save(step);
  }
  if (step < total && step > result.start_step)
    save(step);  // stop_after or a signal: keep the work
  progress.finish();

  result.steps_done = step;
  const double secs = std::chrono::duration<double>(clock::now() - run_start).count();
  if (step > result.start_step && secs > 0)
    result.tokens_per_s = double(step - result.start_step) * double(tokens_per_step) / secs;
  return result;
}

}  // namespace desloc::train
