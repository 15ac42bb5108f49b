// The output directory's lock (out_dir_lock.hpp): a POSIX record lock, which ends with the
// process.
#include "desloc/train/out_dir_lock.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "desloc/core/error.hpp"

namespace desloc::train {
namespace {

// Who holds the lock on `fd`'s file: its process id and command line, as this host knows them
// (a holder on another host sharing the directory shows as its pid there).
std::string holder_of(int fd) {
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  if (::fcntl(fd, F_GETLK, &probe) != 0 || probe.l_type == F_UNLCK)
    return "a process that has just let go of it";
  std::ifstream in(fmt::format("/proc/{}/cmdline", probe.l_pid));
  std::string command, arg;
  while (std::getline(in, arg, '\0')) command += (command.empty() ? "" : " ") + arg;
  return command.empty() ? fmt::format("pid {}", probe.l_pid)
                         : fmt::format("pid {}: {}", probe.l_pid, command);
}

}  // namespace

OutDirLock::OutDirLock(const std::string& dir, const std::string& who) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = (std::filesystem::path(dir) / kFileName).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw Error(fmt::format("{}: cannot open the lock file '{}': {}; is '{}' writable?", who, path,
                            std::strerror(errno), dir));
  // A POSIX record lock, not flock(2): its holder's pid can be asked for (F_GETLK), so nothing
  // needs writing into the directory to name it. This process opens the file once only, as
  // such a lock requires (closing any descriptor of the file would drop it).
  struct flock whole {};
  whole.l_type = F_WRLCK;
  whole.l_whence = SEEK_SET;
  if (::fcntl(fd_, F_SETLK, &whole) != 0) {
    const int err = errno;
    const std::string holder = err == EACCES || err == EAGAIN ? holder_of(fd_) : std::string();
    ::close(fd_);
    fd_ = -1;
    if (!holder.empty())
      throw ConfigError(fmt::format(
          "{}: '{}' is in use by another desloc process ({}); two runs writing one directory "
          "would overwrite each other's checkpoints. Wait for it to end, stop it, or choose "
          "another train.out_dir (--out-dir)",
          who, dir, holder));
    throw Error(fmt::format("{}: cannot lock '{}': {}", who, path, std::strerror(err)));
  }
}

OutDirLock::~OutDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

OutDirLock::OutDirLock(OutDirLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

OutDirLock& OutDirLock::operator=(OutDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

}  // namespace desloc::train
