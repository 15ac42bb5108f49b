// The byte stream under one control-plane connection: plain TCP, or TLS over that TCP socket
// (Boost.Asio SSL on OpenSSL). One type, so the framing above it is written once.
#pragma once

#include <memory>
#include <string>
#include <utility>  // before Asio: Boost 1.74 awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include "desloc/transport/control_plane.hpp"

namespace desloc::transport {

namespace ssl = boost::asio::ssl;

// TLS 1.2 or newer. The coordinator presents its certificate chain and asks ranks for none
// (the job token authenticates them). ConfigError names `who`, the file that cannot be loaded
// and its config key.
std::unique_ptr<ssl::context> make_server_tls_context(const TlsOptions& tls);
// Verifies the coordinator's chain against tls.ca_file (or the system's CAs when it is empty).
std::unique_ptr<ssl::context> make_client_tls_context(const TlsOptions& tls,
                                                      const std::string& who);
// "certificate verify failed (SSL routines)" and the like, for logs and errors.
std::string describe_tls_error(const boost::system::error_code& ec);

class ControlStream {
 public:
  using tcp = boost::asio::ip::tcp;
  using TlsStream = ssl::stream<tcp::socket&>;

  // `tls` null: plain TCP. Otherwise the stream is TLS over `socket` once handshake() ran;
  // the context must outlive the stream.
  ControlStream(tcp::socket socket, ssl::context* tls)
      : socket_(std::move(socket)),
        tls_(tls ? std::make_unique<TlsStream>(socket_, *tls) : nullptr) {}
  ControlStream(const ControlStream&) = delete;
  ControlStream& operator=(const ControlStream&) = delete;

  tcp::socket& socket() { return socket_; }  // the TCP socket, under TLS or not
  bool tls() const { return tls_ != nullptr && !plain_; }
  TlsStream& tls_stream() { return *tls_; }

  // After a failed TLS handshake nothing can be sent over TLS any more; what is left is the
  // TCP socket, over which the coordinator still tells a plaintext client why it was refused.
  void fall_back_to_plain() { plain_ = true; }

  template <class Handler>
  void async_read_some(boost::asio::mutable_buffer buffer, Handler&& handler) {
    if (tls())
      tls_->async_read_some(buffer, std::forward<Handler>(handler));
    else
      socket_.async_read_some(buffer, std::forward<Handler>(handler));
  }
  template <class Handler>
  void async_write(boost::asio::const_buffer buffer, Handler&& handler) {
    if (tls())
      boost::asio::async_write(*tls_, buffer, std::forward<Handler>(handler));
    else
      boost::asio::async_write(socket_, buffer, std::forward<Handler>(handler));
  }

 private:
  tcp::socket socket_;  // before tls_, which refers to it
  std::unique_ptr<TlsStream> tls_;
  bool plain_ = false;
};

// Client side, before the handshake: the coordinator's certificate must name `server_name` (a
// DNS name or an IP address), which also goes out as SNI when it is a name. The first
// verification failure is described in *failure, e.g. "self-signed certificate in certificate
// chain (depth 1, /CN=other-ca)".
void verify_server(ControlStream::TlsStream& stream, const std::string& server_name,
                   std::shared_ptr<std::string> failure);

// A clean end of the peer's stream. Over TLS a peer that half-closes TCP sends no
// close_notify; the contexts ignore that (SSL_OP_IGNORE_UNEXPECTED_EOF), since the framing
// already catches a stream cut mid-frame and the Bye says when a rank ended on purpose.
inline bool is_end_of_stream(const boost::system::error_code& ec) {
  return ec == boost::asio::error::eof || ec == ssl::error::stream_truncated;
}

}  // namespace desloc::transport
