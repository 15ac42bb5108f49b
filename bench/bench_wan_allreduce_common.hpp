// Shared by the ranks of bench_wan_allreduce (desloc UCX) and mpi_allreduce (Open MPI): the
// validation pattern with its closed-form sum, and the one-line JSON record each rank writes.
// Dependency-free so that mpicxx can build mpi_allreduce.cpp without desloc; the torch gloo
// rank (wan_allreduce_gloo.py) repeats the same two formulas.
#pragma once

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

namespace desloc::bench::wan {

// Rank r contributes x[i] = (i + kRankStride * r) mod kPeriod. Every value and every sum over
// up to 99 ranks is a small integer, so float32 sums are exact in any order and the result can
// be checked for equality. The period is prime so that a misplaced segment or chunk (an offset
// that is not a multiple of 509 elements) shows up as a mismatch.
inline constexpr std::size_t kPeriod = 509;
inline constexpr std::size_t kRankStride = 31;

inline void fill_pattern(float* x, std::size_t n, int rank) {
  std::size_t v = (kRankStride * static_cast<std::size_t>(rank)) % kPeriod;
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(v);
    if (++v == kPeriod) v = 0;
  }
}

// expected[i mod kPeriod] = sum over ranks of rank r's x[i].
inline std::vector<float> expected_sums(int size) {
  std::vector<float> e(kPeriod, 0.0f);
  for (std::size_t j = 0; j < kPeriod; ++j) {
    std::size_t s = 0;
    for (int r = 0; r < size; ++r) s += (j + kRankStride * static_cast<std::size_t>(r)) % kPeriod;
    e[j] = static_cast<float>(s);
  }
  return e;
}

// Index of the first element that differs from the closed form, or n when all match.
inline std::size_t first_mismatch(const float* x, std::size_t n, const std::vector<float>& e) {
  std::size_t j = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (x[i] != e[j]) return i;
    if (++j == kPeriod) j = 0;
  }
  return n;
}

// Writes `{"impl":..,"rank":..,"size":..,"bytes":..,"warmup":..,"validated":..,"samples_ms":[..]}`
// plus `extra` (already JSON, e.g. `"rndv_thresh":"inf"`, may be empty) to `path` atomically:
// the driver never reads half a record. Returns false on an I/O error.
inline bool write_record(const std::filesystem::path& path, const std::string& impl, int rank,
                         int size, std::size_t bytes, int warmup, int validated_runs,
                         const std::vector<double>& samples_ms, const std::string& extra) {
  std::string line = "{\"impl\":\"" + impl + "\",\"rank\":" + std::to_string(rank) +
                     ",\"size\":" + std::to_string(size) + ",\"bytes\":" + std::to_string(bytes) +
                     ",\"warmup\":" + std::to_string(warmup) +
                     ",\"validated\":" + std::to_string(validated_runs) + ",\"samples_ms\":[";
  for (std::size_t i = 0; i < samples_ms.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.3f", i ? "," : "", samples_ms[i]);
    line += buf;
  }
  line += "]";
  if (!extra.empty()) line += "," + extra;
  line += "}\n";
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << line;
    f.flush();
    if (!f) return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  return !ec;
}

}  // namespace desloc::bench::wan
