// IpAddress: see ip_address.hpp.
#include "desloc/transport/ip_address.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

namespace desloc::transport {
namespace {

IpAddress mapped_v4(const in_addr& v4) {
  IpAddress a = kNoAddress;
  a[10] = 0xff;
  a[11] = 0xff;
  std::memcpy(a.data() + 12, &v4, 4);
  return a;
}

}  // namespace

IpAddress ip_address(const sockaddr& address) {
  if (address.sa_family == AF_INET) {
    sockaddr_in v4{};
    std::memcpy(&v4, &address, sizeof v4);
    return mapped_v4(v4.sin_addr);
  }
  if (address.sa_family == AF_INET6) {
    sockaddr_in6 v6{};
    std::memcpy(&v6, &address, sizeof v6);
    IpAddress a;
    std::memcpy(a.data(), &v6.sin6_addr, a.size());
    return a;
  }
  return kNoAddress;
}

IpAddress parse_ip_address(const std::string& text) {
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) return mapped_v4(v4);
  in6_addr v6{};
  if (inet_pton(AF_INET6, text.c_str(), &v6) != 1) return kNoAddress;
  IpAddress a;
  std::memcpy(a.data(), &v6, a.size());
  return a;
}

std::string ip_text(const IpAddress& address) {
  if (address == kNoAddress) return "unknown";
  char buf[INET6_ADDRSTRLEN] = {};
  const bool v4 =
      std::all_of(address.begin(), address.begin() + 10, [](auto b) { return b == 0; }) &&
      address[10] == 0xff && address[11] == 0xff;
  if (v4) {
    in_addr a{};
    std::memcpy(&a, address.data() + 12, 4);
    inet_ntop(AF_INET, &a, buf, sizeof buf);
  } else {
    in6_addr a{};
    std::memcpy(&a, address.data(), address.size());
    inet_ntop(AF_INET6, &a, buf, sizeof buf);
  }
  return buf;
}

}  // namespace desloc::transport
