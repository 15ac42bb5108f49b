// The Open MPI peer of bench_wan_allreduce: every rank validates an in-place MPI_Allreduce of the
// shared integer pattern, warms up, times --repeats of them (each after MPI_Barrier) and writes
// one JSON record to OUT_DIR/mpi.rank-R.json. bench/bench_wan_allreduce.sh launches it with
// mpirun, one rank per site namespace; it builds with mpicxx alone (no desloc libraries).
//
//   mpi_allreduce --bytes B --out-dir DIR [--warmup 1] [--repeats 5]
// Only the C API: the deprecated C++ bindings do not compile cleanly with -Wextra -Werror.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_wan_allreduce_common.hpp"

namespace {

struct Options {
  long long bytes = 16 << 20;
  std::string out_dir;
  int warmup = 1;
  int repeats = 5;
};

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--bytes")
      o.bytes = std::atoll(v);
    else if (k == "--out-dir")
      o.out_dir = v;
    else if (k == "--warmup")
      o.warmup = std::atoi(v);
    else if (k == "--repeats")
      o.repeats = std::atoi(v);
    else
      return false;
  }
  return argc % 2 == 1 && !o.out_dir.empty() && o.bytes > 0 && o.bytes % 4 == 0 && o.repeats >= 1 &&
         o.warmup >= 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Options o;
  if (!parse(argc, argv, o)) {
    if (rank == 0)
      std::fprintf(stderr,
                   "usage: mpi_allreduce --bytes B (multiple of 4) --out-dir DIR [--warmup W] "
                   "[--repeats R]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  namespace wan = desloc::bench::wan;
  std::vector<float> x(static_cast<std::size_t>(o.bytes) / sizeof(float));
  const std::vector<float> expected = wan::expected_sums(size);
  auto checked = [&](double* ms) {
    wan::fill_pattern(x.data(), x.size(), rank);
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(x.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    const auto t1 = std::chrono::steady_clock::now();
    if (ms) *ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    const std::size_t bad = wan::first_mismatch(x.data(), x.size(), expected);
    if (bad != x.size()) {
      std::fprintf(stderr,
                   "mpi rank %d: MPI_Allreduce result wrong at element %zu: got %.1f, "
                   "expected %.1f\n",
                   rank, bad, static_cast<double>(x[bad]),
                   static_cast<double>(expected[bad % wan::kPeriod]));
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
  };
  checked(nullptr);  // validation; also opens the TCP connections
  for (int i = 0; i < o.warmup; ++i) checked(nullptr);
  std::vector<double> ms(static_cast<std::size_t>(o.repeats));
  for (double& m : ms) checked(&m);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string path = o.out_dir + "/mpi.rank-" + std::to_string(rank) + ".json";
  if (!wan::write_record(path, "mpi", rank, size, x.size() * sizeof(float), o.warmup,
                         1 + o.warmup + o.repeats, ms, "")) {
    std::fprintf(stderr, "mpi rank %d: cannot write %s\n", rank, path.c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::fprintf(stderr, "mpi rank %d/%d: %d all-reduces validated\n", rank, size,
               1 + o.warmup + o.repeats);
  MPI_Finalize();
  return 0;
}
