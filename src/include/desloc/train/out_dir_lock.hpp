// One writer per output directory: a process that trains into a directory holds an exclusive
// lock on it (a POSIX record lock on <dir>/.desloc.lock) for as long as it runs, so that two runs
// started into one directory (two `train --resume` at once, a second launch over a running one)
// cannot overwrite each other's checkpoints. The kernel drops the lock when the process ends,
// however it ends.
#pragma once

#include <string>

namespace desloc::train {

class OutDirLock {
 public:
  // Creates `dir` if needed and takes its lock; nothing is written into the lock file. `who`
  // names this process in errors. ConfigError naming the holder (its pid and command line) when
  // another process holds the lock; Error when the file cannot be opened.
  OutDirLock(const std::string& dir, const std::string& who);
  ~OutDirLock();
  OutDirLock(OutDirLock&& other) noexcept;
  OutDirLock& operator=(OutDirLock&& other) noexcept;
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;

  static constexpr const char* kFileName = ".desloc.lock";

 private:
  int fd_ = -1;
};

}  // namespace desloc::train
