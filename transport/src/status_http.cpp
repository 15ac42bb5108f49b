// The coordinator's read-only HTTP endpoint (status_http.hpp): a small Boost.Beast server, one
// request per connection, with a deadline on every read and write (the views it serves are in
// status_render.cpp, the dashboard in dashboard.html).
#include "desloc/transport/status_http.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <thread>
#include <utility>  // before Asio: Boost 1.74 awaitable.hpp uses std::exchange unincluded
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/core/detail/base64.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "accept_backoff.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"

namespace desloc::transport {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// The job token from `Authorization: Bearer <token>` or `Basic base64(<any user>:<token>)`.
bool authorized(std::string_view field, const JobToken& token) {
  if (field.starts_with("Bearer ")) return token.matches(field.substr(7));
  if (!field.starts_with("Basic ")) return false;
  const std::string_view encoded = field.substr(6);
  if (encoded.size() > 4096 || encoded.size() % 4 != 0) return false;  // padded, as RFC 7617
  std::string decoded(beast::detail::base64::decoded_size(encoded.size()), '\0');
  const auto [written, read] =
      beast::detail::base64::decode(decoded.data(), encoded.data(), encoded.size());
  // decode() stops at the padding or at the first character outside the alphabet.
  const std::size_t padding = encoded.size() - encoded.find_last_not_of('=') - 1;
  if (padding > 2 || read + padding != encoded.size()) return false;
  decoded.resize(written);
  const auto colon = decoded.find(':');
  return colon != std::string::npos && token.matches(std::string_view(decoded).substr(colon + 1));
}

// The addresses `host` names: an IP address, or a name of this machine (localhost) resolved.
// Empty when it names none.
std::vector<asio::ip::address> bind_addresses(const std::string& host) {
  boost::system::error_code ec;
  const auto a = asio::ip::make_address(host, ec);
  if (!ec) return {a};
  asio::io_context io;
  tcp::resolver resolver(io);
  const auto found = resolver.resolve(host, "0", tcp::resolver::passive, ec);
  std::vector<asio::ip::address> out;
  if (!ec)
    for (const auto& entry : found) out.push_back(entry.endpoint().address());
  return out;
}

// Loopback when every address the name stands for is (localhost: 127.0.0.1 and ::1).
bool is_loopback(const std::string& host) {
  const auto all = bind_addresses(host);
  return !all.empty() && std::all_of(all.begin(), all.end(),
                                     [](const asio::ip::address& a) { return a.is_loopback(); });
}

}  // namespace

struct StatusServer::Impl {
  Impl(const Coordinator& c, StatusServerOptions o) : coordinator(c), options(std::move(o)) {}

  const Coordinator& coordinator;
  StatusServerOptions options;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::thread thread;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  // Requests answered, by path (io thread only): "/", "/metrics", "/api/state", then the rest.
  std::array<std::uint64_t, 4> served{};
  // Connections open now (io thread only; shared with the sessions, which may outlive the
  // loop when stop() destroys their pending handlers).
  std::shared_ptr<std::size_t> open = std::make_shared<std::size_t>(0);
  std::uint64_t turned_away = 0;  // in the current episode of a full endpoint
  asio::steady_timer accept_timer{io};
  AcceptBackoff accept_backoff{"status endpoint"};

  JobStatus status(double uptime) const {
    JobStatus s = read_status(coordinator, options.job, uptime);
    s.http_requests = {
        {"/", served[0]}, {"/metrics", served[1]}, {"/api/state", served[2]}, {"other", served[3]}};
    return s;
  }

  http::response<http::string_body> answer(const http::request<http::string_body>& req) {
    http::response<http::string_body> res{http::status::ok, req.version()};
    res.set(http::field::server, "desloc");
    res.keep_alive(false);
    auto text = [&](http::status status, std::string type, std::string body) {
      res.result(status);
      res.set(http::field::content_type, type);
      res.body() = std::move(body);
    };
    if (options.token) {
      const auto field = req[http::field::authorization];
      if (!authorized(std::string_view(field.data(), field.size()), *options.token)) {
        text(http::status::unauthorized, "text/plain",
             "the job token is required: as a bearer token, or as the password (any user name) "
             "in the browser's prompt\n");
        res.insert(http::field::www_authenticate, "Bearer");
        res.insert(http::field::www_authenticate, "Basic realm=\"desloc job\", charset=\"UTF-8\"");
        return res;
      }
    }
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      text(http::status::method_not_allowed, "text/plain", "read-only: GET or HEAD\n");
      res.set(http::field::allow, "GET, HEAD");
      return res;
    }
    const std::string_view target(req.target().data(), req.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    const double uptime =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    ++served[path == "/" ? 0 : path == "/metrics" ? 1 : path == "/api/state" ? 2 : 3];
    if (path == "/metrics") {
      text(http::status::ok, "text/plain; version=0.0.4; charset=utf-8",
           prometheus_text(status(uptime)));
    } else if (path == "/api/state") {
      text(http::status::ok, "application/json", status_json(status(uptime)));
      res.set(http::field::cache_control, "no-store");
    } else if (path == "/") {
      text(http::status::ok, "text/html; charset=utf-8", std::string(dashboard_html()));
    } else {
      text(http::status::not_found, "text/plain", "not found: /, /metrics, /api/state\n");
    }
    return res;
  }

  struct Session : std::enable_shared_from_this<Session> {
    // `owner` outlives every handler: stop() joins the loop before the Impl goes, and the
    // handlers still pending then are destroyed, never run.
    Session(tcp::socket s, Impl* o) : stream(std::move(s)), owner(o), open(o->open) { ++*open; }
    ~Session() { --*open; }
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
    beast::tcp_stream stream;
    Impl* owner;
    std::shared_ptr<std::size_t> open;
    beast::flat_buffer buffer;
    http::request<http::string_body> request;
    http::response<http::string_body> response;

    void run() {
      stream.expires_after(std::chrono::seconds(10));
      http::async_read(
          stream, buffer, request, [self = shared_from_this()](beast::error_code ec, std::size_t) {
            if (ec) return;  // a client that sent nothing whole: just close
            self->response = self->owner->answer(self->request);
            self->response.prepare_payload();
            self->stream.expires_after(std::chrono::seconds(10));
            http::async_write(self->stream, self->response, [self](beast::error_code, std::size_t) {
              beast::error_code ignored;
              self->stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
            });
          });
    }
  };

  void accept() {
    acceptor.async_accept([self = this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) {
        self->accept_timer.expires_after(self->accept_backoff.failed(ec.message()));
        self->accept_timer.async_wait([self](beast::error_code e) {
          if (!e) self->accept();
        });
        return;
      }
      self->accept_backoff.succeeded();
      self->admit(std::move(socket));
      self->accept();
    });
  }

  // Serves the connection, or turns it away while options.max_connections are open: idle or
  // slow clients then hold at most that many descriptors, and the coordinator keeps the rest
  // for its ranks.
  void admit(tcp::socket socket) {
    if (*open < options.max_connections) {
      if (turned_away > 0)
        log::info("status endpoint: serving again; turned away {} connection(s) while full",
                  turned_away);
      turned_away = 0;
      std::make_shared<Session>(std::move(socket), this)->run();
      return;
    }
    if (turned_away++ == 0)
      log::warn(
          "status endpoint: {} connections open, its limit; turning new ones away with 503 "
          "(logged once until one is served again)",
          *open);
    static constexpr std::string_view kBusy =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
        "Connection: close\r\n\r\n";
    boost::system::error_code ignored;
    socket.non_blocking(true, ignored);  // a fresh socket's buffer takes it; never wait here
    socket.write_some(asio::buffer(kBusy.data(), kBusy.size()), ignored);
    socket.close(ignored);
  }
};

StatusServer::StatusServer(const Coordinator& coordinator, StatusServerOptions options) {
  if (!is_loopback(options.bind) && !options.token)
    throw ConfigError(fmt::format(
        "--http {}:{}: the status endpoint binds to loopback unless the job token protects it; "
        "bind to 127.0.0.1, or configure job.token / job.token_file",
        options.bind, options.port));
  impl_ = std::make_shared<Impl>(coordinator, std::move(options));
  if (is_loopback(impl_->options.bind)) impl_->options.token.reset();
}

StatusServer::~StatusServer() {
  try {
    stop();
  } catch (const std::exception& e) {
    log::error("status endpoint: error at shutdown: {}", e.what());
  }
}

std::uint16_t StatusServer::start() {
  auto& im = *impl_;
  const auto addresses = bind_addresses(im.options.bind);
  if (addresses.empty())
    throw ConfigError(
        fmt::format("--http {}: '{}' is neither an IP address nor a name of this machine",
                    im.options.bind, im.options.bind));
  try {
    const tcp::endpoint ep{addresses.front(), im.options.port};
    im.acceptor.open(ep.protocol());
    im.acceptor.set_option(tcp::acceptor::reuse_address(true));
    im.acceptor.bind(ep);
    im.acceptor.listen();
  } catch (const boost::system::system_error& e) {
    throw TransportError(fmt::format("--http {}:{}: cannot listen: {}; choose a free port",
                                     im.options.bind, im.options.port, e.code().message()));
  }
  const std::uint16_t port = im.acceptor.local_endpoint().port();
  im.accept();
  im.thread = std::thread([&im] {
    try {
      im.io.run();
    } catch (const std::exception& e) {
      log::error("status endpoint: stopped: {}", e.what());
    }
  });
  return port;
}

void StatusServer::stop() {
  auto& im = *impl_;
  if (!im.thread.joinable()) return;
  im.io.stop();
  im.thread.join();
  boost::system::error_code ignored;
  im.acceptor.close(ignored);
}

}  // namespace desloc::transport
