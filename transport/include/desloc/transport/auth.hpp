// Job authentication for the control plane: a shared job token proves membership through an
// HMAC-SHA256 challenge-response, so the token itself never crosses the network.
#pragma once

#include <array>
#include <cstdint>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "desloc/transport/wire.hpp"

namespace desloc::transport {

inline constexpr std::size_t kMacBytes = 32;  // HMAC-SHA256 output
using Nonce = std::array<std::uint8_t, kNonceBytes>;

// The job's shared secret. Copyable so options structs can hold it; it never appears in
// logs or error messages (only its origin does).
class JobToken {
 public:
  // A secret given inline (e.g. the config's `token` key). Empty is a ConfigError.
  static JobToken from_string(std::string secret, std::string origin = "config");
  // A secret read from a file; one trailing newline is stripped. A missing, unreadable or
  // empty file is a ConfigError naming the path.
  static JobToken from_file(const std::string& path);
  // A fresh random token, for `desloc launch` where one process hands it to every rank.
  static JobToken random();

  // HMAC-SHA256(secret, "desloc-auth-v1" || nonce). The domain prefix keeps this MAC from
  // being replayable as any other use of the same secret.
  std::array<std::uint8_t, kMacBytes> respond(std::span<const std::uint8_t> nonce) const;
  // Constant-time check of a peer's response (CRYPTO_memcmp); a wrong length is just false.
  bool verify(std::span<const std::uint8_t> nonce, std::span<const std::uint8_t> mac) const;
  // Whether `candidate` is this secret (an HTTP bearer token), in constant time: both are
  // MACed over one fixed nonce and the MACs compared.
  bool matches(std::string_view candidate) const;
  const std::string& origin() const { return origin_; }

 private:
  JobToken(std::string secret, std::string origin)
      : secret_(std::move(secret)), origin_(std::move(origin)) {}
  std::string secret_;
  std::string origin_;  // "config", a file path, or "random"
};

// A cryptographically random nonce (RAND_bytes).
Nonce random_nonce();

// The one checked helper for OpenSSL calls that return 1 on success: on failure it throws
// TransportError with the call text and OpenSSL's error queue.
void check_openssl(int result, const char* call,
                   std::source_location loc = std::source_location::current());
#define DESLOC_CHECK_OPENSSL(call) ::desloc::transport::check_openssl((call), #call)

}  // namespace desloc::transport
