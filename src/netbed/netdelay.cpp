// desloc-netdelay: the test bed's delay line. This kernel has no netem, so scripts/netbed.sh
// sends each link's packets, at the INPUT hook of the receiving site's namespace, to an
// NFQUEUE (one queue per sending site); this program holds each packet and gives its ACCEPT
// verdict when its one-way delay has passed, or drops it with the link's loss probability.
//
// It must sit on the receiving side: a packet held at the sender's OUTPUT hook still belongs
// to its socket, and TCP small queues then stall the sender (docs/netbed.md).
//
// Packets of one queue leave in the order they came: a jittered delay never releases a packet
// before the one ahead of it (netem reorders under jitter; real links between two datacenters
// rarely do, and reordering would make TCP's fast retransmit fire on a healthy link).
//
// usage: desloc-netdelay --queue N=DELAY[/JITTER[/LOSS]] [--queue ...] [--seed S]
//   DELAY, JITTER: 20ms, 500us, 0.2s; LOSS: 0.1% or 0.001. On SIGTERM or SIGINT it prints one
//   line of statistics per queue to stderr and exits 0; the kernel drops what is still held.

// netinet/in.h (through arpa/inet.h) comes before the kernel's headers, which then leave its
// definitions alone.
#include <arpa/inet.h>
#include <time.h>

#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

using Nanos = std::int64_t;

Nanos now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return Nanos{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "desloc-netdelay: error: %s\n", message.c_str());
  std::exit(2);
}

// "20ms", "500us", "0.2s", "0" -> nanoseconds; -1 for anything else.
Nanos parse_duration(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !(value >= 0)) return -1;
  const std::string unit(end);
  double scale = 0;
  if (unit == "s")
    scale = 1e9;
  else if (unit == "ms")
    scale = 1e6;
  else if (unit == "us")
    scale = 1e3;
  else if (unit == "ns" || (unit.empty() && value == 0))
    scale = 1;
  else
    return -1;
  const double ns = value * scale;
  return ns <= 60e9 ? static_cast<Nanos>(ns + 0.5) : -1;  // a minute is no link's delay
}

// "0.1%" or "0.001" -> a probability in [0, 1); -1 for anything else.
double parse_loss(const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str()) return -1;
  if (std::string(end) == "%")
    value /= 100;
  else if (*end != '\0')
    return -1;
  return value >= 0 && value < 1 ? value : -1;
}

struct Held {
  std::uint32_t id;
  Nanos release;
};

// One link into this site: its queue, its delay model, what it holds and what it did.
struct Link {
  std::uint16_t queue = 0;
  Nanos delay = 0, jitter = 0;
  double loss = 0;
  nfq_q_handle* handle = nullptr;
  std::deque<Held> held;  // release times never decrease
  Nanos last_release = 0;
  std::uint64_t packets = 0, dropped = 0, max_held = 0;
  Nanos late_max = 0;  // how much later than due a verdict went out
  double late_sum = 0;
};

struct State {
  std::map<std::uint16_t, Link> links;
  std::mt19937_64 rng;
  std::normal_distribution<double> normal{0.0, 1.0};
  std::uniform_real_distribution<double> uniform{0.0, 1.0};
};

State* g_state = nullptr;
volatile std::sig_atomic_t g_stop = 0;

void on_signal(int) { g_stop = 1; }

int on_packet(nfq_q_handle* handle, nfgenmsg*, nfq_data* data, void* user) {
  auto& link = *static_cast<Link*>(user);
  const nfqnl_msg_packet_hdr* header = nfq_get_msg_packet_hdr(data);
  if (header == nullptr) return 0;
  const std::uint32_t id = ntohl(header->packet_id);
  ++link.packets;
  State& s = *g_state;
  if (link.loss > 0 && s.uniform(s.rng) < link.loss) {
    ++link.dropped;
    nfq_set_verdict(handle, id, NF_DROP, 0, nullptr);
    return 0;
  }
  Nanos delay = link.delay;
  if (link.jitter > 0)
    delay = std::max<Nanos>(0, delay + static_cast<Nanos>(s.normal(s.rng) * link.jitter));
  const Nanos release = std::max(now_ns() + delay, link.last_release);
  link.last_release = release;
  link.held.push_back({id, release});
  link.max_held = std::max<std::uint64_t>(link.max_held, link.held.size());
  return 0;
}

// Accepts every packet of every link whose time has come: one batch verdict per link (it
// accepts every id up to the given one; the dropped ones already have theirs). Returns the
// time the next packet is due, or -1 if nothing is held.
Nanos release_due(State& s) {
  const Nanos now = now_ns();
  Nanos next = -1;
  for (auto& [queue, link] : s.links) {
    std::uint32_t last = 0;
    bool any = false;
    while (!link.held.empty() && link.held.front().release <= now) {
      const Nanos late = now - link.held.front().release;
      link.late_max = std::max(link.late_max, late);
      link.late_sum += static_cast<double>(late);
      last = link.held.front().id;
      any = true;
      link.held.pop_front();
    }
    if (any) nfq_set_verdict_batch(link.handle, last, NF_ACCEPT);
    if (!link.held.empty() && (next < 0 || link.held.front().release < next))
      next = link.held.front().release;
  }
  return next;
}

void print_statistics(const State& s) {
  for (const auto& [queue, link] : s.links) {
    const std::uint64_t accepted = link.packets - link.dropped - link.held.size();
    std::fprintf(stderr,
                 "desloc-netdelay: queue %u delay %.3f ms jitter %.3f ms loss %.4f%%: %llu "
                 "packets, %llu dropped, %llu held at exit, at most %llu held at once; verdicts "
                 "late by %.1f us on average, %.1f us at most\n",
                 queue, link.delay / 1e6, link.jitter / 1e6, link.loss * 100,
                 static_cast<unsigned long long>(link.packets),
                 static_cast<unsigned long long>(link.dropped),
                 static_cast<unsigned long long>(link.held.size()),
                 static_cast<unsigned long long>(link.max_held),
                 accepted > 0 ? link.late_sum / static_cast<double>(accepted) / 1e3 : 0.0,
                 link.late_max / 1e3);
  }
}

void usage() {
  std::fprintf(stderr,
               "usage: desloc-netdelay --queue N=DELAY[/JITTER[/LOSS]] [--queue ...] [--seed S]\n"
               "  Holds the packets an iptables NFQUEUE rule sends to queue N for DELAY (plus a\n"
               "  normal JITTER with that sigma, never reordering), drops them with probability\n"
               "  LOSS. DELAY and JITTER: 20ms, 500us, 0.2s; LOSS: 0.1%% or 0.001.\n"
               "  Started and stopped by scripts/netbed.sh (--rtt, --jitter, --loss).\n");
}

// "3=20ms/1ms/0.1%" -> a link.
Link parse_queue(const std::string& arg) {
  const auto eq = arg.find('=');
  if (eq == std::string::npos) die("--queue '" + arg + "': want N=DELAY[/JITTER[/LOSS]]");
  Link link;
  char* end = nullptr;
  const long queue = std::strtol(arg.c_str(), &end, 10);
  if (end != arg.c_str() + eq || queue < 0 || queue > 65535)
    die("--queue '" + arg + "': the queue number must be 0..65535");
  link.queue = static_cast<std::uint16_t>(queue);
  std::vector<std::string> parts;
  std::string rest = arg.substr(eq + 1) + "/";
  for (std::size_t at = 0, slash; (slash = rest.find('/', at)) != std::string::npos; at = slash + 1)
    parts.push_back(rest.substr(at, slash - at));
  if (parts.empty() || parts.size() > 3) die("--queue '" + arg + "': want N=DELAY[/JITTER[/LOSS]]");
  link.delay = parse_duration(parts[0]);
  if (link.delay < 0) die("--queue '" + arg + "': bad delay '" + parts[0] + "' (e.g. 20ms)");
  if (parts.size() > 1 && (link.jitter = parse_duration(parts[1])) < 0)
    die("--queue '" + arg + "': bad jitter '" + parts[1] + "' (e.g. 2ms)");
  if (parts.size() > 2 && (link.loss = parse_loss(parts[2])) < 0)
    die("--queue '" + arg + "': bad loss '" + parts[2] + "' (e.g. 0.1%, below 100%)");
  return link;
}

}  // namespace

int main(int argc, char** argv) {
  State state;
  std::uint64_t seed = std::random_device{}();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      usage();
      return 0;
    }
    if (i + 1 >= argc) die("'" + arg + "' needs a value (see --help)");
    const std::string value = argv[++i];
    if (arg == "--queue") {
      Link link = parse_queue(value);
      if (!state.links.emplace(link.queue, link).second)
        die("queue " + std::to_string(link.queue) + " given twice");
    } else if (arg == "--seed") {
      seed = std::strtoull(value.c_str(), nullptr, 10);
    } else {
      die("unknown argument '" + arg + "' (see --help)");
    }
  }
  if (state.links.empty()) {
    usage();
    return 2;
  }
  state.rng.seed(seed);
  g_state = &state;

  // The verdicts are due at microsecond precision; the default 50 us timer slack would add
  // that much to every wake-up.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  nfq_handle* nfq = nfq_open();
  if (nfq == nullptr) die(std::string("nfq_open: ") + std::strerror(errno) + " (needs root)");
  for (auto& [queue, link] : state.links) {
    link.handle = nfq_create_queue(nfq, queue, on_packet, &link);
    if (link.handle == nullptr)
      die("cannot bind queue " + std::to_string(queue) + ": " + std::strerror(errno) +
          " (is another program bound to it?)");
    // Only the packet's id is needed: no payload crosses into this process, and GSO packets
    // come whole instead of segmented (a 64 KiB burst is one verdict, not 45).
    if (nfq_set_mode(link.handle, NFQNL_COPY_META, 0) < 0)
      die("queue " + std::to_string(queue) + ": cannot set copy mode");
    // 1 Gbit/s x 150 ms in full-size packets is 12,500; leave room for small ones.
    nfq_set_queue_maxlen(link.handle, 1 << 17);
    nfq_set_queue_flags(link.handle, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO);
  }
  nfnl_rcvbufsiz(nfq_nfnlh(nfq), 64u << 20);  // forced (root): a burst must not overflow it
  const int fd = nfq_fd(nfq);
  std::fprintf(stderr, "desloc-netdelay: ready, %zu queue(s)\n", state.links.size());

  std::vector<char> buffer(1 << 16);
  std::uint64_t overflows = 0;
  while (g_stop == 0) {
    const Nanos next = release_due(state);
    timespec wait{};
    timespec* timeout = nullptr;
    if (next >= 0) {
      const Nanos left = std::max<Nanos>(0, next - now_ns());
      wait.tv_sec = left / 1'000'000'000;
      wait.tv_nsec = left % 1'000'000'000;
      timeout = &wait;
    }
    pollfd p{fd, POLLIN, 0};
    if (ppoll(&p, 1, timeout, nullptr) <= 0) continue;  // a deadline, or a signal
    for (;;) {
      const ssize_t n = recv(fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
      if (n > 0) {
        nfq_handle_packet(nfq, buffer.data(), static_cast<int>(n));
        continue;
      }
      // ENOBUFS: the socket overflowed and some packets will never get a verdict from us;
      // the kernel frees them when the queue is destroyed. Counted, never silent.
      if (n < 0 && errno == ENOBUFS) {
        ++overflows;
        continue;
      }
      break;
    }
  }
  print_statistics(state);
  if (overflows > 0)
    std::fprintf(stderr, "desloc-netdelay: the netlink socket overflowed %llu time(s)\n",
                 static_cast<unsigned long long>(overflows));
  for (auto& [queue, link] : state.links) nfq_destroy_queue(link.handle);
  nfq_close(nfq);
  return 0;
}
