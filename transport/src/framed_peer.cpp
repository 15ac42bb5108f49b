// FramedPeer: framing, the write queue and the graceful close of one control connection.
#include "framed_peer.hpp"

#include <fmt/format.h>

#include <chrono>

#include "desloc/core/error.hpp"

namespace desloc::transport {
namespace {

namespace asio = boost::asio;

// How long a closing side waits for the peer's EOF after its last frame, so that frame is
// read before the kernel would answer unread data with an RST.
constexpr std::chrono::milliseconds kLingerTime{1000};

}  // namespace

std::string endpoint_name(const asio::ip::tcp::socket& s) {
  boost::system::error_code ec;
  const auto ep = s.remote_endpoint(ec);
  if (ec) return "<unknown peer>";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

IpAddress endpoint_address(const asio::ip::tcp::socket& s) {
  boost::system::error_code ec;
  const auto ep = s.remote_endpoint(ec);
  if (ec) return kNoAddress;
  const asio::ip::address a = ep.address();
  return a.is_v4() ? asio::ip::make_address_v6(asio::ip::v4_mapped, a.to_v4()).to_bytes()
                   : a.to_v6().to_bytes();
}

FramedPeer::FramedPeer(tcp::socket socket, ssl::context* tls, std::string name,
                       std::size_t max_payload)
    : stream_(std::move(socket), tls),
      name_(std::move(name)),
      decoder_(name_, max_payload),
      linger_(stream_.socket().get_executor()) {}

void FramedPeer::send(std::vector<std::uint8_t> frame) {
  if (closed_ || finishing_) return;
  queue_.push_back(std::move(frame));
  if (!writing_) do_write();
}

void FramedPeer::finish() {
  if (closed_ || finishing_) return;
  finishing_ = true;
  if (!writing_) shutdown_send();
  linger_.expires_after(kLingerTime);
  linger_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    if (!ec) self->close_with("");
  });
}

void FramedPeer::do_read() {
  stream_.async_read_some(asio::buffer(read_buf_),
                          [self = shared_from_this()](const boost::system::error_code& ec,
                                                      std::size_t n) { self->handle_read(ec, n); });
}

void FramedPeer::handle_read(const boost::system::error_code& ec, std::size_t n) {
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

void FramedPeer::do_write() {
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

void FramedPeer::shutdown_send() {
  boost::system::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

void FramedPeer::close_with(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  linger_.cancel();
  boost::system::error_code ignored;
  stream_.socket().close(ignored);
  queue_.clear();
  on_closed(reason);
}

}  // namespace desloc::transport
