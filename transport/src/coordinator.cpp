// The Coordinator over Boost.Asio: it accepts connections, turns what they say into membership
// events for its Roster (membership.hpp) and carries out the decisions (sends the frames). One
// io_context on one thread; the roster sits behind a mutex for the query functions.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <utility>  // before Asio: Boost 1.74 awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>

#include "accept_backoff.hpp"
#include "coordinator_session.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"
#include "desloc/transport/control_plane.hpp"
#include "desloc/transport/job_history.hpp"
#include "desloc/transport/membership.hpp"

namespace desloc::transport {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using std::chrono::milliseconds;

}  // namespace

struct Coordinator::Impl final : SessionOwner {
  explicit Impl(CoordinatorOptions o)
      : options(std::move(o)), roster(MembershipRules::of(options)) {
    history.set_regions(options.regions);
  }

  CoordinatorOptions options;
  // Set when options.tls.enabled. Before io: every stream (held by io's handlers) must go first.
  std::unique_ptr<ssl::context> tls_context;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer check_timer{io};
  asio::steady_timer accept_timer{io};  // the pause after a failed accept
  AcceptBackoff accept_backoff{"coordinator"};
  std::thread thread;
  std::atomic<std::uint16_t> bound_port{0};

  mutable std::mutex mu;  // guards the roster, history and error against the query functions
  Roster roster;
  JobHistory history;
  const Clock::time_point started = Clock::now();
  std::exception_ptr error;

  // io-thread only
  std::vector<std::weak_ptr<CoordinatorSession>> sessions;       // every connection, for stop()
  std::map<RankId, std::shared_ptr<CoordinatorSession>> routes;  // a registered rank's session
  std::uint64_t connections = 0;                                 // numbers the connections from 1

  void do_accept();
  void schedule_check();
  void run();
  // Feeds one event to the roster and carries out its decision.
  MembershipDecision apply(const MembershipEvent& event);
  // Under mu, after the roster took `event`: what the history keeps of it.
  void observe(const MembershipEvent& event);
  void carry_out(const MembershipDecision& decision);

  std::optional<Reject> admit(const std::shared_ptr<CoordinatorSession>& session,
                              const Hello& hello) override;
  void rank_frame(const CoordinatorSession& session, const Frame& frame) override;
  void rank_closed(const CoordinatorSession& session, const std::string& reason) override;
};

MembershipDecision Coordinator::Impl::apply(const MembershipEvent& event) {
  MembershipDecision d;
  {
    std::lock_guard lock(mu);
    d = roster.on(event);
    observe(event);
  }
  if (!d.reject) carry_out(d);
  return d;
}

void Coordinator::Impl::observe(const MembershipEvent& event) {
  const MembershipState& s = roster.state();
  if (s.membership)
    history.membership(*s.membership,
                       std::chrono::duration<double>(Clock::now() - started).count());
  if (const auto* hb = std::get_if<HeartbeatEvent>(&event)) {
    const auto it = s.ranks.find(hb->id);
    if (it != s.ranks.end() && it->second.connection == hb->connection && !it->second.joining)
      history.heartbeat(hb->id.site, hb->id.rank, hb->step, hb->report);
  }
}

void Coordinator::Impl::carry_out(const MembershipDecision& d) {
  for (const LogLine& line : d.log)
    if (log::level() <= line.level) log::write(line.level, "coordinator: " + line.text);
  for (const Outgoing& out : d.sends) {
    const auto frame = std::visit([](const auto& m) { return encode(m); }, out.message);
    for (const RankId& id : out.to)
      if (const auto it = routes.find(id); it != routes.end()) it->second->send(frame);
  }
}

std::optional<Reject> Coordinator::Impl::admit(const std::shared_ptr<CoordinatorSession>& session,
                                               const Hello& h) {
  const RankId id{h.site, h.rank};
  MembershipDecision d;
  {
    std::lock_guard lock(mu);
    const MembershipEvent hello = HelloEvent{id,
                                             h.worker_address,
                                             h.epoch,
                                             session->name(),
                                             session->connection(),
                                             Clock::now(),
                                             endpoint_address(session->socket())};
    d = roster.on(hello);
    observe(hello);
  }
  if (d.reject) return d.reject;
  routes[id] = session;
  carry_out(d);
  return std::nullopt;
}

void Coordinator::Impl::rank_frame(const CoordinatorSession& s, const Frame& frame) {
  const auto now = Clock::now();
  MembershipDecision d;
  switch (frame.type) {
    case MessageType::kHeartbeat: {
      const auto hb = decode<Heartbeat>(frame);
      d = apply(HeartbeatEvent{s.id(), s.connection(), hb.epoch, hb.step, now, hb.report});
      break;
    }
    case MessageType::kRecover:
      d = apply(RecoverEvent{s.id(), s.connection(), decode<Recover>(frame), now});
      break;
    case MessageType::kBye:
      d = apply(ByeEvent{s.id(), s.connection(), decode<Bye>(frame).step, now});
      break;
    default:
      throw DataError(
          fmt::format("unexpected {} frame after registration", message_type_name(frame.type)));
  }
  if (!d.protocol_error.empty()) throw DataError(d.protocol_error);
}

void Coordinator::Impl::rank_closed(const CoordinatorSession& s, const std::string& reason) {
  if (const auto it = routes.find(s.id()); it != routes.end() && it->second.get() == &s)
    routes.erase(it);
  apply(ClosedEvent{s.id(), s.connection(), s.name(), reason, Clock::now()});
}

void Coordinator::Impl::do_accept() {
  acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      accept_timer.expires_after(accept_backoff.failed(ec.message()));
      accept_timer.async_wait([this](const boost::system::error_code& e) {
        if (!e) do_accept();
      });
      return;
    }
    accept_backoff.succeeded();
    auto s = std::make_shared<CoordinatorSession>(std::move(socket), ++connections, options,
                                                  tls_context.get(), *this);
    std::erase_if(sessions, [](const auto& w) { return w.expired(); });
    sessions.push_back(s);
    s->start();
    do_accept();
  });
}

void Coordinator::Impl::schedule_check() {
  const auto period = std::clamp(options.heartbeat_timeout / 4, milliseconds{5}, milliseconds{500});
  check_timer.expires_after(period);
  check_timer.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    apply(TickEvent{Clock::now()});
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

std::size_t CoordinatorOptions::ranks_of(const std::string& site) const {
  return site_rank_count(site_names, site_ranks, ranks_per_site, site);
}

Coordinator::Coordinator(CoordinatorOptions options) {
  if (options.num_sites == 0 || options.ranks_per_site == 0)
    throw ConfigError(fmt::format("coordinator: world of {} sites x {} ranks is empty",
                                  options.num_sites, options.ranks_per_site));
  if (!options.site_names.empty() && options.site_names.size() != options.num_sites)
    throw ConfigError(fmt::format("coordinator: {} site names given for {} sites",
                                  options.site_names.size(), options.num_sites));
  if (!options.site_ranks.empty() && options.site_ranks.size() != options.site_names.size())
    throw ConfigError(fmt::format("coordinator: {} site rank counts given for {} site names",
                                  options.site_ranks.size(), options.site_names.size()));
  for (std::size_t s = 0; s < options.site_ranks.size(); ++s)
    if (options.site_ranks[s] == 0 || options.site_ranks[s] > options.ranks_per_site)
      throw ConfigError(
          fmt::format("coordinator: site {} has {} ranks; each site needs 1..ranks_per_site = {}",
                      options.site_names[s], options.site_ranks[s], options.ranks_per_site));
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

namespace {

// The address to listen on: an IP address, or a name of this machine resolved to one.
tcp::endpoint listen_endpoint(asio::io_context& io, const std::string& host, std::uint16_t port) {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (!ec) return {address, port};
  tcp::resolver resolver(io);
  const auto found = resolver.resolve(host, std::to_string(port),
                                      tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || found.empty())
    throw ConfigError(fmt::format(
        "coordinator: cannot listen on {}:{}: '{}' is not an IP address and could not be "
        "resolved ({}); give an address of this machine, e.g. 0.0.0.0 (every interface) or "
        "127.0.0.1",
        host, port, host, ec ? ec.message() : std::string("no address found")));
  return *found.begin();
}

}  // namespace

std::uint16_t Coordinator::start(std::uint16_t port) {
  auto& im = *impl_;
  if (im.thread.joinable()) throw ConfigError("coordinator: start() called twice");
  const tcp::endpoint ep = listen_endpoint(im.io, im.options.bind_address, port);
  try {
    im.acceptor.open(ep.protocol());
    im.acceptor.set_option(tcp::acceptor::reuse_address(true));
    im.acceptor.bind(ep);
    im.acceptor.listen();
    im.bound_port = im.acceptor.local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    throw TransportError(
        fmt::format("coordinator: cannot listen on {}:{} ({}): {}; choose a free port "
                    "or another bind address",
                    im.options.bind_address, port, ep.address().to_string(), e.code().message()));
  }
  im.do_accept();
  im.schedule_check();
  im.thread = std::thread([&im] { im.run(); });
  log::info("coordinator: listening on {}:{}{} for {} sites x {} ranks", im.options.bind_address,
            im.bound_port.load(), im.options.tls.enabled ? " (TLS)" : "", im.options.num_sites,
            im.options.site_ranks.empty()
                ? fmt::to_string(im.options.ranks_per_site)
                : fmt::format("{}", fmt::join(im.options.site_ranks, "/")));
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
    im.routes.clear();
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
  return impl_->roster.state().ranks.size();
}

std::optional<Membership> Coordinator::membership() const {
  std::lock_guard lock(impl_->mu);
  return impl_->roster.state().membership;
}

std::vector<RankProgress> Coordinator::progress() const {
  std::lock_guard lock(impl_->mu);
  return impl_->roster.progress(Clock::now());
}

JobHistory Coordinator::history() const {
  std::lock_guard lock(impl_->mu);
  return impl_->history;
}

std::vector<RankId> Coordinator::missing() const {
  std::lock_guard lock(impl_->mu);
  return impl_->roster.missing(Clock::now());
}

std::vector<std::string> Coordinator::departed() const {
  std::lock_guard lock(impl_->mu);
  return impl_->roster.departed();
}

Coordinator::Snapshot Coordinator::snapshot() const {
  std::lock_guard lock(impl_->mu);
  const auto now = Clock::now();
  const Roster& roster = impl_->roster;
  return {roster.state().ranks.size(), roster.state().membership,
          roster.progress(now),        impl_->history,
          roster.missing(now),         roster.departed()};
}

std::vector<std::string> Coordinator::unregistered() const {
  std::lock_guard lock(impl_->mu);
  return impl_->roster.unregistered();
}

}  // namespace desloc::transport
