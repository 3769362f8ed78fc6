// /metrics over HTTP/1.1: Boost.Beast parses the request (its limits give 431 and 413), this file
// decides the answer and closes each connection without losing that answer.
#include "dist/control/metrics_server.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <string_view>

#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "dist/control/clock.h"

namespace deepen::control {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

struct MetricsServer::State : std::enable_shared_from_this<MetricsServer::State> {
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  MetricsServerLimits limits;
  std::function<std::string()> render;
  std::function<void()> on_answer;
  size_t live = 0;  // open connections; touched only on the io thread
  bool closed = false;

  State(tcp::acceptor a, MetricsServerLimits l, std::function<std::string()> r, std::function<void()> o)
      : acceptor(std::move(a)), accept_retry(acceptor.get_executor()), limits(l), render(std::move(r)),
        on_answer(std::move(o)) {}

  void accept();
};

namespace {

// One connection: one request read within the limits, one answer, then close.
class MetricsConnection : public std::enable_shared_from_this<MetricsConnection> {
 public:
  MetricsConnection(std::shared_ptr<MetricsServer::State> server, tcp::socket socket)
      : server_(std::move(server)), stream_(std::move(socket)) {}

  void start() {
    ++server_->live;
    parser_.header_limit(uint32_t(std::min<size_t>(server_->limits.max_header_bytes, UINT32_MAX)));
    parser_.body_limit(server_->limits.max_body_bytes);
    stream_.expires_after(from_seconds(server_->limits.timeout_s));  // the whole request, not each read
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](const error_code& ec, size_t) { self->on_request(ec); });
  }

 private:
  void on_request(const error_code& ec) {
    if (ec == http::error::header_limit) {
      return answer(http::status::request_header_fields_too_large, "request headers too large\n");
    }
    if (ec == http::error::body_limit) return answer(http::status::payload_too_large, "request body too large\n");
    // The client left or went silent: nobody to answer.
    if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == beast::error::timeout) {
      return close();
    }
    if (ec) {
      // Any other parser error is a request that is not HTTP/1.x; a socket error leaves no one to tell.
      if (ec.category() == http::make_error_code(http::error::bad_method).category()) {
        return answer(http::status::bad_request, "malformed request\n");
      }
      return close();
    }
    const auto& request = parser_.get();
    if (request.method() != http::verb::get) {
      return answer(http::status::method_not_allowed, "only GET\n", "text/plain; charset=utf-8", true);
    }
    const std::string_view target(request.target().data(), request.target().size());
    if (target.substr(0, target.find('?')) != "/metrics") {
      return answer(http::status::not_found, "only /metrics is served\n");
    }
    answer(http::status::ok, server_->render(), "text/plain; version=0.0.4; charset=utf-8");
  }

  void answer(http::status status, std::string body, const char* type = "text/plain; charset=utf-8",
              bool allow_get = false) {
    server_->on_answer();
    response_.version(11);
    response_.result(status);
    response_.set(http::field::content_type, type);
    if (allow_get) response_.set(http::field::allow, "GET");
    response_.keep_alive(false);
    response_.body() = std::move(body);
    response_.prepare_payload();
    stream_.expires_after(from_seconds(server_->limits.timeout_s));
    http::async_write(stream_, response_, [self = shared_from_this()](const error_code& ec, size_t) {
      if (ec) return self->close();
      self->linger();
    });
  }

  // Closing a socket that still has unread input (the rest of an oversized request) makes the
  // kernel send a reset and drop what of the answer it has not delivered yet (RFC 9112, 9.6
  // Tear-down). So, as that section advises: end our side, read and drop what the client still sends
  // until it closes or the timeout passes, then close. (On loopback the answer is delivered before
  // the reset, so the tests pass either way; a slow network path is where it would be lost.)
  void linger() {
    error_code ignore;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignore);
    stream_.expires_after(from_seconds(server_->limits.timeout_s));
    drain();
  }

  void drain() {
    stream_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](const error_code& ec, size_t) {
      if (ec) return self->close();
      self->drain();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    error_code ignore;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignore);
    stream_.close();
    --server_->live;
  }

  std::shared_ptr<MetricsServer::State> server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request_parser<http::string_body> parser_;
  http::response<http::string_body> response_;
  std::array<char, 1024> scratch_;
  bool closed_ = false;
};

}  // namespace

void MetricsServer::State::accept() {
  acceptor.async_accept([self = shared_from_this()](const error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || self->closed) return;
    if (!ec) {
      if (self->live >= self->limits.max_connections) {
        error_code ignore;
        socket.close(ignore);
      } else {
        std::make_shared<MetricsConnection>(self, std::move(socket))->start();
      }
      self->accept();
      return;
    }
    // Out of descriptors or similar: retrying at once would spin; retry shortly.
    self->accept_retry.expires_after(std::chrono::milliseconds(50));
    self->accept_retry.async_wait([self](const error_code& e) {
      if (!e && !self->closed) self->accept();
    });
  });
}

MetricsServer::MetricsServer(tcp::acceptor acceptor, MetricsServerLimits limits, std::function<std::string()> render,
                             std::function<void()> on_answer)
    : state_(std::make_shared<State>(std::move(acceptor), limits, std::move(render), std::move(on_answer))) {
  state_->accept();
}

MetricsServer::~MetricsServer() = default;

uint16_t MetricsServer::port() const { return state_->acceptor.local_endpoint().port(); }

void MetricsServer::close() {
  state_->closed = true;
  error_code ignore;
  state_->acceptor.close(ignore);
  state_->accept_retry.cancel();
}

}  // namespace deepen::control
