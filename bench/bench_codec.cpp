// Question: are the wide-area payload codecs fast enough to be invisible (issue 14: encode and
// decode at >= 2 GB/s of fp32 input per core, so a 10 Gbit link is never codec-bound), and
// what does each block size cost in error and bytes?
//
// One core, a 64 MiB fp32 buffer (far beyond the caches, as a state is). Before timing, every
// codec's round trip is validated against its error bound. Then encode and decode of each codec
// are timed (warmup, repeats, median [min-max]) next to memcpy of the same buffer in the same
// run: the physical limit of a pass over the data. Last, the block-size study: for int8, int4
// and int2, the relative RMS error and the bytes per float at blocks of 16 to 1024, on
// Gaussian values and on heavy-tailed ones whose scale varies by orders of magnitude from
// block to block (like the rows of different tensors). Then, with --ring, the codec work of one
// whole compressed average: the in-process averager replays the ring of encoded segments of S
// sites (every site's encoding, each hop's decode-add-encode, the final decode; the same
// functions a networked rank runs), timed per site against the price the planner and the
// simulator assume (sync::codec_seconds_priced) and against memcpy passes.
//
//   bench_codec [--mib 64] [--repeats 10] [--ring] [--sites 3]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "desloc/sync/averager.hpp"
#include "desloc/sync/codec.hpp"
#include "desloc/sync/compression.hpp"
#include "harness.hpp"
#include "lm_bench_common.hpp"

namespace {
using namespace desloc;
using sync::Codec;

std::vector<float> gaussian(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = d(gen);
  return x;
}

// Student-t (3 degrees of freedom) values, each run of 4096 scaled by 10^U(-3, 1).
std::vector<float> heavy(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::student_t_distribution<float> t(3.0f);
  std::uniform_real_distribution<float> e(-3.0f, 1.0f);
  std::vector<float> x(n);
  float scale = 1.0f;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 4096 == 0) scale = std::pow(10.0f, e(gen));
    x[i] = scale * t(gen);
  }
  return x;
}

double rel_rms_error(Codec c, const std::vector<float>& x, std::size_t block) {
  std::vector<std::byte> buf(sync::encoded_bytes(c, x.size(), block));
  std::vector<float> y(x.size());
  sync::encode(c, x, buf, block);
  sync::decode(c, buf, y, block);
  double err = 0, sig = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    err += double(y[i] - x[i]) * double(y[i] - x[i]);
    sig += double(x[i]) * double(x[i]);
  }
  return std::sqrt(err / sig);
}

// The round trip of every codec on `x` stays within its bound (codec.hpp); throws otherwise.
void validate(const std::vector<float>& x) {
  for (const Codec c : {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4, Codec::kInt2}) {
    std::vector<std::byte> buf(sync::encoded_bytes(c, x.size()));
    std::vector<float> y(x.size());
    sync::encode(c, x, buf);
    sync::decode(c, buf, y);
    const std::size_t block = sync::kDefaultCodecBlock;
    for (std::size_t b = 0; b * block < x.size(); ++b) {
      const std::size_t lo = b * block, hi = std::min(x.size(), lo + block);
      double amax = 0, squares = 0;
      for (std::size_t i = lo; i < hi; ++i) {
        amax = std::max(amax, double(std::abs(x[i])));
        squares += double(x[i]) * double(x[i]);
      }
      const double rms = std::sqrt(squares / double(hi - lo));
      for (std::size_t i = lo; i < hi; ++i) {
        const double bound = c == Codec::kFp32   ? 0.0
                             : c == Codec::kBf16 ? std::abs(x[i]) * std::ldexp(1.0, -8)
                             : c == Codec::kInt2  // +-s/2, +-3s/2 at s = RMS; clipped past 2s
                                 ? std::max(0.5 * rms, std::abs(x[i]) - 1.5 * rms) * 1.00001
                                 : 0.5 * amax / sync::codec_qmax(c) * 1.00001;
        if (!(std::abs(y[i] - x[i]) <= bound))
          throw bench::BenchError("validation failed: " + std::string(sync::to_string(c)) +
                                  " decodes element " + std::to_string(i) + " with error " +
                                  std::to_string(std::abs(y[i] - x[i])) + " > " +
                                  std::to_string(bound));
      }
    }
  }
}

// One compressed average of x's length over `sites` in-process sites, per codec: validated
// (every site holds the same mean, within the codec's error of the exact one), then timed.
// Returns false when the measured codec work exceeds the planner's price.
bool ring_study(const std::vector<float>& x, int sites, int repeats, double copy_gbs) {
  const std::size_t n = x.size();
  const auto S = static_cast<std::size_t>(sites);
  std::vector<std::vector<float>> base(S, x), state(S);
  std::vector<double> exact(n, 0.0);
  for (std::size_t s = 0; s < S; ++s) {
    const std::vector<float> noise = gaussian(n, 100 + unsigned(s));
    for (std::size_t i = 0; i < n; ++i) {
      base[s][i] += 0.01f * noise[i];
      exact[i] += double(base[s][i]) / double(S);
    }
  }
  std::vector<std::span<float>> views(S);
  auto restore = [&] {
    for (std::size_t s = 0; s < S; ++s) {
      state[s].resize(n);
      std::memcpy(state[s].data(), base[s].data(), n * sizeof(float));
      views[s] = state[s];
    }
  };
  const bench::Stats copy = bench::summarize(bench::time_ms(restore, 1, repeats));
  const double priced = sync::codec_seconds_priced(double(n));
  std::printf(
      "\nring codec work: one average of %zu floats over %d sites in one process (every site's "
      "encoding, each hop's decode-add-encode, the final decode), per site, less the %.1f ms of "
      "restoring the states; the planner's price: %.1f ms (%g passes at %.0f GB/s)\n",
      n, sites, copy.median, 1e3 * priced, sync::kCodecPassesPerAverage,
      sync::kCodecBytesPerSecond / 1e9);
  bench::Table table({"codec", "ms per site", "vs priced", "fp32 passes (memcpy)", "max error"});
  bool within = true;
  for (const Codec c : {Codec::kBf16, Codec::kInt8, Codec::kInt4, Codec::kInt2}) {
    std::vector<float> ref = x;
    sync::CodecViews v;
    v.codec = c;
    v.reference = ref;
    sync::VirtualAverager avg(sites, sync::SumOrder::kRing);
    auto once = [&] {
      restore();
      std::copy(x.begin(), x.end(), ref.begin());
      avg.set_codec(optim::StateKind::kU, v);
      avg.average(optim::StateKind::kU, views);
    };
    once();  // validate: one mean everywhere, near the exact one
    double err = 0, mag = 0;
    for (std::size_t i = 0; i < n; ++i) {
      err = std::max(err, std::abs(double(state[0][i]) - exact[i]));
      mag = std::max(mag, std::abs(exact[i] - double(x[i])));
    }
    for (std::size_t s = 1; s < S; ++s)
      if (std::memcmp(state[s].data(), state[0].data(), n * sizeof(float)) != 0)
        throw bench::BenchError("validation failed: the sites' means differ (" +
                                std::string(sync::to_string(c)) + ")");
    if (!(err <= mag))  // an error as large as the update itself means a broken ring
      throw bench::BenchError("validation failed: " + std::string(sync::to_string(c)) +
                              " mean off by " + std::to_string(err) + ", the update is " +
                              std::to_string(mag));
    const bench::Stats t = bench::summarize(bench::time_ms(once, 1, repeats));
    const double per_site = std::max(0.0, t.median - copy.median) / double(sites);
    const double pass_ms = 1e3 * double(n) * 4.0 / (copy_gbs * 1e9);
    within = within && per_site <= 1e3 * priced;
    table.add({std::string(sync::to_string(c)), bench::fmt(per_site, 1),
               bench::fmt(per_site / (1e3 * priced)) + "x", bench::fmt(per_site / pass_ms, 1),
               bench::fmt_sci(err / mag, 2) + " of the update"});
  }
  table.print();
  return within;
}

int run(int argc, char** argv) {
  std::int64_t mib = 64;
  int repeats = 10;
  bool ring = false;
  int sites = 3;
  bench::Flags("bench_codec [--mib N] [--repeats R] [--ring] [--sites S]")
      .add("--mib", mib)
      .add("--repeats", repeats)
      .add("--ring", ring)
      .add("--sites", sites)
      .parse(argc, argv);
  if (sites < 2) throw bench::BenchError("--sites must be at least 2");
  const std::size_t n = static_cast<std::size_t>(mib) * (1u << 20) / sizeof(float);
  const std::vector<float> x = gaussian(n, 1);
  validate(gaussian(1 << 16, 2));
  validate(heavy(1 << 16, 3));
  std::printf("validation: every codec's round trip within its bound: ok\n");
  std::printf("bench_codec: %lld MiB of fp32, one core, block %zu; load %s\n",
              static_cast<long long>(mib), sync::kDefaultCodecBlock, bench::load_average().c_str());

  std::vector<float> out(n);
  const double gb = double(n * sizeof(float)) / 1e9;
  const bench::Stats copy = bench::summarize(
      bench::time_ms([&] { std::memcpy(out.data(), x.data(), n * sizeof(float)); }, 2, repeats));
  auto rate = [&](const bench::Stats& s) {
    return bench::Stats{gb / (s.median / 1e3), gb / (s.max / 1e3), gb / (s.min / 1e3), s.n};
  };
  const bench::Stats copy_rate = rate(copy);
  bench::Table table({"codec", "bytes/float", "encode GB/s", "vs memcpy", "decode GB/s",
                      "vs memcpy", ">= 2 GB/s"});
  table.add({"memcpy", "4.000", bench::fmt_stats(copy_rate, 2), "1.00x",
             bench::fmt_stats(copy_rate, 2), "1.00x", ""});
  bool all_fast = true;
  for (const Codec c : {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4, Codec::kInt2}) {
    std::vector<std::byte> buf(sync::encoded_bytes(c, n));
    const bench::Stats enc =
        rate(bench::summarize(bench::time_ms([&] { sync::encode(c, x, buf); }, 2, repeats)));
    const bench::Stats dec =
        rate(bench::summarize(bench::time_ms([&] { sync::decode(c, buf, out); }, 2, repeats)));
    const bool fast = enc.median >= 2.0 && dec.median >= 2.0;
    all_fast = all_fast && fast;
    table.add({std::string(sync::to_string(c)), bench::fmt(double(buf.size()) / double(n), 3),
               bench::fmt_stats(enc, 2), bench::fmt(enc.median / copy_rate.median) + "x",
               bench::fmt_stats(dec, 2), bench::fmt(dec.median / copy_rate.median) + "x",
               fast ? "yes" : "NO"});
  }
  std::printf("GB/s of fp32 input (decode: of fp32 output), median [min-max] over %d repeats\n",
              repeats);
  table.print();

  std::printf("\nblock-size study: relative RMS error |decode(x) - x| / |x| (bytes per float)\n");
  const std::vector<float> g = gaussian(1 << 20, 4), h = heavy(1 << 20, 5);
  bench::Table study({"codec", "block", "bytes/float", "gaussian", "heavy-tailed"});
  for (const Codec c : {Codec::kInt8, Codec::kInt4, Codec::kInt2})
    for (const std::size_t block : {16, 32, 64, 128, 256, 1024})
      study.add({std::string(sync::to_string(c)), std::to_string(block),
                 bench::fmt(double(sync::encoded_bytes(c, g.size(), block)) / double(g.size()), 3),
                 bench::fmt_sci(rel_rms_error(c, g, block), 2),
                 bench::fmt_sci(rel_rms_error(c, h, block), 2)});
  study.print();
  const bool priced_ok = !ring || ring_study(x, sites, repeats, copy_rate.median);
  return all_fast && priced_ok ? 0 : 3;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_codec: %s\n", e.what());
    return 1;
  }
}
