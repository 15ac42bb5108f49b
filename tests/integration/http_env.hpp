// Helpers of the status endpoint's tests (status_http_test, dashboard_test): waiting for a
// condition, a free loopback port, the endpoint's port from a job's log, and a topology whose
// links the endpoint holds the ring to.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cluster_env.hpp"
#include "test_env.hpp"

namespace desloc::test {

inline bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// Waits until `probe` is true or `seconds` pass.
template <class Probe>
bool eventually(Probe&& probe, int seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (probe()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

// A port nobody listens on now (the kernel's pick for a socket bound to port 0).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// The status endpoint's port, from the line launch or the coordinator prints
// ("... on http://HOST:PORT/"); 0 when it has not appeared within `seconds`.
inline int http_port(const Process& p, const std::string& host = "127.0.0.1", int seconds = 30) {
  int port = 0;
  const std::string prefix = "on http://" + host + ":";
  eventually(
      [&] {
        const std::string out = p.output();
        const auto at = out.find(prefix);
        if (at != std::string::npos) port = std::atoi(out.c_str() + at + prefix.size());
        return port != 0;
      },
      seconds);
  return port;
}

// A topology.toml of `sites` with every link at `mbit`.
inline fs::path write_topology(const fs::path& path, const std::vector<std::string>& sites,
                               double mbit) {
  std::string t;
  for (const auto& s : sites) t += "[[site]]\nname = \"" + s + "\"\nstep_ms = 100\n";
  for (const auto& a : sites)
    for (const auto& b : sites)
      if (a != b)
        t += "[[link]]\nfrom = \"" + a + "\"\nto = \"" + b +
             "\"\nbandwidth_mbit = " + std::to_string(mbit) + "\nlatency_ms = 0.1\n";
  return write_text(path, t);
}

}  // namespace desloc::test
