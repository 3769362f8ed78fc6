// The /metrics HTTP server: Boost.Beast reads each request within bounds; one answer, then close.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/ip/tcp.hpp>

namespace deepen::control {

// What one scrape connection may cost. A scraper sends a few hundred bytes and no body; the bounds
// are for clients that send more, or nothing.
struct MetricsServerLimits {
  double timeout_s = 5;          // to send the whole request, and again to take the answer
  size_t max_header_bytes = 8192;  // request line and headers; past it: 431
  size_t max_body_bytes = 8192;    // request body; past it: 413
  size_t max_connections = 16;     // at once; more are closed unanswered, so a flood of slow
                                   // clients cannot take the coordinator's descriptors
};

// Serves GET /metrics (any query string) with `render()`'s text, 404 for other paths, 405 (with
// Allow: GET) for other methods, 400 for what is not HTTP/1.x, 431 and 413 past the limits. Every
// answer closes the connection. Runs on the thread that runs the acceptor's io_context.
class MetricsServer {
 public:
  // `acceptor` is already listening. `on_answer` runs once per answer sent (for the coordinator's
  // counters). Starts accepting at once.
  MetricsServer(boost::asio::ip::tcp::acceptor acceptor, MetricsServerLimits limits,
                std::function<std::string()> render, std::function<void()> on_answer);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  uint16_t port() const;

  // Stops accepting. Call on the io thread; connections already open finish within their timeout.
  void close();

  struct State;

 private:
  std::shared_ptr<State> state_;  // shared with the connections, which may outlive this object
                                  // in the io_context's queue
};

}  // namespace deepen::control
