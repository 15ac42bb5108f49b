// The desloc error hierarchy. Every message says what failed, where, and what to do;
// the throw site (file:line) is appended so a user report points at the code.
#pragma once

#include <source_location>
#include <stdexcept>
#include <string>

namespace desloc {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what,
                 std::source_location loc = std::source_location::current());
  // The message without the throw-site suffix, for user-facing output.
  const std::string& message() const noexcept { return message_; }

 private:
  std::string message_;
};

// Bad configuration or command-line input: file:line:column and the key are in the text.
class ConfigError : public Error {
  using Error::Error;
};
// Bad or corrupt data on disk (shards, checkpoints, exported tensors).
class DataError : public Error {
  using Error::Error;
};
// A transport call failed (UCX, NCCL, sockets): a peer or a link may be at fault, so an
// elastic job recovers from it in a new membership epoch.
class TransportError : public Error {
  using Error::Error;
};
// This process's GPU failed (a CUDA or cuBLAS call: out of memory, no device, a kernel fault).
// No membership epoch can mend it, so recovery does not catch it: the rank ends with the
// message and its site is dropped like any failed site.
class DeviceError : public Error {
  using Error::Error;
};
// A wait ran past its deadline; the message names who or what was awaited.
class TimeoutError : public Error {
  using Error::Error;
};
// A peer (site or rank) failed or misbehaved; the message names it.
class PeerFailure : public Error {
  using Error::Error;
};

// errno-based failures of the C library, e.g. check_errno(::fsync(fd), "fsync", path).
void throw_errno(const std::string& what, const std::string& path,
                 std::source_location loc = std::source_location::current());

}  // namespace desloc
