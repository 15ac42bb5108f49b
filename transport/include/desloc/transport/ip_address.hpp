// An IP address as the control plane carries it: 16 bytes of IPv6, IPv4 in its mapped form
// (::ffff:a.b.c.d). The straggler rule uses it to tell which site a slow socket leads to.
#pragma once

#include <array>
#include <cstdint>
#include <string>

struct sockaddr;

namespace desloc::transport {

using IpAddress = std::array<std::uint8_t, 16>;
inline constexpr IpAddress kNoAddress{};  // unknown

// From a socket address; kNoAddress for a family other than AF_INET and AF_INET6.
IpAddress ip_address(const sockaddr& address);
// From text, "10.0.0.2" or "fe80::1"; kNoAddress for anything else.
IpAddress parse_ip_address(const std::string& text);
// "10.0.0.2" for a mapped IPv4 address, "::1" for IPv6, "unknown" for kNoAddress.
std::string ip_text(const IpAddress& address);

}  // namespace desloc::transport
