// bench_data_rss: does a rank's memory grow with its data set? The training loader reads token
// files in place (src/data/token_files.cpp); the loader it replaced held the whole training
// stream in memory. Two nanoGPT-format data sets of different sizes (default 16 MiB and 1 GiB of
// uint16 tokens) are written; for each, a fresh process opens a DataLoader (which reads every
// token once to check it), takes --batches batches of B x T, and reports its peak RSS and the
// loader's time per batch. Validated first: every row of a batch must be a run of consecutive
// tokens of the file (token at position p is p mod 65536) and its targets the inputs shifted by
// one. Ratios: peak RSS of the large set over the small one (1.00x = no growth), and the large
// set's peak RSS over its file size (what the old loader needed at least).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "desloc/data/loader.hpp"
#include "desloc/data/prepare.hpp"
#include "harness.hpp"

namespace {

using namespace desloc;
using bench::BenchError;
namespace fs = std::filesystem;

// A nanoGPT data set in `dir`: train.bin of `bytes` bytes, token p = p mod 65536, and a small
// val.bin.
void write_dataset(const fs::path& dir, std::uint64_t bytes) {
  fs::create_directories(dir);
  std::vector<std::uint16_t> block(1 << 20);
  std::uint64_t p = 0;
  std::ofstream train(dir / "train.bin", std::ios::binary | std::ios::trunc);
  for (std::uint64_t left = bytes / 2; left > 0;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, block.size()));
    for (std::size_t i = 0; i < n; ++i) block[i] = static_cast<std::uint16_t>(p++);
    train.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(2 * n));
    left -= n;
  }
  if (!train) throw BenchError("cannot write " + (dir / "train.bin").string());
  std::ofstream val(dir / "val.bin", std::ios::binary | std::ios::trunc);
  for (std::size_t i = 0; i < block.size() / 16; ++i) block[i] = static_cast<std::uint16_t>(i);
  val.write(reinterpret_cast<const char*>(block.data()),
            static_cast<std::streamsize>(block.size() / 8));
}

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

struct Run {
  double rss_mib = 0;
  double batch_us = 0;  // per batch
};

// In a child process (so that its peak RSS is the loader's): open, validate, time, report.
Run measure(const fs::path& dir, int B, int T, int batches) {
  int fds[2];
  if (pipe(fds) != 0) throw BenchError("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) throw BenchError("fork failed");
  if (pid == 0) {
    close(fds[0]);
    Run r;
    try {
      const data::DatasetInfo d =
          data::external_dataset(dir.string(), data::TokenFormat::kNanogpt, 65536);
      data::DataLoader loader(d, B, T, 1, 0, 1);
      std::vector<std::int32_t> x(static_cast<std::size_t>(B) * T), y(x.size());
      for (int i = 0; i < 4; ++i) {  // validation
        loader.next(x, y);
        for (int b = 0; b < B; ++b)
          for (int t = 0; t < T; ++t) {
            const std::size_t k = static_cast<std::size_t>(b) * T + t;
            if (y[k] != (x[k] + 1) % 65536 || (t > 0 && x[k] != (x[k - 1] + 1) % 65536)) _exit(3);
          }
      }
      const double t0 = bench::now_s();
      for (int i = 0; i < batches; ++i) loader.next(x, y);
      r.batch_us = 1e6 * (bench::now_s() - t0) / batches;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_data_rss: %s\n", e.what());
      _exit(2);
    }
    r.rss_mib = static_cast<double>(peak_rss_kib()) / 1024.0;
    if (write(fds[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) _exit(4);
    _exit(0);
  }
  close(fds[1]);
  Run r;
  const ssize_t got = read(fds[0], &r, sizeof r);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || got != static_cast<ssize_t>(sizeof r))
    throw BenchError(WIFEXITED(status) && WEXITSTATUS(status) == 3
                         ? "validation failed: a batch row is not a run of the file's tokens"
                         : "the measuring process failed");
  return r;
}

int run(int argc, char** argv) {
  std::int64_t small_mib = 16, large_mib = 1024;
  int repeats = 3, batches = 2000, B = 16, T = 1024;
  std::string dir = (fs::temp_directory_path() / "bench_data_rss").string();
  bench::Flags(
      "bench_data_rss [--small-mib N] [--large-mib N] [--repeats N] [--batches N] [--batch B] "
      "[--seq T] [--dir DIR]")
      .add("--small-mib", small_mib)
      .add("--large-mib", large_mib)
      .add("--repeats", repeats)
      .add("--batches", batches)
      .add("--batch", B)
      .add("--seq", T)
      .add("--dir", dir)
      .parse(argc, argv);
  if (repeats < 1 || batches < 1 || B < 1 || T < 1 || small_mib < 1 || large_mib < small_mib)
    throw BenchError("every count must be positive and --large-mib at least --small-mib");
  std::printf("bench_data_rss: B %d, T %d, %d batches, %d repeats, load %s\n", B, T, batches,
              repeats, bench::load_average().c_str());
  bench::Table table(
      {"data set", "file MiB", "peak RSS MiB", "loader us/batch", "RSS vs small", "RSS / file"});
  std::vector<double> small_rss;
  for (const std::int64_t mib : {small_mib, large_mib}) {
    const fs::path d = fs::path(dir) / std::to_string(mib);
    write_dataset(d, static_cast<std::uint64_t>(mib) << 20);
    measure(d, B, T, 10);  // warm-up: the page cache holds the file for every repeat alike
    std::vector<double> rss, us;
    for (int i = 0; i < repeats; ++i) {
      const Run r = measure(d, B, T, batches);
      rss.push_back(r.rss_mib);
      us.push_back(r.batch_us);
    }
    const bench::Stats s = bench::summarize(rss), u = bench::summarize(us);
    if (mib == small_mib) small_rss = rss;
    table.add({std::to_string(mib) + " MiB", std::to_string(mib), bench::fmt_stats(s, 1),
               bench::fmt_stats(u, 1),
               bench::fmt(s.median / bench::summarize(small_rss).median, 2) + "x",
               bench::fmt(s.median / static_cast<double>(mib), 3) + "x"});
    fs::remove_all(d);
  }
  std::printf("validation: every row of 4 batches per run is a run of the file's tokens: ok\n");
  table.print();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_data_rss: %s\n", e.what());
    return 1;
  }
}
