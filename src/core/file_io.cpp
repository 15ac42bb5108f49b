// Atomic file replacement and checked binary reads.
#include "desloc/core/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

namespace desloc {
namespace fs = std::filesystem;

void write_file_atomic(const std::string& path, std::span<const std::uint8_t> bytes) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string tmpl = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0) throw_errno("cannot create temporary file for", path);
  auto fail = [&](const char* what) {
    const int saved = errno;
    ::close(fd);
    ::unlink(tmpl.c_str());
    errno = saved;
    throw_errno(what, path);
  };
  // mkstemp creates 0600; data and checkpoints are meant to be readable by the job's group
  // and other users' tools (umask is process-global, so it is not queried from here).
  if (::fchmod(fd, 0644) != 0) fail("fchmod failed for");
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write failed for");
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync failed for");
  if (::close(fd) != 0) {
    ::unlink(tmpl.c_str());
    throw_errno("close failed for", path);
  }
  if (::rename(tmpl.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    ::unlink(tmpl.c_str());
    errno = saved;
    throw_errno("rename failed for", path);
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);  // best effort: some filesystems refuse fsync on directories
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, std::string_view text) {
  write_file_atomic(path,
                    std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

std::vector<std::uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot open '" + path + "': no such file or not readable");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::size_t>(in.tellg());
  in.seekg(0);
  std::vector<std::uint8_t> bytes(size);
  if (size > 0 &&
      !in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size)))
    throw DataError("short read from '" + path + "'");
  return bytes;
}

void ByteReader::need(std::size_t n, const char* field) const {
  if (bytes_.size() - pos_ < n)
    throw DataError("'" + source_ + "' is truncated: field '" + field + "' needs " +
                    std::to_string(n) + " bytes at offset " + std::to_string(pos_) + " but only " +
                    std::to_string(bytes_.size() - pos_) + " remain");
}

std::string ByteReader::get_string(const char* field, std::size_t max_len) {
  const auto len = get<std::uint64_t>(field);
  if (len > max_len)
    throw DataError("'" + source_ + "': field '" + field + "' claims length " +
                    std::to_string(len) + " (limit " + std::to_string(max_len) + ")");
  need(len, field);
  std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
  pos_ += len;
  return s;
}

}  // namespace desloc
