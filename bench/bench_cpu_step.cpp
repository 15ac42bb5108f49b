// bench_cpu_step: how fast is one CPU training step (forward + backward) of desloc's GPT,
// against PyTorch running the same model on the same weights, batch and thread count?
// Validates loss and gradients against the peer first; then interleaves timed chunks of both.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/model/model.hpp"
#include "harness.hpp"

namespace {

using desloc::bench::BenchError;
using desloc::bench::fmt;
using desloc::bench::Stats;
namespace dm = desloc::model;

struct SizeSpec {
  const char* name;
  int layers, heads, d_model;
};
// head_dim 32 throughout; the sizes span 4x in width so GEMM shapes go from latency- to
// throughput-bound on two cores.
constexpr SizeSpec kSizes[] = {
    {"small", 2, 2, 64},
    {"medium", 4, 4, 128},
    {"large", 6, 8, 256},
};

constexpr double kLossTol = 1e-4;  // relative
constexpr double kGradTol = 1e-4;  // relative L2 error per tensor
constexpr double kPeerTimeoutS = 300;
constexpr double kSettleS = 0.2;  // > OpenBLAS's idle-spin timeout (2^28 cycles, ~0.1 s)

struct Options {
  int threads = 2;
  int batch = 16;
  int seq = 128;
  int warmup = 3;
  int repeats = 20;
  int chunk = 5;       // steps per side before switching; rounds = repeats / chunk
  int torch_blas = 0;  // OpenBLAS pool inside torch; 0 = auto (the faster of threads and 1)
  std::vector<std::string> sizes = {"small", "medium", "large"};
  std::string python = "/usr/bin/python3";
  std::string peer = DESLOC_SOURCE_DIR "/bench/torch_step.py";
  bool keep = false;
};

void usage() {
  std::printf(
      "usage: bench_cpu_step [--threads N] [--repeats N] [--warmup N] [--chunk N]\n"
      "                      [--sizes small,medium,large] [--batch B] [--seq T]\n"
      "                      [--torch-blas auto|N] [--python PATH] [--peer PATH] [--keep]\n"
      "Times one training step (forward+backward) of desloc's CPU GPT against PyTorch on the\n"
      "same weights, batch and thread count, after validating loss and gradients.\n"
      "--torch-blas: threads of the OpenBLAS pool torch calls for GEMMs, next to its OpenMP\n"
      "pool of --threads; auto (default) times both --threads and 1 and keeps the faster.\n");
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t a = 0;
  while (a <= s.size()) {
    const std::size_t b = std::min(s.find(sep, a), s.size());
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    const std::size_t eq = a.find('=');
    auto value = [&]() -> std::string {
      if (eq != std::string::npos) return a.substr(eq + 1);
      if (i + 1 >= argc) throw BenchError(a + " needs a value");
      return argv[++i];
    };
    auto positive = [&](const std::string& key) {
      const std::string s = value();
      char* end = nullptr;
      const long n = std::strtol(s.c_str(), &end, 10);
      if (*end || n <= 0) throw BenchError(key + " must be a positive integer, got '" + s + "'");
      return static_cast<int>(n);
    };
    const std::string key = a.substr(0, eq);
    if (key == "--help" || key == "-h") {
      usage();
      std::exit(0);
    } else if (key == "--threads") {
      o.threads = positive(key);
    } else if (key == "--repeats") {
      o.repeats = positive(key);
    } else if (key == "--warmup") {
      o.warmup = positive(key);
    } else if (key == "--chunk") {
      o.chunk = positive(key);
    } else if (key == "--batch") {
      o.batch = positive(key);
    } else if (key == "--seq") {
      o.seq = positive(key);
    } else if (key == "--sizes") {
      o.sizes = split(value(), ',');
      for (const auto& s : o.sizes)
        if (std::none_of(std::begin(kSizes), std::end(kSizes),
                         [&](const SizeSpec& k) { return s == k.name; }))
          throw BenchError("--sizes: unknown size '" + s + "' (small, medium, large)");
    } else if (key == "--torch-blas") {
      if (eq != std::string::npos ? a.substr(eq + 1) == "auto"
                                  : (i + 1 < argc && std::string(argv[i + 1]) == "auto")) {
        if (eq == std::string::npos) ++i;
        o.torch_blas = 0;
      } else {
        o.torch_blas = positive(key);
      }
    } else if (key == "--python") {
      o.python = value();
    } else if (key == "--peer") {
      o.peer = value();
    } else if (key == "--keep") {
      o.keep = true;
    } else {
      usage();
      throw BenchError("unknown option '" + a + "'");
    }
  }
  return o;
}

// Training FLOPs of one step, by the PaLM (appendix B) / Chinchilla convention:
//   6 * N * tokens              every weight matmul: forward 2, backward 4 FLOPs per weight per
//   token
//   + 12 * L * T * C * tokens   attention scores (q k^T) and weighted sum (att v), fwd + bwd
// with N = 12 * L * C^2 (qkv 3C^2 + proj C^2 + fc 4C^2 + fc-proj 4C^2) + V * C (the tied LM
// head is a real matmul). Biases, LayerNorm, GELU, softmax, cross-entropy and the embedding
// lookups are not counted. The attention term counts the full T x T square, not the causal
// half, as the convention does: it is a nominal count, the same for both implementations.
double step_flops(const dm::GptConfig& c, int B, int T) {
  const double L = c.layers, C = c.d_model, V = c.vocab, tokens = double(B) * T;
  const double n_matmul = 12.0 * L * C * C + V * C;
  return 6.0 * n_matmul * tokens + 12.0 * L * T * C * tokens;
}

// manifest.json, params.bin, inputs.bin, targets.bin: the peer loads tensors by name.
void export_for_peer(const std::filesystem::path& dir, const dm::GptConfig& cfg,
                     const dm::ParamLayout& layout, std::span<const float> params,
                     const std::vector<std::int32_t>& in, const std::vector<std::int32_t>& tgt,
                     int B, int T) {
  std::filesystem::create_directories(dir);
  desloc::bench::write_raw(dir / "params.bin", params.data(), params.size());
  desloc::bench::write_raw(dir / "inputs.bin", in.data(), in.size());
  desloc::bench::write_raw(dir / "targets.bin", tgt.data(), tgt.size());
  std::ofstream m(dir / "manifest.json");
  m << "{\"config\": {\"vocab\": " << cfg.vocab << ", \"context\": " << cfg.context
    << ", \"layers\": " << cfg.layers << ", \"heads\": " << cfg.heads
    << ", \"d_model\": " << cfg.d_model << "},\n \"B\": " << B << ", \"T\": " << T
    << ",\n \"tensors\": [";
  for (std::size_t i = 0; i < layout.tensors().size(); ++i) {
    const auto& t = layout.tensors()[i];
    m << (i ? ",\n  " : "\n  ") << "{\"name\": \"" << t.name << "\", \"shape\": [";
    for (std::size_t d = 0; d < t.shape.size(); ++d) m << (d ? ", " : "") << t.shape[d];
    m << "], \"offset\": " << t.offset << "}";
  }
  m << "]}\n";
  if (!m) throw BenchError("cannot write " + (dir / "manifest.json").string());
}

struct Row {
  std::string size;
  std::size_t params = 0;
  double flops = 0;
  Stats desloc, torch, desloc_fwd;
  double loss = 0, loss_rel = 0, worst_grad_rel = 0;
  std::string worst_grad;
  int torch_blas = 0;           // OpenBLAS pool torch was timed with
  std::string torch_blas_note;  // how it was chosen
};

Row run_size(const SizeSpec& spec, const Options& o, const std::filesystem::path& scratch) {
  dm::GptConfig cfg;
  cfg.vocab = 256;
  cfg.context = o.seq;
  cfg.layers = spec.layers;
  cfg.heads = spec.heads;
  cfg.d_model = spec.d_model;
  const int B = o.batch, T = o.seq;

  auto model =
      dm::make_model(cfg, {.backend = dm::Backend::kCpu, .threads = o.threads, .max_batch = B});
  const auto& layout = model->layout();
  dm::init_params(layout, cfg, /*seed=*/1234, model->params());
  model->params_updated();

  // Uniform random bytes; targets are the inputs shifted by one, as the loader makes them.
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> tok(0, cfg.vocab - 1);
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tgt(in.size());
  for (std::size_t row0 = 0; row0 < in.size(); row0 += static_cast<std::size_t>(T)) {
    std::int32_t prev = tok(rng);
    for (std::size_t i = row0; i < row0 + static_cast<std::size_t>(T); ++i) {
      in[i] = prev;
      tgt[i] = prev = tok(rng);
    }
  }
  const dm::Batch batch{in, tgt, B, T};

  const auto dir = scratch / spec.name;
  export_for_peer(dir, cfg, layout, model->params(), in, tgt, B, T);

  Row row;
  row.size = spec.name;
  row.params = layout.total();
  row.flops = step_flops(cfg, B, T);

  // --- validate: loss and every gradient against the peer, before any timing.
  row.loss = model->forward_backward(batch);
  const std::vector<float> grads(model->grads().begin(), model->grads().end());

  desloc::bench::Subprocess peer(
      {o.python, o.peer, "--dir", dir.string(), "--threads", std::to_string(o.threads), "--serve"},
      {"OMP_NUM_THREADS=" + std::to_string(o.threads),
       "OPENBLAS_NUM_THREADS=" + std::to_string(o.threads)});
  const std::string ready = peer.read_record(kPeerTimeoutS);
  if (desloc::bench::json_string(ready, "event") != "ready")
    throw BenchError("peer did not become ready: " + ready);
  const double torch_loss = desloc::bench::json_number(ready, "loss");
  row.loss_rel = std::abs(row.loss - torch_loss) / std::abs(torch_loss);
  if (!(row.loss_rel < kLossTol))
    throw BenchError(std::string(spec.name) + ": desloc loss " + fmt(row.loss, 7) + " vs torch " +
                     fmt(torch_loss, 7) + " (relative " + desloc::bench::fmt_sci(row.loss_rel) +
                     " >= 1e-4): not timing a step that computes something else");
  const auto tg = desloc::bench::read_raw<float>(dir / "grads.bin", grads.size());
  for (const auto& t : layout.tensors()) {
    double diff = 0, ref = 0;
    for (std::size_t i = t.offset; i < t.offset + t.numel; ++i) {
      diff += (double(grads[i]) - tg[i]) * (double(grads[i]) - tg[i]);
      ref += double(tg[i]) * tg[i];
    }
    const double rel = std::sqrt(diff) / std::max(std::sqrt(ref), 1e-12);
    if (!(rel <= row.worst_grad_rel)) {
      row.worst_grad_rel = rel;
      row.worst_grad = t.name;
    }
  }
  if (!(row.worst_grad_rel < kGradTol))
    throw BenchError(std::string(spec.name) + ": gradient of " + row.worst_grad +
                     " differs from torch by relative L2 " +
                     desloc::bench::fmt_sci(row.worst_grad_rel) + " (>= 1e-4)");

  // --- warm up both, then alternate chunks so both sides see the same background load.
  auto desloc_step = [&] { model->forward_backward(batch); };
  desloc::bench::time_ms(desloc_step, o.warmup, 0);
  auto peer_times = [&](int n) {
    peer.send_line("time " + std::to_string(n));
    const std::string rec = peer.read_record(kPeerTimeoutS);
    const auto ms = desloc::bench::json_numbers(rec, "ms");
    if (static_cast<int>(ms.size()) != n) throw BenchError("peer returned wrong times: " + rec);
    return ms;
  };
  auto peer_blas = [&](int n) {
    peer.send_line("blas " + std::to_string(n));
    const std::string rec = peer.read_record(kPeerTimeoutS);
    if (static_cast<int>(desloc::bench::json_number(rec, "blas_threads")) != n)
      throw BenchError("peer could not set its OpenBLAS pool to " + std::to_string(n) + ": " + rec);
  };
  // Torch's OpenMP pool and its OpenBLAS pool both busy-wait; with both at `threads` they can
  // oversubscribe the cores. Compare against torch's faster setting, not its worst.
  row.torch_blas = o.torch_blas ? o.torch_blas : o.threads;
  if (o.torch_blas == 0 && o.threads > 1) {
    peer_blas(o.threads);
    const Stats many = desloc::bench::summarize(peer_times(o.warmup));
    peer_blas(1);
    const Stats one = desloc::bench::summarize(peer_times(o.warmup));
    row.torch_blas = one.median < many.median ? 1 : o.threads;
    row.torch_blas_note = "auto: " + fmt(many.median, 1) + " ms at " + std::to_string(o.threads) +
                          ", " + fmt(one.median, 1) + " ms at 1";
  } else {
    row.torch_blas_note = "fixed by --torch-blas";
  }
  peer_blas(row.torch_blas);
  peer_times(o.warmup);

  // Each round: k desloc steps, then (k+1)/2 desloc forwards (to split the step into forward
  // and backward for whoever tunes the model), then k torch steps.
  auto desloc_fwd = [&] { model->forward(batch); };
  std::vector<double> d_ms, f_ms, t_ms;
  while (static_cast<int>(d_ms.size()) < o.repeats) {
    const int k = std::min(o.chunk, o.repeats - static_cast<int>(d_ms.size()));
    std::this_thread::sleep_for(std::chrono::duration<double>(kSettleS));
    for (double ms : desloc::bench::time_ms(desloc_step, 0, k)) d_ms.push_back(ms);
    for (double ms : desloc::bench::time_ms(desloc_fwd, 0, (k + 1) / 2)) f_ms.push_back(ms);
    std::this_thread::sleep_for(std::chrono::duration<double>(kSettleS));
    const auto ms = peer_times(k);
    t_ms.insert(t_ms.end(), ms.begin(), ms.end());
  }
  peer.send_line("quit");
  row.desloc = desloc::bench::summarize(d_ms);
  row.torch = desloc::bench::summarize(t_ms);
  row.desloc_fwd = desloc::bench::summarize(f_ms);
  return row;
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::printf("bench_cpu_step: threads=%d B=%d T=%d vocab=256, warmup=%d repeats=%d chunk=%d\n",
              o.threads, o.batch, o.seq, o.warmup, o.repeats, o.chunk);
  // The peak is measured before the first size and after every size, and the best kept: on
  // a shared machine one measurement can land in a busy second and flatter every MFU.
  std::vector<double> peaks = {desloc::bench::sgemm_peak_gflops(o.threads)};
  std::printf("sgemm peak (OpenBLAS, 2048^3, best of 5, %d threads): %.1f GFLOP/s\n", o.threads,
              peaks.back());
  std::printf("load average before: %s (%u cores online)\n", desloc::bench::load_average().c_str(),
              std::thread::hardware_concurrency());
  std::fflush(stdout);

  desloc::bench::TempDir scratch("desloc_bench_cpu_step_");
  if (o.keep) {
    scratch.keep();
    std::printf("exports kept in %s\n", scratch.path().c_str());
  }
  std::vector<Row> rows;
  for (const auto& name : o.sizes) {
    const SizeSpec& spec = *std::find_if(std::begin(kSizes), std::end(kSizes),
                                         [&](const SizeSpec& k) { return name == k.name; });
    rows.push_back(run_size(spec, o, scratch.path()));
    const Row& r = rows.back();
    std::printf(
        "  %-6s L=%d C=%d NH=%d: validated (loss %.6f, rel diff %.1e; worst grad %s "
        "rel L2 %.1e); torch OpenBLAS pool %d (%s)\n",
        spec.name, spec.layers, spec.d_model, spec.heads, r.loss, r.loss_rel, r.worst_grad.c_str(),
        r.worst_grad_rel, r.torch_blas, r.torch_blas_note.c_str());
    peaks.push_back(desloc::bench::sgemm_peak_gflops(o.threads));
    std::printf("  sgemm peak after %s: %.1f GFLOP/s\n", spec.name, peaks.back());
    std::fflush(stdout);
  }

  const double peak = *std::max_element(peaks.begin(), peaks.end());
  std::printf("MFU uses the best sgemm peak: %.1f GFLOP/s\n", peak);
  const double tokens = double(o.batch) * o.seq;
  desloc::bench::Table table({"size", "params", "desloc ms/step", "torch ms/step", "desloc tok/s",
                              "torch tok/s", "speedup", "speedup(min)", "GFLOP/s", "MFU"});
  desloc::bench::Table split(
      {"size", "desloc fwd ms", "desloc bwd ms (step - fwd)", "fwd share", "GFLOP/step"});
  double min_speedup = 1e30;
  std::string min_size;
  for (const auto& r : rows) {
    const double speedup = r.torch.median / r.desloc.median;
    const double gflops = r.flops / (r.desloc.median * 1e-3) / 1e9;
    if (speedup < min_speedup) {
      min_speedup = speedup;
      min_size = r.size;
    }
    table.add({r.size, fmt(r.params / 1e6, 2) + "M", desloc::bench::fmt_stats(r.desloc, 1),
               desloc::bench::fmt_stats(r.torch, 1), fmt(tokens / (r.desloc.median * 1e-3), 0),
               fmt(tokens / (r.torch.median * 1e-3), 0), fmt(speedup, 2) + "x",
               fmt(r.torch.min / r.desloc.min, 2) + "x", fmt(gflops, 1),
               fmt(100 * gflops / peak, 1) + "%"});
    split.add({r.size, desloc::bench::fmt_stats(r.desloc_fwd, 1),
               fmt(r.desloc.median - r.desloc_fwd.median, 1),
               fmt(100 * r.desloc_fwd.median / r.desloc.median, 0) + "%", fmt(r.flops / 1e9, 2)});
  }
  std::printf(
      "\nms/step: median [min-max] over %d steps each, in interleaved chunks of %d.\n"
      "speedup = torch median / desloc median; speedup(min) = torch fastest / desloc fastest,\n"
      "the least noisy estimate on a shared machine. GFLOP/s from the desloc median; MFU =\n"
      "GFLOP/s / the best sgemm peak above.\n",
      o.repeats, o.chunk);
  table.print();
  std::printf("\n");
  split.print();
  for (const auto& r : rows)
    if (r.flops / (r.desloc.median * 1e-3) / 1e9 > peak)
      std::printf(
          "\nwarning: MFU above 100%% for %s: every sgemm peak measurement was slowed by "
          "other load; the MFU column is unreliable in this run\n",
          r.size.c_str());
  std::printf("\nload average after: %s\n", desloc::bench::load_average().c_str());
  std::printf("min speedup vs PyTorch: %.2fx (%s); target >= 1.00x %s\n", min_speedup,
              min_size.c_str(), min_speedup >= 1.0 ? "met" : "NOT met");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const desloc::Error& e) {
    std::fprintf(stderr, "bench_cpu_step: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cpu_step: %s\n", e.what());
  }
  return 1;
}
