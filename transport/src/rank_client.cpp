// RankClient over Boost.Asio: one rank's connection to the coordinator. Its own io_context
// thread reads frames and sends heartbeats; errors there are stored and rethrown to the owner.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <utility>  // before Asio: Boost 1.74 awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>

#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"
#include "desloc/transport/control_plane.hpp"
#include "desloc/transport/tcp_backlog.hpp"
#include "framed_peer.hpp"

namespace desloc::transport {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using std::chrono::milliseconds;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

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
  RankReport report;  // guarded by mu
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
  Clock::time_point registered_at;  // the first Welcome
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
  // Why the coordinator's closing the connection ends this rank.
  std::string closed_message(const std::string& reason);
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
    client_.fail(std::make_exception_ptr(PeerFailure(client_.closed_message(reason))));
  }
  Impl& client_;
};

std::string RankClient::Impl::closed_message(const std::string& reason) {
  std::lock_guard lock(mu);
  if (phase != Phase::kRegistered || membership)
    return fmt::format("{}: the coordinator {} closed the connection ({}); check its log", who(),
                       target, reason);
  // Registered and waiting for the others: the coordinator gave up on the rendezvous (or died).
  const std::string who_else =
      status ? fmt::format("it last reported {} of {} ranks registered; never registered: {}",
                           status->registered, status->expected, fmt::join(status->missing, ", "))
             : std::string("it had not reported who was missing");
  return fmt::format(
      "{}: the coordinator {} closed the connection ({}) after this rank waited {:.1f} s for the "
      "membership; {}. The coordinator ends a rendezvous that is not complete within "
      "job.rendezvous_timeout_s: start the missing ranks within it, with the same config and "
      "coordinator address",
      who(), target, reason, seconds_between(registered_at, Clock::now()), who_else);
}

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
                              options.worker_address, options.config_hash, epoch, options.config}));
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
        {
          std::lock_guard lock(mu);
          registered_at = Clock::now();
        }
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
      Heartbeat hb;
      {
        std::lock_guard lock(mu);
        if (membership) hb.epoch = membership->epoch;
        hb.report = report;
      }
      hb.step = step.load();
      const TcpBacklog backlog = tcp_backlog();
      hb.report.tcp_backlog_ms = wire_ms(backlog.drain);
      hb.report.tcp_backlog_peer = backlog.drain_peer;
      conn->send(encode(hb));
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

void RankClient::set_report(const RankReport& report) {
  std::lock_guard lock(impl_->mu);
  impl_->report = report;
}

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
