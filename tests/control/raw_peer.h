// Hand-driven control-plane peers on plain sockets: hostile clients, HTTP scrapes, and an agent or a
// coordinator that completes the handshake and then stops reading.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "dist/control/hmac.h"
#include "dist/control/policy.h"
#include "dist/control/secret.h"
#include "dist/control/wire.h"

namespace deepen::control::test_support {

// A socket with SO_RCVBUF = `rcvbuf` bytes (0 = the kernel's default), set before connect or listen
// so the window it advertises is small from the start: a peer that does not read then fills up fast.
inline int raw_socket(int rcvbuf) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  return fd;
}

inline sockaddr_in loopback(uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// A connected socket to 127.0.0.1:port, or -1.
inline int raw_connect(uint16_t port, int rcvbuf = 0) {
  const int fd = raw_socket(rcvbuf);
  const sockaddr_in addr = loopback(port);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A listening socket on 127.0.0.1 and a free port; accepted sockets inherit `rcvbuf`.
struct RawListener {
  int fd = -1;
  uint16_t port = 0;
  explicit RawListener(int rcvbuf = 0) {
    fd = raw_socket(rcvbuf);
    sockaddr_in addr = loopback(0);
    socklen_t len = sizeof addr;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 4) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error("test listener: cannot listen on 127.0.0.1");
    }
    port = ntohs(addr.sin_port);
  }
  ~RawListener() { ::close(fd); }
  RawListener(const RawListener&) = delete;
  RawListener& operator=(const RawListener&) = delete;
  int accept_one() const { return ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC); }
};

inline void raw_send(int fd, const std::vector<uint8_t>& bytes) {
  (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
}

// Reads until the peer closes (EOF or reset) or timeout_s passes, appending what arrives to `out`
// if given; true if the peer closed.
inline bool read_until_closed(int fd, double timeout_s, std::string* out = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
    if (out) out->append(buf, size_t(n));
  }
  return false;
}

inline bool closed_by_peer(int fd, double timeout_s) { return read_until_closed(fd, timeout_s); }

// Reads one frame (bounded by timeout) and decodes it.
inline std::optional<Message> raw_read_message(int fd, double timeout_s) {
  auto read_exact = [&](uint8_t* dst, size_t n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    size_t got = 0;
    while (got < n && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      const ssize_t r = ::recv(fd, dst + got, n - got, 0);
      if (r <= 0) return false;
      got += size_t(r);
    }
    return got == n;
  };
  std::array<uint8_t, 4> prefix;
  if (!read_exact(prefix.data(), 4)) return std::nullopt;
  const uint32_t n = read_frame_length(prefix, kMaxFrameBytes);
  std::vector<uint8_t> body(n);
  if (!read_exact(body.data(), n)) return std::nullopt;
  return decode(body);
}

inline std::string http_get(uint16_t port, const std::string& request, double timeout_s = 5) {
  const int fd = raw_connect(port);
  if (fd < 0) return "";
  raw_send(fd, std::vector<uint8_t>(request.begin(), request.end()));
  std::string out;
  read_until_closed(fd, timeout_s, &out);
  ::close(fd);
  return out;
}

// The agent's half of the handshake on `fd`, by hand and with the right secret: after it the
// coordinator counts this socket as rank `auth.rank`. False if the coordinator did not accept.
// `keys`, if given, receives the connection's frame keys (policy.h), for frames by hand after it.
inline bool raw_agent_handshake(int fd, const Secret& secret, Auth auth, FrameKeys* keys = nullptr) {
  const auto challenge = raw_read_message(fd, 5);
  if (!challenge || !std::holds_alternative<Challenge>(*challenge)) return false;
  auth.nonce = random_nonce();
  auth.mac = agent_mac(secret, std::get<Challenge>(*challenge).nonce, auth);
  raw_send(fd, encode_frame(auth));
  const auto ok = raw_read_message(fd, 5);
  if (keys) *keys = frame_keys(secret, std::get<Challenge>(*challenge).nonce, auth.nonce, auth.rank);
  return ok && std::holds_alternative<AuthOk>(*ok);
}

// What a stranger without the job's secret can send: after the Challenge on `fd`, a well-formed Auth
// for rank 1 of 2 whose MAC is under another secret. False if no Challenge came.
inline bool raw_forged_auth(int fd) {
  const auto challenge = raw_read_message(fd, 5);
  if (!challenge || !std::holds_alternative<Challenge>(*challenge)) return false;
  Auth forged{1, 2, 1, "evil", "", "", random_nonce(), {}};
  forged.mac = agent_mac(generate_secret(), std::get<Challenge>(*challenge).nonce, forged);
  raw_send(fd, encode_frame(forged));
  return true;
}

// An authenticated frame as FramedConnection writes it: prefix, body, HMAC(key, seq | body).
inline std::vector<uint8_t> mac_frame(const Mac& key, uint64_t seq, const Message& m) {
  std::vector<uint8_t> frame = encode_frame(m);
  std::array<uint8_t, 8> s{};
  for (int i = 7; i >= 0; --i, seq >>= 8) s[size_t(i)] = uint8_t(seq);
  const Digest mac = hmac_sha256(key, {s, std::span<const uint8_t>(frame).subspan(4)});
  frame.insert(frame.end(), mac.begin(), mac.end());
  const uint32_t n = uint32_t(frame.size() - 4);
  frame[0] = uint8_t(n >> 24); frame[1] = uint8_t(n >> 16); frame[2] = uint8_t(n >> 8); frame[3] = uint8_t(n);
  return frame;
}

// The coordinator's half on an accepted `fd`: after it the agent counts the link as up.
inline bool raw_coordinator_handshake(int fd, const Secret& secret) {
  const Nonce nonce = random_nonce();
  raw_send(fd, encode_frame(Challenge{kProtocolVersion, nonce}));
  const auto auth = raw_read_message(fd, 5);
  if (!auth || !std::holds_alternative<Auth>(*auth)) return false;
  const Auth& a = std::get<Auth>(*auth);
  if (!digest_equal(agent_mac(secret, nonce, a), a.mac)) return false;
  raw_send(fd, encode_frame(AuthOk{coordinator_mac(secret, nonce, a.nonce, a.rank)}));
  return true;
}

}  // namespace deepen::control::test_support
