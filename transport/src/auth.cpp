// Job token loading and the HMAC-SHA256 challenge-response, on OpenSSL's one-shot HMAC().
#include "desloc/transport/auth.hpp"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <filesystem>
#include <string_view>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/core/log.hpp"

namespace desloc::transport {
namespace {
constexpr std::string_view kDomain = "desloc-auth-v1";
}  // namespace

void check_openssl(int result, const char* call, std::source_location loc) {
  if (result == 1) return;
  std::string detail;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!detail.empty()) detail += "; ";
    detail += buf;
  }
  throw TransportError(std::string("OpenSSL call ") + call + " failed (" +
                           (detail.empty() ? "no error queued" : detail) +
                           "); check the OpenSSL installation",
                       loc);
}

JobToken JobToken::from_string(std::string secret, std::string origin) {
  if (secret.empty())
    throw ConfigError(
        "job token from " + origin +
        " is empty; set a non-empty shared secret for every rank and the coordinator");
  return JobToken(std::move(secret), std::move(origin));
}

JobToken JobToken::from_file(const std::string& path) {
  std::vector<std::uint8_t> bytes;
  try {
    bytes = read_file(path);
  } catch (const Error& e) {
    throw ConfigError("cannot read the job token file: " + e.message());
  }
  std::string secret(bytes.begin(), bytes.end());
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  // A world-readable secret is still a secret we can use, but the user should know.
  std::error_code ec;
  const auto perms = std::filesystem::status(path, ec).permissions();
  if (!ec && (perms & (std::filesystem::perms::group_read | std::filesystem::perms::others_read)) !=
                 std::filesystem::perms::none)
    log::warn("job token file '{}' is readable by group/others; chmod 600 it", path);
  return from_string(std::move(secret), "file '" + path + "'");
}

JobToken JobToken::random() {
  const Nonce n = random_nonce();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (auto b : n) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return JobToken(std::move(s), "random");
}

std::array<std::uint8_t, kMacBytes> JobToken::respond(std::span<const std::uint8_t> nonce) const {
  std::vector<std::uint8_t> msg(kDomain.begin(), kDomain.end());
  msg.insert(msg.end(), nonce.begin(), nonce.end());
  std::array<std::uint8_t, kMacBytes> mac{};
  unsigned int len = 0;
  DESLOC_CHECK_OPENSSL(HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
                            msg.data(), msg.size(), mac.data(), &len) != nullptr &&
                       len == kMacBytes);
  return mac;
}

bool JobToken::verify(std::span<const std::uint8_t> nonce,
                      std::span<const std::uint8_t> mac) const {
  if (mac.size() != kMacBytes) return false;
  const auto expected = respond(nonce);
  return CRYPTO_memcmp(expected.data(), mac.data(), kMacBytes) == 0;
}

bool JobToken::matches(std::string_view candidate) const {
  if (candidate.empty()) return false;
  const Nonce fixed{};
  return JobToken(std::string(candidate), "bearer").verify(fixed, respond(fixed));
}

Nonce random_nonce() {
  Nonce n{};
  DESLOC_CHECK_OPENSSL(RAND_bytes(n.data(), static_cast<int>(n.size())));
  return n;
}

}  // namespace desloc::transport
