// One framed control connection over TCP or TLS: a read loop feeding a FrameDecoder, a write
// queue and a graceful close. The coordinator's sessions and the rank client build on it.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "control_stream.hpp"
#include "desloc/transport/wire.hpp"

namespace desloc::transport {

// "ip:port" of the socket's peer, or "<unknown peer>".
std::string endpoint_name(const boost::asio::ip::tcp::socket& s);
// The socket's peer address (IPv4 mapped), or kNoAddress.
IpAddress endpoint_address(const boost::asio::ip::tcp::socket& s);

// `tls` non-null: TLS over the socket, whose handshake is the subclass's, before start_reading.
// Asio allows one async_write in flight, hence the queue. Subclasses see frames and the close.
// Everything runs on the owning io_context's single thread.
class FramedPeer : public std::enable_shared_from_this<FramedPeer> {
 public:
  using tcp = boost::asio::ip::tcp;

  FramedPeer(tcp::socket socket, ssl::context* tls, std::string name, std::size_t max_payload);
  virtual ~FramedPeer() = default;

  tcp::socket& socket() { return stream_.socket(); }
  ControlStream& stream() { return stream_; }
  std::size_t buffered() const { return decoder_.buffered(); }  // bytes of a partial frame
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  bool closed() const { return closed_; }
  bool finishing() const { return finishing_; }

  void start_reading() { do_read(); }
  void send(std::vector<std::uint8_t> frame);
  // Flush what is queued, half-close, then wait (bounded) for the peer to close its side.
  void finish();
  void abort(const std::string& reason) { close_with(reason); }

 protected:
  virtual void on_frame(Frame frame) = 0;
  virtual void on_protocol_error(const std::string& what) = 0;
  virtual void on_closed(const std::string& reason) = 0;  // exactly once; "" if we closed it

 private:
  static constexpr std::size_t kReadChunkBytes = 4096;

  void do_read();
  void handle_read(const boost::system::error_code& ec, std::size_t n);
  void do_write();
  void shutdown_send();
  void close_with(const std::string& reason);

  ControlStream stream_;
  std::string name_;
  FrameDecoder decoder_;
  boost::asio::steady_timer linger_;
  std::array<std::uint8_t, kReadChunkBytes> read_buf_{};
  std::deque<std::vector<std::uint8_t>> queue_;
  bool writing_ = false;
  bool finishing_ = false;
  bool closed_ = false;
};

}  // namespace desloc::transport
