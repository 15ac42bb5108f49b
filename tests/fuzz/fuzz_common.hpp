// Shared pieces of the libFuzzer targets: a per-process scratch file for readers that only take
// a path, little-endian field patching for repairing checksums, and a loud oracle failure.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>

namespace desloc::fuzz {

// A file unique to this process (parallel fuzzing jobs and ctest -j never share one), removed
// when the process exits normally. It lives in memory (/dev/shm) where possible: on ext4,
// truncating and rewriting a file forces its data to disk on close, which costs milliseconds
// per input.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& name)
      : path_((scratch_dir() / ("desloc_fuzz_" + name + "_" + std::to_string(::getpid()) + ".bin"))
                  .string()) {}
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  ~ScratchFile() { ::unlink(path_.c_str()); }

  // Replaces the file's contents; aborts if that fails, since every later verdict would be
  // about a stale file.
  const std::string& write(std::span<const std::uint8_t> bytes) const {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) die("open");
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n =
          ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
      if (n <= 0) die("pwrite");
      done += static_cast<std::size_t>(n);
    }
    // Shrinking after the write (never to zero first) keeps ext4 from flushing on close.
    if (::ftruncate(fd, static_cast<off_t>(bytes.size())) != 0) die("ftruncate");
    if (::close(fd) != 0) die("close");
    return path_;
  }

 private:
  static std::filesystem::path scratch_dir() {
    if (const char* dir = std::getenv("DESLOC_FUZZ_SCRATCH")) return dir;
    if (::access("/dev/shm", W_OK | X_OK) == 0) return "/dev/shm";
    return std::filesystem::temp_directory_path();
  }
  [[noreturn]] void die(const char* call) const {
    std::perror((std::string(call) + " " + path_).c_str());
    std::abort();
  }

 private:
  std::string path_;
};

inline void store_le(std::uint8_t* out, std::uint64_t value, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::uint8_t>(value >> (8 * i));
}
inline std::uint64_t load_le(const std::uint8_t* in, std::size_t bytes) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < bytes; ++i) v |= std::uint64_t{in[i]} << (8 * i);
  return v;
}

// An oracle violation: the library accepted input and then broke its own contract.
[[noreturn]] inline void oracle_failure(const char* target, const std::string& what) {
  std::fprintf(stderr, "%s: oracle violated: %s\n", target, what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace desloc::fuzz
