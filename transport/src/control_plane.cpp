// Coordinator and RankClient over Boost.Asio. Each side runs one io_context on one thread, so
// connection state needs no strand; state that other threads query sits behind a mutex.
#include "desloc/transport/control_plane.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <utility>  // before Asio: Boost 1.74 awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>

#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"

#include "control_stream.hpp"

namespace desloc::transport {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using std::chrono::milliseconds;

// How long a closing side waits for the peer's EOF after its last frame, so that frame is
// read before the kernel would answer unread data with an RST.
constexpr milliseconds kLingerTime{1000};
constexpr std::size_t kReadChunkBytes = 4096;
constexpr std::size_t kMaxListedMissing = 16;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string endpoint_name(const tcp::socket& s) {
  boost::system::error_code ec;
  const auto ep = s.remote_endpoint(ec);
  if (ec) return "<unknown peer>";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

bool valid_site_name(const std::string& s) {
  if (s.empty() || s.size() > kMaxSiteNameBytes) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  });
}

// One framed connection over TCP or TLS (`tls` non-null; its handshake is the subclass's, before
// start_reading): a read loop feeding a FrameDecoder, a write queue (Asio allows one
// async_write in flight), and a graceful close. Subclasses see frames and the close.
// Everything runs on the owning io_context's single thread.
class FramedPeer : public std::enable_shared_from_this<FramedPeer> {
 public:
  FramedPeer(tcp::socket socket, ssl::context* tls, std::string name, std::size_t max_payload)
      : stream_(std::move(socket), tls),
        name_(std::move(name)),
        decoder_(name_, max_payload),
        linger_(stream_.socket().get_executor()) {}
  virtual ~FramedPeer() = default;

  tcp::socket& socket() { return stream_.socket(); }
  ControlStream& stream() { return stream_; }
  std::size_t buffered() const { return decoder_.buffered(); }  // bytes of a partial frame
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  bool closed() const { return closed_; }
  bool finishing() const { return finishing_; }

  void start_reading() { do_read(); }

  void send(std::vector<std::uint8_t> frame) {
    if (closed_ || finishing_) return;
    queue_.push_back(std::move(frame));
    if (!writing_) do_write();
  }

  // Flush what is queued, half-close, then wait (bounded) for the peer to close its side.
  void finish() {
    if (closed_ || finishing_) return;
    finishing_ = true;
    if (!writing_) shutdown_send();
    linger_.expires_after(kLingerTime);
    linger_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->close_with("");
    });
  }

  void abort(const std::string& reason) { close_with(reason); }

 protected:
  virtual void on_frame(Frame frame) = 0;
  virtual void on_protocol_error(const std::string& what) = 0;
  virtual void on_closed(const std::string& reason) = 0;  // exactly once; "" if we closed it

 private:
  void do_read() {
    stream_.async_read_some(
        asio::buffer(read_buf_),
        [self = shared_from_this()](const boost::system::error_code& ec, std::size_t n) {
          self->handle_read(ec, n);
        });
  }

  void handle_read(const boost::system::error_code& ec, std::size_t n) {
    if (closed_) return;
    if (ec) {
      if (finishing_) return close_with("");
      if (is_end_of_stream(ec))
        return close_with(decoder_.buffered() > 0
                              ? fmt::format("peer closed the connection mid-frame ({} bytes of a "
                                            "partial frame buffered)",
                                            decoder_.buffered())
                              : std::string("peer closed the connection"));
      return close_with("read failed: " + ec.message());
    }
    if (finishing_) return do_read();  // draining until EOF; nothing more is processed
    try {
      decoder_.feed({read_buf_.data(), n});
      while (!closed_ && !finishing_) {
        auto frame = decoder_.next();
        if (!frame) break;
        on_frame(std::move(*frame));
      }
    } catch (const Error& e) {
      on_protocol_error(e.message());
    } catch (const std::exception& e) {
      // Anything a hostile frame provokes (even bad_alloc) ends only this connection.
      on_protocol_error(e.what());
    }
    if (!closed_) do_read();
  }

  void do_write() {
    writing_ = true;
    stream_.async_write(
        asio::buffer(queue_.front()),
        [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
          self->writing_ = false;
          if (self->closed_) return;
          if (ec) return self->close_with("write failed: " + ec.message());
          self->queue_.pop_front();
          if (!self->queue_.empty()) return self->do_write();
          if (self->finishing_) self->shutdown_send();
        });
  }

  void shutdown_send() {
    boost::system::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  void close_with(const std::string& reason) {
    if (closed_) return;
    closed_ = true;
    linger_.cancel();
    boost::system::error_code ignored;
    stream_.socket().close(ignored);
    queue_.clear();
    on_closed(reason);
  }

  ControlStream stream_;
  std::string name_;
  FrameDecoder decoder_;
  asio::steady_timer linger_;
  std::array<std::uint8_t, kReadChunkBytes> read_buf_{};
  std::deque<std::vector<std::uint8_t>> queue_;
  bool writing_ = false;
  bool finishing_ = false;
  bool closed_ = false;
};

}  // namespace

// ============================================================================ Coordinator

struct Coordinator::Impl {
  class Session;
  struct Registration {
    std::shared_ptr<Session> session;  // null once the connection closed
    std::string peer;
    std::vector<std::uint8_t> worker_address;
    Clock::time_point last_seen;
    bool reported_missing = false;
    std::uint64_t step = 0;  // from the latest heartbeat
    bool finished = false;   // said Bye: its disconnect is the end of its work, not a failure
    bool joining = false;    // its site left and is rejoining: not yet in the membership
    std::uint64_t rebuilt_epoch = 0;  // reconnected to a restarted coordinator at this epoch
    bool reattached = false;          // reconnected to this coordinator after a broken link
  };

  explicit Impl(CoordinatorOptions o) : options(std::move(o)) {}

  CoordinatorOptions options;
  // Set when options.tls.enabled. Before io: every stream (held by io's handlers) must go first.
  std::unique_ptr<ssl::context> tls_context;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer check_timer{io};
  std::thread thread;
  std::atomic<std::uint16_t> bound_port{0};

  mutable std::mutex mu;  // guards the fields below against the query functions
  std::map<RankId, Registration> registry;
  std::optional<Membership> membership;
  std::exception_ptr error;
  // Recovery (elastic): the current epoch failed and the survivors' Recover reports are
  // being collected.
  bool recovering = false;
  Clock::time_point recovery_start;
  std::string recovery_reason;
  std::set<std::string> failing_sites;  // dropped when this recovery ends
  std::map<RankId, Recover> reports;
  std::map<std::string, std::string> departed_sites;  // site -> "epoch N: why"
  // After a coordinator restart: the newest epoch a reconnecting rank reported, and when the
  // last one came; the membership is rebuilt once they stop coming.
  std::uint64_t rebuild_epoch = 0;
  Clock::time_point last_rebuild_registration;

  // io-thread only
  std::vector<std::weak_ptr<Session>> sessions;  // every live connection, for stop()
  std::size_t status_sent_for = 0;               // registry size at the last Status broadcast

  std::size_t world() const { return options.num_sites * options.ranks_per_site; }

  void do_accept();
  void schedule_check();
  std::optional<Reject> admit(const Hello& hello, const std::string& peer);
  void registered(const std::shared_ptr<Session>& s, const RankId& id);
  void heartbeat(const RankId& id, const Heartbeat& hb);
  void rank_closed(const RankId& id, const std::string& peer, const std::string& reason);
  void bye(const RankId& id, const Bye& b);
  // Elastic recovery: begin (idempotent; `site` joins the dropped set when non-empty), take a
  // survivor's report, and open the next epoch once every survivor reported or the timeout
  // passed.
  void begin_recovery(const std::string& reason, const std::string& site);
  void recover_report(const RankId& id, Recover report);
  void try_finish_recovery(bool timed_out);
  // After a restart: once reconnecting ranks stop arriving (for heartbeat_timeout), the
  // membership is the sites whose every rank came back, at the newest epoch they reported.
  // Nothing is broadcast: the ranks already train in it.
  void rebuild_membership_if_quiet();
  Status status_locked() const;
  // After the membership: every rank that disconnected or went silent, so that the others can
  // name the failed peer when a collective stalls. Sent to every connected rank.
  void broadcast_lost();
  std::vector<std::string> unregistered_locked() const;
  void run();
};

class Coordinator::Impl::Session : public FramedPeer {
 public:
  Session(tcp::socket socket, std::string name, Impl& coord)
      : FramedPeer(std::move(socket), coord.tls_context.get(), std::move(name),
                   coord.options.max_frame_payload),
        coord_(coord),
        handshake_timer_(coord.io) {}

  void start() {
    // Fresh per connection, so an AuthResponse recorded on one connection is no answer on
    // another.
    nonce_ = random_nonce();
    handshake_timer_.expires_after(coord_.options.handshake_timeout);
    handshake_timer_.async_wait([self = std::static_pointer_cast<Session>(shared_from_this())](
                                    const boost::system::error_code& ec) {
      if (ec || self->closed() || self->state_ == State::kRegistered ||
          self->state_ == State::kDone)
        return;
      const auto limit = self->coord_.options.handshake_timeout.count();
      if (self->state_ == State::kTlsHandshake)
        return self->refuse_tls(fmt::format("no TLS handshake within {} ms", limit));
      const auto partial = self->buffered();
      self->refuse(RejectCode::kHandshakeTimeout,
                   fmt::format("did not complete the handshake within {} ms{}; dropping it", limit,
                               partial == 0 ? std::string()
                                            : fmt::format(" (stalled mid-frame, {} bytes of a "
                                                          "partial frame buffered)",
                                                          partial)));
    });
    if (!stream().tls()) return challenge();
    state_ = State::kTlsHandshake;
    stream().tls_stream().async_handshake(
        ssl::stream_base::server, [self = std::static_pointer_cast<Session>(shared_from_this())](
                                      const boost::system::error_code& ec) {
          if (self->closed() || self->state_ != State::kTlsHandshake) return;
          if (ec) return self->refuse_tls("TLS handshake failed: " + describe_tls_error(ec));
          self->challenge();
        });
  }

  void refuse(RejectCode code, const std::string& reason) {
    if (state_ == State::kRegistered) coord_.rank_closed(id_, name(), "refused: " + reason);
    log::warn("coordinator: refusing {} ({}): {}", name(), reject_code_name(code), reason);
    send(encode(Reject{code, reason}));
    state_ = State::kDone;
    handshake_timer_.cancel();
    finish();
  }

 private:
  enum class State { kTlsHandshake, kAwaitAuth, kAwaitHello, kRegistered, kDone };

  void challenge() {
    state_ = State::kAwaitAuth;
    send(encode(Challenge{nonce_}));
    start_reading();
  }

  // Without a TLS session nothing can go out over TLS, so the Reject is sent in plaintext: a
  // rank that was not configured for TLS reads it as the reason it was refused.
  void refuse_tls(const std::string& reason) {
    log::warn("coordinator: refusing {} (tls): {}", name(), reason);
    state_ = State::kDone;
    handshake_timer_.cancel();
    boost::system::error_code ignored;
    socket().cancel(ignored);  // a handshake still in progress ends with operation_aborted
    stream().fall_back_to_plain();
    send(encode(Reject{RejectCode::kAuth,
                       reason + "; this coordinator requires TLS: set [job] tls = true and "
                                "tls_ca on every rank"}));
    finish();
  }

  void on_frame(Frame frame) override {
    switch (state_) {
      case State::kAwaitAuth: {
        const auto resp = decode<AuthResponse>(frame);
        const auto& token = *coord_.options.token;
        if (resp.mac.empty())
          return refuse(RejectCode::kAuth,
                        "no job token presented; give this rank the job's token (config `token` "
                        "or token file)");
        if (!token.verify(nonce_, resp.mac))
          return refuse(RejectCode::kAuth,
                        "wrong job token (HMAC-SHA256 response does not match); use the same "
                        "token as the coordinator");
        state_ = State::kAwaitHello;
        return;
      }
      case State::kAwaitHello: {
        const auto hello = decode<Hello>(frame);
        if (auto reject = coord_.admit(hello, name())) return refuse(reject->code, reject->reason);
        id_ = RankId{hello.site, hello.rank};
        set_name(fmt::format("rank {} ({})", id_.str(), endpoint_name(socket())));
        state_ = State::kRegistered;
        handshake_timer_.cancel();
        send(encode(Welcome{fmt::format("registered {}", id_.str())}));
        coord_.registered(std::static_pointer_cast<Session>(shared_from_this()), id_);
        return;
      }
      case State::kRegistered:
        if (frame.type == MessageType::kHeartbeat)
          return coord_.heartbeat(id_, decode<Heartbeat>(frame));
        if (frame.type == MessageType::kRecover)
          return coord_.recover_report(id_, decode<Recover>(frame));
        if (frame.type == MessageType::kBye) return coord_.bye(id_, decode<Bye>(frame));
        throw DataError(
            fmt::format("unexpected {} frame after registration", message_type_name(frame.type)));
      case State::kTlsHandshake:  // frames are read only after the handshake
      case State::kDone:
        return;
    }
  }

  void on_protocol_error(const std::string& what) override {
    if (state_ == State::kDone) return abort("");
    refuse(RejectCode::kProtocol, what);
  }

  void on_closed(const std::string& reason) override {
    handshake_timer_.cancel();
    if (state_ == State::kRegistered) {
      coord_.rank_closed(id_, name(), reason);
    } else if (!reason.empty()) {
      log::info("coordinator: {} closed before registering: {}", name(), reason);
    }
    state_ = State::kDone;
  }

  Impl& coord_;
  asio::steady_timer handshake_timer_;
  Nonce nonce_{};
  State state_ = State::kAwaitAuth;
  RankId id_;
};

void Coordinator::Impl::do_accept() {
  acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      log::warn("coordinator: accept failed: {}; still listening", ec.message());
    } else {
      std::string name = "connection " + endpoint_name(socket);
      auto s = std::make_shared<Session>(std::move(socket), std::move(name), *this);
      std::erase_if(sessions, [](const auto& w) { return w.expired(); });
      sessions.push_back(s);
      s->start();
    }
    do_accept();
  });
}

std::optional<Reject> Coordinator::Impl::admit(const Hello& h, const std::string& peer) {
  const RankId id{h.site, h.rank};
  if (h.protocol_version != options.protocol_version)
    return Reject{RejectCode::kVersion,
                  fmt::format("protocol version {} from {} but the coordinator speaks {}; run "
                              "the same desloc build everywhere",
                              h.protocol_version, id.str(), options.protocol_version)};
  if (h.config_hash != options.config_hash)
    return Reject{RejectCode::kConfigHash,
                  fmt::format("config hash {:#018x} from {} differs from the coordinator's "
                              "{:#018x}; every rank must run the same job config",
                              h.config_hash, id.str(), options.config_hash)};
  if (!valid_site_name(h.site))
    return Reject{RejectCode::kWorldSize,
                  fmt::format("site name '{}' is invalid; use 1-{} characters of [A-Za-z0-9._-]",
                              h.site.substr(0, 64), kMaxSiteNameBytes)};
  if (h.rank >= options.ranks_per_site)
    return Reject{
        RejectCode::kWorldSize,
        fmt::format("rank {} of site '{}' is outside 0..{}; the job has {} ranks per site", h.rank,
                    h.site, options.ranks_per_site - 1, options.ranks_per_site)};
  std::lock_guard lock(mu);
  if (h.epoch > 0) {
    // A rank that trains in epoch h.epoch lost its coordinator and reconnects.
    if (membership) {
      const auto it = registry.find(id);
      if (it != registry.end() && !it->second.session && !failing_sites.contains(h.site) &&
          !it->second.joining) {
        it->second.peer = peer;  // a broken connection to this same coordinator
        it->second.reattached = true;
        it->second.last_seen = Clock::now();
        it->second.reported_missing = false;
        return std::nullopt;
      }
      return Reject{RejectCode::kWorldSize,
                    fmt::format("{} reconnects at epoch {}, but it is not a live member of this "
                                "coordinator's epoch {}",
                                id.str(), h.epoch, membership->epoch)};
    }
    if (registry.contains(id))
      return Reject{RejectCode::kDuplicate, fmt::format("{} is already registered", id.str())};
    // A restarted coordinator: the membership is rebuilt from the ranks that come back.
    Registration reg{nullptr, peer, h.worker_address, Clock::now(), false};
    reg.rebuilt_epoch = h.epoch;
    registry[id] = std::move(reg);
    rebuild_epoch = std::max(rebuild_epoch, h.epoch);
    last_rebuild_registration = Clock::now();
    return std::nullopt;
  }
  if (rebuild_epoch > 0)
    return Reject{RejectCode::kWorldSize,
                  fmt::format("{} registers afresh, but this coordinator is rebuilding the "
                              "membership of a running job (epoch {})",
                              id.str(), rebuild_epoch)};
  if (auto d = departed_sites.find(h.site); d != departed_sites.end()) {
    // A restarted site rejoins: once all its ranks are here, the next epoch takes it in.
    if (!options.elastic)
      return Reject{RejectCode::kWorldSize,
                    fmt::format("site '{}' left this job ({}) and the job does not take sites "
                                "back (job.on_site_failure = \"stop\")",
                                h.site, d->second)};
    if (auto it = registry.find(id); it != registry.end())
      return Reject{RejectCode::kDuplicate,
                    fmt::format("{} is already rejoining from {}", id.str(), it->second.peer)};
    Registration reg{nullptr, peer, h.worker_address, Clock::now(), false};
    reg.joining = true;
    registry[id] = std::move(reg);
    return std::nullopt;
  }
  std::set<std::string> sites;
  for (const auto& [k, v] : registry) sites.insert(k.site);
  if (!options.site_names.empty() && std::find(options.site_names.begin(), options.site_names.end(),
                                               h.site) == options.site_names.end())
    return Reject{RejectCode::kWorldSize,
                  fmt::format("site '{}' is not one of the job's sites ({})", h.site,
                              fmt::join(options.site_names, ", "))};
  if (!sites.contains(h.site) && sites.size() >= options.num_sites)
    return Reject{RejectCode::kWorldSize,
                  fmt::format("site '{}' would be site number {} but the job expects {} sites "
                              "({}); check the world size in the config",
                              h.site, sites.size() + 1, options.num_sites, fmt::join(sites, ", "))};
  if (membership && !registry.contains(id))
    return Reject{RejectCode::kWorldSize,
                  fmt::format("{} cannot join: the job already runs (membership epoch {})",
                              id.str(), membership->epoch)};
  if (auto it = registry.find(id); it != registry.end())
    return Reject{RejectCode::kDuplicate,
                  fmt::format("{} is already registered from {}; each (site, rank) must be "
                              "unique",
                              id.str(), it->second.peer)};
  registry[id] = Registration{nullptr, peer, h.worker_address, Clock::now(), false};
  return std::nullopt;
}

void Coordinator::Impl::registered(const std::shared_ptr<Session>& s, const RankId& id) {
  std::vector<std::shared_ptr<Session>> recipients;
  std::vector<std::uint8_t> frame;
  std::string rejoin;  // a site whose ranks are all back
  {
    std::lock_guard lock(mu);
    auto& reg = registry.at(id);
    reg.session = s;
    if (reg.rebuilt_epoch > 0 || reg.reattached) {
      log::info("coordinator: {} reconnected from {} at epoch {}", id.str(), reg.peer,
                reg.reattached ? membership->epoch : reg.rebuilt_epoch);
      reg.reattached = false;
    } else if (reg.joining) {
      std::size_t here = 0;
      for (const auto& [k, v] : registry)
        if (k.site == id.site && v.joining && v.session) ++here;
      log::info("coordinator: {} rejoins from {} ({}/{} of its site)", id.str(), reg.peer, here,
                options.ranks_per_site);
      if (here == options.ranks_per_site) rejoin = id.site;
      frame = encode(status_locked());
      recipients.push_back(s);
    } else if (registry.size() < world() || membership) {
      log::info("coordinator: registered {} from {} ({}/{})", id.str(), reg.peer, registry.size(),
                world());
      frame = encode(status_locked());
      recipients.push_back(s);
    } else {
      Membership m;
      m.epoch = 1;
      // The ring follows the configured site order (the planner's choice); without one, the
      // names sorted.
      if (!options.site_names.empty()) {
        m.sites = options.site_names;
      } else {
        std::set<std::string> sites;
        for (const auto& [k, v] : registry) sites.insert(k.site);
        m.sites.assign(sites.begin(), sites.end());
      }
      for (const auto& [k, v] : registry) m.members.push_back({k.site, k.rank, v.worker_address});
      for (std::uint32_t i = 0; i < m.sites.size(); ++i) m.ring_order.push_back(i);
      frame = encode(m);
      membership = std::move(m);
      for (const auto& [k, v] : registry)
        if (v.session) recipients.push_back(v.session);
      log::info("coordinator: all {} ranks registered; broadcasting membership epoch 1", world());
    }
  }
  for (const auto& r : recipients) r->send(frame);
  if (!rejoin.empty()) begin_recovery(fmt::format("site {} rejoins", rejoin), "");
}

void Coordinator::Impl::heartbeat(const RankId& id, const Heartbeat& hb) {
  std::lock_guard lock(mu);
  const auto it = registry.find(id);
  if (it == registry.end()) return;  // its site left the job; it learns so from the membership
  auto& reg = it->second;
  reg.last_seen = Clock::now();
  reg.step = hb.step;
  if (reg.reported_missing) {
    log::info("coordinator: {} is heartbeating again (step {})", id.str(), hb.step);
    reg.reported_missing = false;
  }
  if (membership && hb.epoch != 0 && hb.epoch != membership->epoch && !recovering &&
      hb.epoch + 1 != membership->epoch)
    log::warn("coordinator: {} reports membership epoch {} but the current one is {}", id.str(),
              hb.epoch, membership->epoch);
}

void Coordinator::Impl::rank_closed(const RankId& id, const std::string& peer,
                                    const std::string& reason) {
  bool failed = false;
  {
    std::lock_guard lock(mu);
    if (auto it = registry.find(id); it != registry.end()) {
      it->second.session.reset();
      failed = !it->second.finished;
    }
  }
  if (!failed) return;  // finished cleanly, or its site already left the job
  if (!reason.empty())
    log::warn("coordinator: {} disconnected: {}{}", peer, reason,
              options.elastic ? ""
                              : fmt::format("; it will be listed missing after {} ms",
                                            options.heartbeat_timeout.count()));
  broadcast_lost();
  begin_recovery(fmt::format("{} disconnected ({})", id.str(), reason.empty() ? "closed" : reason),
                 id.site);
}

void Coordinator::Impl::bye(const RankId& id, const Bye& b) {
  std::lock_guard lock(mu);
  const auto it = registry.find(id);
  if (it == registry.end()) return;
  auto& reg = it->second;
  reg.finished = true;
  reg.step = b.step;
  reg.last_seen = Clock::now();
  log::info("coordinator: {} finished at step {}", id.str(), b.step);
}

void Coordinator::Impl::begin_recovery(const std::string& reason, const std::string& site) {
  std::vector<std::shared_ptr<Session>> recipients;
  std::vector<std::uint8_t> frame;
  {
    std::lock_guard lock(mu);
    if (!membership || !options.elastic || membership->sites.empty()) return;
    if (!site.empty() && !departed_sites.contains(site)) failing_sites.insert(site);
    if (recovering) {
      log::warn("coordinator: also during this recovery: {}", reason);
      return;
    }
    recovering = true;
    recovery_start = Clock::now();
    recovery_reason = reason;
    log::warn(
        "coordinator: closing membership epoch {}: {}; collecting the survivors' rollback "
        "points (timeout {} ms)",
        membership->epoch, reason, options.recovery_timeout.count());
    frame = encode(Recovery{membership->epoch, reason});
    for (const auto& [id, reg] : registry)
      if (reg.session && !reg.finished) recipients.push_back(reg.session);
  }
  for (const auto& r : recipients) r->send(frame);
  try_finish_recovery(false);
}

void Coordinator::Impl::recover_report(const RankId& id, Recover report) {
  std::string reason;
  {
    std::lock_guard lock(mu);
    if (!membership) throw DataError("Recover before the membership");
    if (!options.elastic) {
      log::warn("coordinator: {} asked to recover, but this job stops on a failure", id.str());
      return;
    }
    if (report.epoch != membership->epoch) {
      log::info("coordinator: ignoring {}'s Recover for epoch {} (current epoch {})", id.str(),
                report.epoch, membership->epoch);
      return;
    }
    log::info("coordinator: {} can roll back to step(s) [{}] ({})", id.str(),
              fmt::join(report.snapshots, ", "), report.reason);
    if (!recovering) reason = fmt::format("{} reported: {}", id.str(), report.reason);
    reports[id] = std::move(report);
  }
  if (!reason.empty()) begin_recovery(reason, "");
  try_finish_recovery(false);
}

void Coordinator::Impl::rebuild_membership_if_quiet() {
  std::lock_guard lock(mu);
  if (membership || rebuild_epoch == 0 ||
      Clock::now() - last_rebuild_registration < options.heartbeat_timeout)
    return;
  Membership m;
  m.epoch = rebuild_epoch;
  std::vector<std::string> order = options.site_names;
  for (const auto& [id, reg] : registry)
    if (std::find(order.begin(), order.end(), id.site) == order.end()) order.push_back(id.site);
  std::vector<std::string> partial;
  for (const auto& site : order) {
    std::size_t back = 0;
    for (const auto& [id, reg] : registry)
      if (id.site == site) ++back;
    if (back == options.ranks_per_site)
      m.sites.push_back(site);
    else
      departed_sites[site] =
          fmt::format("not back after the coordinator restarted ({} of {} ranks)", back,
                      options.ranks_per_site);
    if (back > 0 && back < options.ranks_per_site) partial.push_back(site);
  }
  for (const auto& [id, reg] : registry)
    if (std::find(m.sites.begin(), m.sites.end(), id.site) != m.sites.end())
      m.members.push_back({id.site, id.rank, reg.worker_address});
  for (std::uint32_t i = 0; i < m.sites.size(); ++i) m.ring_order.push_back(i);
  m.note = "rebuilt from the ranks after a coordinator restart";
  std::erase_if(registry, [&](const auto& kv) {
    return std::find(m.sites.begin(), m.sites.end(), kv.first.site) == m.sites.end();
  });
  log::warn("coordinator: rebuilt membership epoch {} from the ranks: {} site(s) [{}]{}", m.epoch,
            m.sites.size(), fmt::join(m.sites, ", "),
            partial.empty()
                ? std::string()
                : fmt::format("; incomplete, left out: [{}]", fmt::join(partial, ", ")));
  membership = std::move(m);
}

void Coordinator::Impl::try_finish_recovery(bool timed_out) {
  std::vector<std::shared_ptr<Session>> recipients;
  std::vector<std::uint8_t> frame;
  {
    std::lock_guard lock(mu);
    if (!recovering) return;
    // A site with any lost rank leaves whole; then every rank of the others must report.
    for (const auto& [id, reg] : registry)
      if (!failing_sites.contains(id.site) && (!reg.session || reg.reported_missing)) {
        log::warn("coordinator: {} is {}; dropping site {}", id.str(),
                  reg.session ? "silent" : "disconnected", id.site);
        failing_sites.insert(id.site);
      }
    std::vector<std::string> late;
    for (const auto& [id, reg] : registry)
      if (!failing_sites.contains(id.site) && !reg.joining && !reports.contains(id))
        late.push_back(id.str());
    if (!late.empty()) {
      if (!timed_out) return;
      for (const auto& name : late) {
        const std::string site = name.substr(0, name.rfind('/'));
        log::warn("coordinator: {} sent no Recover within {} ms; dropping site {}", name,
                  options.recovery_timeout.count(), site);
        failing_sites.insert(site);
      }
    }
    // Joining sites: restarted ones with every rank registered, and members that offer no
    // rollback point (they lost their state, e.g. in an interrupted transfer). Each gets the
    // state from a peer in the new epoch.
    std::set<std::string> joining;
    {
      std::map<std::string, std::size_t> back;
      for (const auto& [id, reg] : registry)
        if (reg.joining && reg.session && !failing_sites.contains(id.site)) ++back[id.site];
      for (const auto& [site, n] : back)
        if (n == options.ranks_per_site) joining.insert(site);
      for (const auto& [id, rep] : reports)
        if (rep.snapshots.empty() && !failing_sites.contains(id.site)) joining.insert(id.site);
    }
    Membership m;
    m.epoch = membership->epoch + 1;
    {
      std::vector<std::string> order = options.site_names;
      for (const auto& site : membership->sites)
        if (std::find(order.begin(), order.end(), site) == order.end()) order.push_back(site);
      const auto& live = membership->sites;
      for (const auto& site : order)
        if (!failing_sites.contains(site) &&
            (joining.contains(site) || std::find(live.begin(), live.end(), site) != live.end()))
          m.sites.push_back(site);
    }
    // The newest step every survivor can roll back to.
    std::optional<std::set<std::int64_t>> common;
    for (const auto& [id, rep] : reports) {
      if (failing_sites.contains(id.site) || joining.contains(id.site)) continue;
      std::set<std::int64_t> mine(rep.snapshots.begin(), rep.snapshots.end());
      if (!common) {
        common = std::move(mine);
      } else {
        std::set<std::int64_t> both;
        std::set_intersection(common->begin(), common->end(), mine.begin(), mine.end(),
                              std::inserter(both, both.end()));
        common = std::move(both);
      }
    }
    const double took = seconds_between(recovery_start, Clock::now());
    std::vector<std::string> dropped(failing_sites.begin(), failing_sites.end());
    m.note = recovery_reason;
    if (!dropped.empty()) m.note += fmt::format("; dropped site(s) [{}]", fmt::join(dropped, ", "));
    if (!joining.empty()) m.note += fmt::format("; joining [{}]", fmt::join(joining, ", "));
    if (m.sites.size() < std::max<std::size_t>(options.min_sites, 1)) {
      m.note += fmt::format("; only {} site(s) remain, below the job's minimum of {}: the job ends",
                            m.sites.size(), std::max<std::size_t>(options.min_sites, 1));
      m.sites.clear();
    } else if (!common || common->empty()) {
      m.note += "; the survivors share no rollback step: the job ends";
      m.sites.clear();
    } else {
      m.resume_step = *common->rbegin();
    }
    for (const auto& [id, reg] : registry) {
      if (reg.session) recipients.push_back(reg.session);
      if (m.sites.empty() || failing_sites.contains(id.site)) continue;
      if (reg.joining && !joining.contains(id.site)) continue;  // not all its ranks are back
      const auto report = reports.find(id);
      m.members.push_back(
          {id.site, id.rank,
           report != reports.end() ? report->second.worker_address : reg.worker_address});
    }
    if (!m.sites.empty())
      for (const auto& site : m.sites)
        if (joining.contains(site)) m.joining.push_back(site);
    for (std::uint32_t i = 0; i < m.sites.size(); ++i) m.ring_order.push_back(i);
    for (const auto& site : failing_sites)
      departed_sites[site] = fmt::format("dropped at epoch {}: {}", m.epoch, recovery_reason);
    std::erase_if(registry, [&](const auto& kv) { return failing_sites.contains(kv.first.site); });
    for (auto& [id, reg] : registry) {
      if (const auto it = reports.find(id); it != reports.end())
        reg.worker_address = it->second.worker_address;
      if (reg.joining && joining.contains(id.site) && !m.sites.empty()) {
        reg.joining = false;
        departed_sites.erase(id.site);
      }
    }
    if (m.sites.empty())
      log::error("coordinator: recovery of epoch {} failed after {:.2f} s: {}", membership->epoch,
                 took, m.note);
    else
      log::warn(
          "coordinator: opening membership epoch {} with {} site(s) [{}], resuming from step "
          "{} ({:.2f} s after the failure): {}",
          m.epoch, m.sites.size(), fmt::join(m.sites, ", "), m.resume_step, took, m.note);
    frame = encode(m);
    membership = std::move(m);
    recovering = false;
    reports.clear();
    failing_sites.clear();
  }
  for (const auto& r : recipients) r->send(frame);
}

void Coordinator::Impl::broadcast_lost() {
  std::vector<std::shared_ptr<Session>> recipients;
  Status st;
  {
    std::lock_guard lock(mu);
    if (!membership) return;
    st.expected = static_cast<std::uint32_t>(world());
    for (const auto& [id, reg] : registry) {
      if (reg.finished) continue;
      if (!reg.session)
        st.missing.push_back(id.str() + " (disconnected)");
      else if (reg.reported_missing)
        st.missing.push_back(id.str() + " (silent)");
      else
        recipients.push_back(reg.session);
    }
    st.registered = static_cast<std::uint32_t>(recipients.size());
    if (st.missing.empty()) return;
  }
  const auto frame = encode(st);
  for (const auto& r : recipients) r->send(frame);
}

std::vector<std::string> Coordinator::Impl::unregistered_locked() const {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& [k, v] : registry) seen.insert(k.site);
  std::vector<std::string> known(seen.begin(), seen.end());
  for (const auto& s : options.site_names)
    if (!seen.contains(s)) known.push_back(s);
  for (const auto& site : known)
    for (std::uint32_t r = 0; r < options.ranks_per_site; ++r)
      if (!registry.contains(RankId{site, r})) out.push_back(RankId{site, r}.str());
  if (known.size() < options.num_sites)
    out.push_back(fmt::format("{} more site(s) x {} rank(s) not yet seen",
                              options.num_sites - known.size(), options.ranks_per_site));
  return out;
}

Status Coordinator::Impl::status_locked() const {
  Status st;
  st.registered = static_cast<std::uint32_t>(registry.size());
  st.expected = static_cast<std::uint32_t>(world());
  st.missing = unregistered_locked();
  if (st.missing.size() > kMaxListedMissing) {
    const auto more = st.missing.size() - kMaxListedMissing;
    st.missing.resize(kMaxListedMissing);
    st.missing.push_back(fmt::format("... and {} more", more));
  }
  return st;
}

void Coordinator::Impl::schedule_check() {
  const auto period = std::clamp(options.heartbeat_timeout / 4, milliseconds{5}, milliseconds{500});
  check_timer.expires_after(period);
  check_timer.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    std::vector<std::shared_ptr<Session>> waiting;
    std::vector<std::uint8_t> status_frame;
    bool newly_silent = false;
    {
      std::lock_guard lock(mu);
      const auto now = Clock::now();
      for (auto& [id, reg] : registry) {
        if (reg.reported_missing || reg.finished ||
            now - reg.last_seen <= options.heartbeat_timeout)
          continue;
        reg.reported_missing = true;
        newly_silent = true;
        log::warn("coordinator: {} ({}) silent for {:.1f} s (timeout {} ms); listing it missing",
                  id.str(), reg.peer, seconds_between(reg.last_seen, now),
                  options.heartbeat_timeout.count());
      }
      // While the world fills up, tell waiting ranks who is still absent, so their timeout
      // errors can name them. Only on change, to keep this O(ranks) per tick.
      if (!membership && registry.size() != status_sent_for) {
        status_sent_for = registry.size();
        status_frame = encode(status_locked());
        for (const auto& [id, reg] : registry)
          if (reg.session) waiting.push_back(reg.session);
      }
    }
    for (const auto& s : waiting) s->send(status_frame);
    if (newly_silent) {
      broadcast_lost();
      std::vector<RankId> silent;
      {
        std::lock_guard lock(mu);
        for (const auto& [id, reg] : registry)
          if (reg.reported_missing && !reg.finished) silent.push_back(id);
      }
      for (const auto& id : silent)
        begin_recovery(fmt::format("{} silent for more than {} ms", id.str(),
                                   options.heartbeat_timeout.count()),
                       id.site);
    }
    rebuild_membership_if_quiet();
    bool overdue = false;
    {
      std::lock_guard lock(mu);
      overdue = recovering && Clock::now() - recovery_start > options.recovery_timeout;
    }
    try_finish_recovery(overdue);
    schedule_check();
  });
}

void Coordinator::Impl::run() {
  try {
    io.run();
  } catch (...) {
    // Per-connection failures are handled in the sessions; reaching here is a coordinator
    // bug or resource exhaustion. Keep it for stop()/rethrow_if_failed() on the owner thread.
    std::lock_guard lock(mu);
    error = std::current_exception();
    log::error("coordinator: its event loop failed and stopped; the owner will rethrow");
  }
}

Coordinator::Coordinator(CoordinatorOptions options) {
  if (options.num_sites == 0 || options.ranks_per_site == 0)
    throw ConfigError(fmt::format("coordinator: world of {} sites x {} ranks is empty",
                                  options.num_sites, options.ranks_per_site));
  if (!options.site_names.empty() && options.site_names.size() != options.num_sites)
    throw ConfigError(fmt::format("coordinator: {} site names given for {} sites",
                                  options.site_names.size(), options.num_sites));
  if (!options.token)
    throw ConfigError(
        "coordinator: no job token configured; set `token` or a token file so no "
        "unauthenticated peer can join");
  impl_ = std::make_shared<Impl>(std::move(options));
  if (impl_->options.tls.enabled) impl_->tls_context = make_server_tls_context(impl_->options.tls);
}

Coordinator::~Coordinator() {
  try {
    stop();
  } catch (const std::exception& e) {
    log::error("coordinator: error at shutdown: {}", e.what());
  }
}

std::uint16_t Coordinator::start(std::uint16_t port) {
  auto& im = *impl_;
  if (im.thread.joinable()) throw ConfigError("coordinator: start() called twice");
  try {
    const tcp::endpoint ep(asio::ip::make_address(im.options.bind_address), port);
    im.acceptor.open(ep.protocol());
    im.acceptor.set_option(tcp::acceptor::reuse_address(true));
    im.acceptor.bind(ep);
    im.acceptor.listen();
    im.bound_port = im.acceptor.local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    throw TransportError(
        fmt::format("coordinator: cannot listen on {}:{}: {}; choose a free port "
                    "or another bind address",
                    im.options.bind_address, port, e.code().message()));
  }
  im.do_accept();
  im.schedule_check();
  im.thread = std::thread([&im] { im.run(); });
  log::info("coordinator: listening on {}:{}{} for {} sites x {} ranks", im.options.bind_address,
            im.bound_port.load(), im.options.tls.enabled ? " (TLS)" : "", im.options.num_sites,
            im.options.ranks_per_site);
  return im.bound_port;
}

void Coordinator::stop() {
  auto& im = *impl_;
  if (im.thread.joinable()) {
    im.io.stop();
    im.thread.join();
    // The loop is stopped, so touching sockets from this thread is safe. Closing them now
    // (rather than when the io_context dies) lets clients see EOF right away.
    boost::system::error_code ignored;
    im.acceptor.close(ignored);
    for (auto& w : im.sessions)
      if (auto s = w.lock()) s->socket().close(ignored);
    std::lock_guard lock(im.mu);
    for (auto& [id, reg] : im.registry) reg.session.reset();
  }
  rethrow_if_failed();
}

void Coordinator::rethrow_if_failed() {
  std::exception_ptr e;
  {
    std::lock_guard lock(impl_->mu);
    std::swap(e, impl_->error);
  }
  if (e) std::rethrow_exception(e);
}

std::uint16_t Coordinator::port() const { return impl_->bound_port; }

std::size_t Coordinator::registered() const {
  std::lock_guard lock(impl_->mu);
  return impl_->registry.size();
}

std::optional<Membership> Coordinator::membership() const {
  std::lock_guard lock(impl_->mu);
  return impl_->membership;
}

std::vector<RankProgress> Coordinator::progress() const {
  std::lock_guard lock(impl_->mu);
  std::vector<RankProgress> out;
  const auto now = Clock::now();
  for (const auto& [id, reg] : impl_->registry)
    out.push_back({id, reg.step, reg.session != nullptr,
                   std::chrono::duration_cast<std::chrono::milliseconds>(now - reg.last_seen)});
  return out;
}

std::vector<RankId> Coordinator::missing() const {
  std::lock_guard lock(impl_->mu);
  std::vector<RankId> out;
  const auto now = Clock::now();
  for (const auto& [id, reg] : impl_->registry)
    if (now - reg.last_seen > impl_->options.heartbeat_timeout) out.push_back(id);
  return out;
}

std::vector<std::string> Coordinator::departed() const {
  std::lock_guard lock(impl_->mu);
  std::vector<std::string> out;
  for (const auto& [site, why] : impl_->departed_sites) out.push_back(site + " (" + why + ")");
  return out;
}

std::vector<std::string> Coordinator::unregistered() const {
  std::lock_guard lock(impl_->mu);
  return impl_->unregistered_locked();
}

// ============================================================================ RankClient

struct RankClient::Impl {
  class Connection;
  enum class Phase {
    kIdle,
    kConnecting,
    kTlsHandshake,
    kAwaitChallenge,
    kAwaitWelcome,
    kRegistered,
    kMember
  };

  explicit Impl(RankClientOptions o) : options(std::move(o)) {}

  RankClientOptions options;
  std::unique_ptr<ssl::context> tls_context;  // set when options.tls.enabled; outlives conn
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  tcp::resolver resolver{io};
  asio::steady_timer retry_timer{io};
  asio::steady_timer heartbeat_timer{io};
  // Why the coordinator's certificate failed verification, from the verify callback.
  std::shared_ptr<std::string> tls_failure = std::make_shared<std::string>();
  std::shared_ptr<Connection> conn;
  std::thread thread;
  std::string target;  // "HOST:PORT" for messages
  std::string host;
  std::uint16_t port = 0;
  Clock::time_point connect_deadline;
  std::string last_connect_error;
  std::atomic<std::uint64_t> step{0};
  std::atomic<bool> paused{false};
  std::atomic<bool> closing{false};   // set by close(), read by handlers
  std::atomic<bool> recovery{false};  // a Recovery arrived and no newer membership yet
  // io-thread only: the coordinator went away after the membership and we are reconnecting.
  bool reconnecting = false;
  Clock::time_point lost_at;

  bool can_reconnect() {
    std::lock_guard lock(mu);
    return options.coordinator_timeout.count() > 0 && membership.has_value() && !error &&
           (phase == Phase::kMember || reconnecting);
  }
  void begin_reconnect(const std::string& reason);

  std::mutex mu;
  std::condition_variable cv;
  Phase phase = Phase::kIdle;
  std::optional<Membership> membership;
  std::optional<Status> status;
  std::exception_ptr error;

  std::string who() const { return RankId{options.site, options.rank}.str(); }
  void fail(std::exception_ptr e) {
    {
      std::lock_guard lock(mu);
      if (!error) error = std::move(e);
    }
    cv.notify_all();
  }
  void set_phase(Phase p) {
    {
      std::lock_guard lock(mu);
      phase = p;
    }
    cv.notify_all();
  }
  void attempt_connect();
  void start_tls();  // after the TCP connect: handshake, verify the coordinator, then frames
  void schedule_heartbeat();
  void on_frame(Frame frame);
};

class RankClient::Impl::Connection : public FramedPeer {
 public:
  Connection(tcp::socket socket, Impl& client)
      : FramedPeer(std::move(socket), client.tls_context.get(), "coordinator " + client.target,
                   client.options.max_frame_payload),
        client_(client) {}

 private:
  void on_frame(Frame frame) override { client_.on_frame(std::move(frame)); }
  void on_protocol_error(const std::string& what) override {
    client_.fail(std::make_exception_ptr(PeerFailure(fmt::format(
        "{}: bad frame from the coordinator {}: {}", client_.who(), client_.target, what))));
    abort("");
  }
  void on_closed(const std::string& reason) override {
    client_.heartbeat_timer.cancel();
    if (client_.closing || reason.empty()) return;
    if (client_.can_reconnect()) return client_.begin_reconnect(reason);
    client_.fail(std::make_exception_ptr(
        PeerFailure(fmt::format("{}: the coordinator {} closed the connection ({}); check its log",
                                client_.who(), client_.target, reason))));
  }
  Impl& client_;
};

void RankClient::Impl::begin_reconnect(const std::string& reason) {
  if (!reconnecting) {
    reconnecting = true;
    lost_at = Clock::now();
    connect_deadline = lost_at + options.coordinator_timeout;
    log::warn("{}: lost the coordinator {} ({}); training goes on, reconnecting for up to {:.0f} s",
              who(), target, reason,
              std::chrono::duration<double>(options.coordinator_timeout).count());
  }
  conn = std::make_shared<Connection>(tcp::socket(io), *this);
  retry_timer.expires_after(milliseconds{200});
  retry_timer.async_wait([this](const boost::system::error_code& e) {
    if (!e && !closing) attempt_connect();
  });
}

void RankClient::Impl::attempt_connect() {
  resolver.async_resolve(
      host, std::to_string(port),
      [this](const boost::system::error_code& ec, tcp::resolver::results_type results) {
        if (closing) return;
        if (ec) {
          fail(std::make_exception_ptr(TransportError(fmt::format(
              "{}: cannot resolve the coordinator address {}: {}", who(), target, ec.message()))));
          return;
        }
        asio::async_connect(
            conn->socket(), results,
            [this](const boost::system::error_code& ec2, const tcp::endpoint&) {
              if (closing) return;
              if (ec2) {
                // The coordinator may simply not be up yet: retry until the
                // deadline.
                last_connect_error = ec2.message();
                if (Clock::now() + milliseconds{100} >= connect_deadline) {
                  if (reconnecting)
                    fail(std::make_exception_ptr(PeerFailure(fmt::format(
                        "{}: the coordinator {} stayed unreachable for {} ms "
                        "(job.coordinator_timeout_s; last error: {})",
                        who(), target, options.coordinator_timeout.count(), last_connect_error))));
                  return;
                }
                retry_timer.expires_after(milliseconds{100});
                retry_timer.async_wait([this](const boost::system::error_code& e) {
                  if (!e && !closing) attempt_connect();
                });
                return;
              }
              if (conn->stream().tls()) return start_tls();
              set_phase(Phase::kAwaitChallenge);
              conn->start_reading();
            });
      });
}

void RankClient::Impl::start_tls() {
  set_phase(Phase::kTlsHandshake);
  auto& stream = conn->stream().tls_stream();
  verify_server(stream, options.tls.server_name.empty() ? host : options.tls.server_name,
                tls_failure);
  stream.async_handshake(ssl::stream_base::client, [this](const boost::system::error_code& ec) {
    if (closing) return;
    if (!ec) {
      set_phase(Phase::kAwaitChallenge);
      conn->start_reading();
      return;
    }
    const auto what = fmt::format("{}: TLS handshake with the coordinator {} failed: {}", who(),
                                  target, describe_tls_error(ec));
    // A certificate we do not trust is a setting to fix (or someone else answering);
    // anything else is the peer, e.g. a coordinator without TLS.
    if (!tls_failure->empty())
      fail(std::make_exception_ptr(ConfigError(
          fmt::format("{}: {}; check that [job] tls_ca holds the CA that signed the "
                      "coordinator's certificate and that the certificate names the host the "
                      "ranks connect to",
                      what, *tls_failure))));
    else
      fail(std::make_exception_ptr(PeerFailure(
          what + "; check that the coordinator runs with [job] tls = true and is reachable")));
    conn->abort("");
  });
}

void RankClient::Impl::on_frame(Frame frame) {
  Phase p;
  {
    std::lock_guard lock(mu);
    p = phase;
  }
  switch (frame.type) {
    case MessageType::kChallenge: {
      if (p != Phase::kAwaitChallenge) throw DataError("unexpected Challenge");
      const auto ch = decode<Challenge>(frame);
      AuthResponse resp;
      if (options.token) {
        const auto mac = options.token->respond(ch.nonce);
        resp.mac.assign(mac.begin(), mac.end());
      }
      conn->send(encode(resp));
      std::uint64_t epoch = 0;
      {
        std::lock_guard lock(mu);
        if (reconnecting && membership) epoch = membership->epoch;
      }
      conn->send(encode(Hello{options.protocol_version, options.site, options.rank,
                              options.worker_address, options.config_hash, epoch}));
      set_phase(Phase::kAwaitWelcome);
      return;
    }
    case MessageType::kWelcome:
      if (p != Phase::kAwaitWelcome) throw DataError("unexpected Welcome");
      decode<Welcome>(frame);
      if (reconnecting) {
        reconnecting = false;
        log::warn("{}: reconnected to the coordinator {} after {:.1f} s", who(), target,
                  seconds_between(lost_at, Clock::now()));
        set_phase(Phase::kMember);
      } else {
        set_phase(Phase::kRegistered);
      }
      schedule_heartbeat();
      return;
    case MessageType::kReject: {
      const auto r = decode<Reject>(frame);
      const auto msg = fmt::format("{}: the coordinator {} refused this rank ({}): {}", who(),
                                   target, reject_code_name(r.code), r.reason);
      // A config the user can fix is a ConfigError; a broken or stalled exchange is the peer.
      if (r.code == RejectCode::kProtocol || r.code == RejectCode::kHandshakeTimeout)
        fail(std::make_exception_ptr(PeerFailure(msg)));
      else
        fail(std::make_exception_ptr(ConfigError(msg)));
      conn->abort("");
      return;
    }
    case MessageType::kStatus: {
      auto st = decode<Status>(frame);
      std::lock_guard lock(mu);
      status = std::move(st);
      return;
    }
    case MessageType::kRecovery: {
      const auto r = decode<Recovery>(frame);
      log::warn("{}: the coordinator closed membership epoch {}: {}", who(), r.epoch, r.reason);
      recovery = true;
      cv.notify_all();
      return;
    }
    case MessageType::kMembership: {
      if (p != Phase::kRegistered && p != Phase::kMember)
        throw DataError("Membership before registration");
      auto m = decode<Membership>(frame);
      {
        std::lock_guard lock(mu);
        if (membership && m.epoch <= membership->epoch)
          throw DataError(
              fmt::format("membership epoch {} after epoch {}", m.epoch, membership->epoch));
        recovery = false;
        membership = std::move(m);
        status.reset();  // from now on a Status lists lost peers, not unregistered ones
        phase = Phase::kMember;
      }
      cv.notify_all();
      return;
    }
    default:
      throw DataError(
          fmt::format("unexpected {} frame from the coordinator", message_type_name(frame.type)));
  }
}

void RankClient::Impl::schedule_heartbeat() {
  heartbeat_timer.expires_after(options.heartbeat_interval);
  heartbeat_timer.async_wait([this](const boost::system::error_code& ec) {
    if (ec || closing || conn->closed()) return;
    if (!paused) {
      std::uint64_t epoch = 0;
      {
        std::lock_guard lock(mu);
        if (membership) epoch = membership->epoch;
      }
      conn->send(encode(Heartbeat{epoch, step.load()}));
    }
    schedule_heartbeat();
  });
}

RankClient::RankClient(RankClientOptions options)
    : impl_(std::make_shared<Impl>(std::move(options))) {
  if (impl_->options.tls.enabled)
    impl_->tls_context = make_client_tls_context(impl_->options.tls, impl_->who());
}

RankClient::~RankClient() { close(); }

void RankClient::connect(const std::string& host, std::uint16_t port, Clock::time_point deadline) {
  auto& im = *impl_;
  if (im.thread.joinable()) throw ConfigError(im.who() + ": connect() called twice");
  const auto start = Clock::now();
  im.host = host;
  im.port = port;
  im.target = host + ":" + std::to_string(port);
  im.connect_deadline = deadline;
  im.conn = std::make_shared<Impl::Connection>(tcp::socket(im.io), im);
  im.phase = Impl::Phase::kConnecting;
  asio::post(im.io, [&im] { im.attempt_connect(); });
  im.thread = std::thread([&im] {
    try {
      im.io.run();
    } catch (...) {
      // A handler outside the connection's own error path failed: stop and report it.
      im.fail(std::current_exception());
    }
  });

  std::unique_lock lock(im.mu);
  const bool done = im.cv.wait_until(
      lock, deadline, [&] { return im.error || im.phase >= Impl::Phase::kRegistered; });
  if (im.error) {
    auto e = im.error;
    lock.unlock();
    close();
    std::rethrow_exception(e);
  }
  if (!done) {
    const char* stage = "connecting to";
    if (im.phase == Impl::Phase::kTlsHandshake) stage = "in the TLS handshake with";
    if (im.phase == Impl::Phase::kAwaitChallenge) stage = "waiting for the challenge from";
    if (im.phase == Impl::Phase::kAwaitWelcome) stage = "waiting to be welcomed by";
    lock.unlock();
    close();
    throw TimeoutError(fmt::format(
        "{}: timed out after {:.1f} s {} the coordinator {}{}; check that it is running and "
        "reachable",
        im.who(), seconds_between(start, Clock::now()), stage, im.target,
        im.last_connect_error.empty() ? "" : " (last error: " + im.last_connect_error + ")"));
  }
}

Membership RankClient::wait_membership(Clock::time_point deadline) {
  auto& im = *impl_;
  const auto start = Clock::now();
  std::unique_lock lock(im.mu);
  if (im.phase < Impl::Phase::kRegistered && !im.error)
    throw ConfigError(im.who() + ": wait_membership() before a successful connect()");
  im.cv.wait_until(lock, deadline, [&] { return im.membership || im.error; });
  if (im.membership) return *im.membership;
  if (im.error) std::rethrow_exception(im.error);
  std::string detail = "; the coordinator has not reported who is missing";
  if (im.status)
    detail = fmt::format("; it last reported {} of {} ranks registered, still missing: {}",
                         im.status->registered, im.status->expected,
                         fmt::join(im.status->missing, ", "));
  throw TimeoutError(
      fmt::format("{}: timed out after {:.1f} s waiting for the membership from "
                  "the coordinator {}{}",
                  im.who(), seconds_between(start, Clock::now()), im.target, detail));
}

void RankClient::set_step(std::uint64_t step) { impl_->step = step; }

std::vector<std::string> RankClient::lost_peers() const {
  std::lock_guard lock(impl_->mu);
  if (!impl_->membership || !impl_->status) return {};
  return impl_->status->missing;
}

void RankClient::pause_heartbeats(bool paused) { impl_->paused = paused; }

bool RankClient::recovery_pending() const { return impl_->recovery.load(); }

Membership RankClient::recover(const Recover& report, Clock::time_point deadline) {
  auto& im = *impl_;
  const auto start = Clock::now();
  auto frame = encode(report);
  asio::post(im.io, [&im, frame = std::move(frame), address = report.worker_address]() mutable {
    im.options.worker_address = std::move(address);  // what a reconnect registers with
    if (im.conn && !im.conn->closed()) im.conn->send(std::move(frame));
  });
  std::unique_lock lock(im.mu);
  im.cv.wait_until(lock, deadline, [&] {
    return im.error || (im.membership && im.membership->epoch > report.epoch);
  });
  if (im.membership && im.membership->epoch > report.epoch) return *im.membership;
  if (im.error) std::rethrow_exception(im.error);
  throw TimeoutError(fmt::format(
      "{}: timed out after {:.1f} s waiting for the coordinator {} to open the epoch after {}",
      im.who(), seconds_between(start, Clock::now()), im.target, report.epoch));
}

void RankClient::finish() {
  auto& im = *impl_;
  if (!im.thread.joinable()) return;
  std::uint64_t epoch = 0;
  {
    std::lock_guard lock(im.mu);
    if (im.membership) epoch = im.membership->epoch;
  }
  auto frame = encode(Bye{epoch, im.step.load()});
  auto flushed = std::make_shared<std::promise<void>>();
  auto done = flushed->get_future();
  asio::post(im.io, [&im, frame = std::move(frame), flushed]() mutable {
    if (im.conn && !im.conn->closed()) {
      im.conn->send(std::move(frame));
      im.conn->finish();
    }
    flushed->set_value();
  });
  done.wait_for(std::chrono::seconds(2));
  // The coordinator closes its side once it read the Bye and our half-close; wait for that
  // (bounded), so the Bye is never lost to a reset.
  const auto until = Clock::now() + std::chrono::milliseconds(1500);
  while (Clock::now() < until) {
    auto answer = std::make_shared<std::promise<bool>>();
    auto closed = answer->get_future();
    asio::post(im.io,
               [&im, answer] { answer->set_value(im.conn == nullptr || im.conn->closed()); });
    if (closed.wait_for(std::chrono::milliseconds(200)) != std::future_status::ready ||
        closed.get())
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  close();
}

void RankClient::close() {
  auto& im = *impl_;
  if (!im.thread.joinable()) return;
  im.closing = true;  // read by handlers only after io.stop() below has them finished
  im.io.stop();
  im.thread.join();
  // The loop is stopped, so these are safe here; the coordinator sees EOF at once.
  boost::system::error_code ignored;
  if (im.conn) im.conn->socket().close(ignored);
}

}  // namespace desloc::transport
