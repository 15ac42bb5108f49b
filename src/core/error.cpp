// Error hierarchy: formats the throw site into the message.
#include "desloc/core/error.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace desloc {
namespace {
std::string with_site(const std::string& what, const std::source_location& loc) {
  return what + " [" + std::filesystem::path(loc.file_name()).filename().string() + ":" +
         std::to_string(loc.line()) + "]";
}
}  // namespace

Error::Error(const std::string& what, std::source_location loc)
    : std::runtime_error(with_site(what, loc)), message_(what) {}

void throw_errno(const std::string& what, const std::string& path, std::source_location loc) {
  const int err = errno;
  throw DataError(what + " '" + path + "': " + std::strerror(err), loc);
}

}  // namespace desloc
