// Framed connection: the read loop (prefix, bounded body, strict decode) and the bounded write queue.
#include "dist/control/framed_connection.h"

#include <stdexcept>

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

namespace deepen::control {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

void check_send_queue_bound(size_t max_send_queue_bytes) {
  if (max_send_queue_bytes < kMaxFrameBytes + 4 + kFrameMacBytes) {
    throw std::invalid_argument("control: a send queue of " + std::to_string(max_send_queue_bytes) +
                                " bytes cannot hold one largest frame (" +
                                std::to_string(kMaxFrameBytes + 4 + kFrameMacBytes) + " bytes)");
  }
}

FramedConnection::FramedConnection(tcp::socket socket, size_t max_send_queue_bytes)
    : socket_(std::move(socket)), max_send_queue_bytes_(max_send_queue_bytes) {
  check_send_queue_bound(max_send_queue_bytes_);
  error_code ec;
  socket_.set_option(tcp::no_delay(true), ec);  // heartbeats and stop frames are small and urgent
  const auto peer = socket_.remote_endpoint(ec);
  remote_ = ec ? "?" : peer.address().to_string() + ":" + std::to_string(peer.port());
}

FramedConnection::~FramedConnection() { close(); }

void FramedConnection::start(OnMessage on_message, OnClose on_close) {
  on_message_ = std::move(on_message);
  on_close_ = std::move(on_close);
  read_prefix();
}

void FramedConnection::allow_full_frames() { max_frame_ = kMaxFrameBytes; }

namespace {

std::array<uint8_t, 8> sequence_bytes(uint64_t n) {
  std::array<uint8_t, 8> b{};
  for (int i = 7; i >= 0; --i, n >>= 8) b[size_t(i)] = uint8_t(n);
  return b;
}

}  // namespace

void FramedConnection::authenticate_frames(const Mac& send_key, const Mac& receive_key) {
  send_mac_.emplace(send_key);
  receive_mac_.emplace(receive_key);
}

void FramedConnection::send(const Message& message) {
  if (closed_) return;
  std::vector<uint8_t> frame = encode_frame(message);
  if (send_mac_) {
    const auto seq = sequence_bytes(sent_++);
    const Digest mac = (*send_mac_)({seq, std::span<const uint8_t>(frame).subspan(4)});
    frame.insert(frame.end(), mac.begin(), mac.end());
    const uint32_t n = uint32_t(frame.size() - 4);
    frame[0] = uint8_t(n >> 24); frame[1] = uint8_t(n >> 16); frame[2] = uint8_t(n >> 8); frame[3] = uint8_t(n);
  }
  if (queued_bytes_ + frame.size() > max_send_queue_bytes_) {
    finish(CloseCause::kSendQueueFull,
           "the peer stopped reading: " + std::to_string(queued_bytes_) + " bytes unsent, and a " +
               message_name(message) + " would pass the send-queue bound of " +
               std::to_string(max_send_queue_bytes_) + " bytes");
    return;
  }
  queued_bytes_ += frame.size();
  queue_.push_back(std::move(frame));
  if (!writing_) write_next();
}

void FramedConnection::close_after_flush() {
  if (closed_) return;
  flushing_ = true;
  if (!writing_) finish(CloseCause::kFlushed, "");
}

void FramedConnection::close() {
  if (closed_) return;
  closed_ = true;
  shut_socket();
}

void FramedConnection::shut_socket() {
  error_code ignore;
  socket_.shutdown(tcp::socket::shutdown_both, ignore);
  socket_.close(ignore);
  // queue_ stays: a cancelled write's handler may still refer to its front until it has run.
}

void FramedConnection::finish(CloseCause cause, const std::string& why) {
  if (closed_) return;
  closed_ = true;  // from here on nothing is queued, read or reported
  const auto keep_alive = shared_from_this();  // the callback may drop the owner's last reference
  const OnClose on_close = std::move(on_close_);
  on_message_ = nullptr;
  // Report first, close after: by the time the peer sees the connection end, the owner has done
  // its bookkeeping (counters, the rank's state), as a peer that waits for the close may check it.
  if (on_close) on_close(cause, why);
  shut_socket();
}

void FramedConnection::write_next() {
  if (queue_.empty()) {
    writing_ = false;
    if (flushing_) finish(CloseCause::kFlushed, "");
    return;
  }
  writing_ = true;
  asio::async_write(socket_, asio::buffer(queue_.front()), [self = shared_from_this()](const error_code& ec, size_t) {
    if (self->closed_) return;
    self->queued_bytes_ -= self->queue_.front().size();
    self->queue_.pop_front();
    if (ec) {
      self->finish(CloseCause::kWriteFailed, "write failed: " + ec.message());
      return;
    }
    self->write_next();
  });
}

void FramedConnection::read_prefix() {
  asio::async_read(socket_, asio::buffer(prefix_), [self = shared_from_this()](const error_code& ec, size_t) {
    if (self->closed_) return;
    if (ec) {
      self->read_failed(ec);
      return;
    }
    uint32_t n = 0;
    try {
      n = read_frame_length(self->prefix_, self->max_frame_ + (self->receive_mac_ ? kFrameMacBytes : 0));
      if (self->receive_mac_ && n <= kFrameMacBytes)
        throw ProtocolError("a frame of " + std::to_string(n) + " bytes cannot hold a body and its MAC");
    } catch (const ProtocolError& e) {
      self->finish(CloseCause::kProtocolError, e.what());
      return;
    }
    self->read_body(n);
  });
}

void FramedConnection::read_body(uint32_t n) {
  body_.resize(n);
  asio::async_read(socket_, asio::buffer(body_), [self = shared_from_this()](const error_code& ec, size_t) {
    if (self->closed_) return;
    if (ec) {
      self->read_failed(ec);
      return;
    }
    Message m;
    try {
      std::span<const uint8_t> body(self->body_);
      if (self->receive_mac_) {
        const std::span<const uint8_t> mac = body.subspan(body.size() - kFrameMacBytes);
        body = body.first(body.size() - kFrameMacBytes);
        const uint64_t seq = self->received_++;
        if (!digest_equal((*self->receive_mac_)({sequence_bytes(seq), body}), mac))
          throw ProtocolError("authenticated frame " + std::to_string(seq) +
                              " has a wrong MAC (injected, altered, replayed or out of order)");
      }
      m = decode(body);
    } catch (const ProtocolError& e) {
      self->finish(CloseCause::kProtocolError, e.what());
      return;
    }
    self->on_message_(std::move(m));
    if (!self->closed_) self->read_prefix();
  });
}

void FramedConnection::read_failed(const error_code& ec) {
  if (ec == asio::error::eof) finish(CloseCause::kPeerClosed, "connection closed");
  else finish(CloseCause::kReadFailed, ec.message());
}

}  // namespace deepen::control
