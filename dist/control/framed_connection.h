// Framed connection: one control-plane TCP link for agent and coordinator; bounded frames, bounded send queue.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/ip/tcp.hpp>

#include "dist/control/hmac.h"
#include "dist/control/wire.h"

namespace deepen::control {

// Why a connection closed by itself. close() called by the owner reports nothing.
enum class CloseCause {
  kPeerClosed,     // orderly end of stream from the peer
  kReadFailed,     // reset or another socket error while reading
  kProtocolError,  // a length prefix over the bound, or a body that does not decode exactly
  kWriteFailed,    // socket error while writing
  kSendQueueFull,  // the send-queue bound was hit: the peer stopped reading (see below)
  kFlushed,        // close_after_flush(): everything queued was written, then it closed
};

// Send-queue bound (the same policy on both ends). Frames pile up in user space only while the
// kernel's socket buffers are full, i.e. while the peer is not reading. A frame that would take the bytes
// waiting (the frame being written included) over max_send_queue_bytes is not queued: the
// connection closes with kSendQueueFull and a reason naming the bound. Nothing is dropped
// selectively, not even a heartbeat: every frame is either a protocol step the peer must act on
// (Auth, StopQuery, StopAck, Stop, Abort, Bye, Shutdown) or the liveness signal whose absence the
// peer's watchdog measures, so a peer that reads none of them cannot take part in the job any more.
// Each owner treats that close as losing the peer: the coordinator counts the rank as lost and the
// watchdog aborts the job naming it; an agent aborts naming the coordinator. The bound must hold
// one largest frame (kMaxFrameBytes + 4 + kFrameMacBytes), so a peer that reads is never dropped for
// one big frame; the default is kDefaultMaxSendQueueBytes (wire.h).
//
// Frame MACs. Once both ends have authenticated (the handshake: policy.h), every frame carries
//   HMAC-SHA256(key of its direction, sequence number (u64, big-endian) | body)
// after its body, the length prefix counting both; the sequence number is not sent: each end counts
// the frames of each direction from 0. A frame that was injected into the stream, altered, replayed,
// dropped or reordered fails the check, and the connection closes with kProtocolError naming the
// frame's number: on a network, nobody but the two ends can stop, abort or feed a job its state.

// Throws std::invalid_argument if a send queue of this many bytes cannot hold one largest frame.
// Owners call it where their options are taken, before any io thread could meet the error.
void check_send_queue_bound(size_t max_send_queue_bytes);

// Threading: every member is called on the one thread that runs the socket's io_context, and the
// callbacks run there too. Pending operations hold a shared_ptr to the connection, so create it
// with std::make_shared.
class FramedConnection : public std::enable_shared_from_this<FramedConnection> {
 public:
  using OnMessage = std::function<void(Message)>;
  // Called at most once, when the connection closes by itself; `why` is for messages ("" for
  // kFlushed). May be called from inside send() or close_after_flush(). The socket closes right
  // after it returns, so the owner's bookkeeping is done before the peer sees the close.
  using OnClose = std::function<void(CloseCause, const std::string& why)>;

  // Takes a connected socket. Throws as check_send_queue_bound does.
  FramedConnection(boost::asio::ip::tcp::socket socket, size_t max_send_queue_bytes);
  ~FramedConnection();
  FramedConnection(const FramedConnection&) = delete;
  FramedConnection& operator=(const FramedConnection&) = delete;

  // Starts reading; every decoded frame goes to on_message until the connection closes. Frames
  // are bounded by kMaxHandshakeBytes until allow_full_frames(): before authentication a peer
  // cannot make us allocate more than that.
  void start(OnMessage on_message, OnClose on_close);
  void allow_full_frames();

  // From the next frame on, in each direction: frames sent carry a MAC under `send_key`, frames read
  // must carry a valid one under `receive_key` (see above). Call it where the handshake ends on this
  // end: after queuing the last unauthenticated frame, and before the first authenticated one is read.
  void authenticate_frames(const Mac& send_key, const Mac& receive_key);

  // Queues one frame (see the bound above). Ignored once closed. Throws ProtocolError if the
  // message breaks a wire bound (the caller's bug, as in encode()).
  void send(const Message& message);

  // Writes what is queued, then closes and reports kFlushed (or the write error that came first).
  void close_after_flush();

  // Closes now, discarding what is queued; no callback follows.
  void close();

  bool is_open() const { return !closed_; }
  size_t queued_bytes() const { return queued_bytes_; }
  const std::string& remote() const { return remote_; }  // "10.0.0.5:41234", for logs

 private:
  void read_prefix();
  void read_body(uint32_t n);
  void read_failed(const boost::system::error_code& ec);
  void shut_socket();
  void write_next();
  void finish(CloseCause cause, const std::string& why);

  boost::asio::ip::tcp::socket socket_;
  size_t max_send_queue_bytes_;
  std::string remote_;
  OnMessage on_message_;
  OnClose on_close_;
  uint32_t max_frame_ = kMaxHandshakeBytes;
  std::optional<HmacKey> send_mac_, receive_mac_;
  uint64_t sent_ = 0, received_ = 0;  // authenticated frames so far, each way: the next sequence numbers
  std::array<uint8_t, 4> prefix_{};
  std::vector<uint8_t> body_;
  std::deque<std::vector<uint8_t>> queue_;  // front() is being written while writing_
  size_t queued_bytes_ = 0;
  bool writing_ = false;
  bool flushing_ = false;
  bool closed_ = false;
};

}  // namespace deepen::control
