// Shared helpers for integration tests: temp dirs, tiny job configs on the prepared Brown
// corpus, and running the CLI with captured output.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "desloc/train/checkpoint.hpp"
#include "desloc/train/config.hpp"

namespace desloc::test {

namespace fs = std::filesystem;

// The directories fresh_dir made for the running test. When the test ends they are removed if
// it passed, and kept (and named) if it failed, for the post-mortem.
class ScratchDirs : public ::testing::EmptyTestEventListener {
 public:
  static ScratchDirs& instance() {
    static ScratchDirs* dirs = [] {
      auto* d = new ScratchDirs;  // owned by GoogleTest's listener list from here on
      ::testing::UnitTest::GetInstance()->listeners().Append(d);
      return d;
    }();
    return *dirs;
  }
  void add(const fs::path& p) {
    std::lock_guard lock(mu_);
    dirs_.push_back(p);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    std::vector<fs::path> dirs;
    {
      std::lock_guard lock(mu_);
      dirs.swap(dirs_);
    }
    for (const fs::path& p : dirs) {
      if (info.result()->Failed()) {
        std::fprintf(stderr, "kept the failed test's directory %s\n", p.c_str());
        continue;
      }
      std::error_code ec;
      fs::remove_all(p, ec);  // a directory a child process still writes stays; no failure
    }
  }

 private:
  std::mutex mu_;
  std::vector<fs::path> dirs_;
};

inline fs::path fresh_dir(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path p = fs::temp_directory_path() / ("desloc_" + tag + "_" + std::to_string(::getpid()) +
                                            "_" + info->test_suite_name() + "_" + info->name());
  fs::remove_all(p);
  fs::create_directories(p);
  ScratchDirs::instance().add(p);
  return p;
}

// A config small enough that 20 steps take a few seconds on one core.
inline std::string tiny_job_toml(const fs::path& out_dir,
                                 const std::string& data_dir = DESLOC_TEST_BROWN,
                                 const std::string& extra_optim = "") {
  return "[model]\nvocab = 256\ncontext = 32\nlayers = 2\nheads = 2\nd_model = 32\n"
         "[optim]\nname = \"adamw\"\nclip = \"norm\"\nclip_value = 1.0\n" +
         extra_optim +
         "[schedule]\nkind = \"cosine\"\nlr = 0.01\nwarmup = 2\n"
         "[data]\ndir = \"" +
         data_dir +
         "\"\nbatch = 4\nseed = 7\n"
         "[train]\nsteps = 20\neval_every = 10\neval_batches = 2\ncheckpoint_every = 0\nout_dir = "
         "\"" +
         out_dir.string() + "\"\nseed = 3\nthreads = 1\n";
}

inline fs::path write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), p) != nullptr) r.output += buf.data();
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Every worker's x, u, v and loader position are bitwise identical.
inline void expect_bitwise_equal(const train::Checkpoint& a, const train::Checkpoint& b) {
  ASSERT_EQ(a.sites.size(), b.sites.size());
  EXPECT_EQ(a.step, b.step);
  for (std::size_t i = 0; i < a.sites.size(); ++i) {
    const auto& wa = a.sites[i];
    const auto& wb = b.sites[i];
    ASSERT_EQ(wa.params.size(), wb.params.size());
    const std::size_t bytes = wa.params.size() * sizeof(float);
    EXPECT_EQ(0, std::memcmp(wa.params.data(), wb.params.data(), bytes))
        << "x of worker " << i << " differs";
    EXPECT_EQ(0, std::memcmp(wa.u.data(), wb.u.data(), bytes)) << "u of worker " << i << " differs";
    EXPECT_EQ(0, std::memcmp(wa.v.data(), wb.v.data(), bytes)) << "v of worker " << i << " differs";
    EXPECT_EQ(wa.optim_t, wb.optim_t);
    EXPECT_EQ(wa.loader.epoch, wb.loader.epoch);
    EXPECT_EQ(wa.loader.cursor, wb.loader.cursor);
    for (std::size_t k = 0; k < 3; ++k)
      EXPECT_TRUE(wa.codec_feedback[k] == wb.codec_feedback[k])
          << "error feedback " << k << " of worker " << i << " differs";
  }
  EXPECT_EQ(a.outer_ref, b.outer_ref);
  EXPECT_EQ(a.outer_momentum, b.outer_momentum);
  for (std::size_t k = 0; k < 3; ++k)
    EXPECT_TRUE(a.codec_ref[k] == b.codec_ref[k]) << "codec reference " << k << " differs";
}

inline bool have_prepared_corpus() {
  return fs::exists(fs::path(DESLOC_TEST_BROWN) / "dataset.toml");
}

inline bool under_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

}  // namespace desloc::test

// In a test body: skips the test when the program at `path` is not installed, and fails it
// under CI=true, where scripts/install_deps.sh has installed every package a test needs.
#define DESLOC_REQUIRE_PROGRAM(path, package)                                                    \
  do {                                                                                           \
    if (::access(path, X_OK) != 0) {                                                             \
      if (::desloc::test::under_ci())                                                            \
        FAIL() << (path) << " not found; install " << (package) << " (scripts/install_deps.sh)"; \
      GTEST_SKIP() << (path) << " not found (Debian's " << (package) << " package)";             \
    }                                                                                            \
  } while (0)
