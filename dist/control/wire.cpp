// Control-plane wire format: encoder and the strict, bounds-checked decoder (fuzzed in tests).
#include "dist/control/wire.h"

#include <bit>
#include <cstring>

namespace deepen::control {
namespace {

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}
  void operator()(uint16_t v) { put_be(v, 2); }
  void operator()(int32_t v) { put_be(uint32_t(v), 4); }
  void operator()(int64_t v) { put_be(uint64_t(v), 8); }
  void operator()(double v) { put_be(std::bit_cast<uint64_t>(v), 8); }
  void operator()(const std::array<uint8_t, 32>& v) { out_.insert(out_.end(), v.begin(), v.end()); }
  void operator()(const std::string& v) { put_string(v, kMaxStringBytes); }
  void operator()(const MetricList& v) {
    if (v.size() > kMaxMetrics) throw ProtocolError("metric map has more than 256 entries");
    put_be(v.size(), 2);
    for (const auto& [name, value] : v) {
      put_string(name, kMaxMetricName);
      (*this)(value);
    }
  }
  void operator()(const RunSteps& v) {
    if (v.size() > kMaxRuns) throw ProtocolError("run list has more than 256 entries");
    put_be(v.size(), 2);
    for (const auto& [run, step] : v) {
      put_string(run, kMaxRunName);
      (*this)(step);
    }
  }

 private:
  void put_be(uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; --i) out_.push_back(uint8_t(v >> (8 * i)));
  }
  void put_string(const std::string& v, size_t max) {
    if (v.size() > max) {
      throw ProtocolError("string of " + std::to_string(v.size()) + " bytes is over the bound of " +
                          std::to_string(max));
    }
    put_be(v.size(), 2);
    out_.insert(out_.end(), v.begin(), v.end());
  }
  std::vector<uint8_t>& out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  void operator()(uint16_t& v) { v = uint16_t(get_be(2)); }
  void operator()(int32_t& v) { v = int32_t(uint32_t(get_be(4))); }
  void operator()(int64_t& v) { v = int64_t(get_be(8)); }
  void operator()(double& v) { v = std::bit_cast<double>(get_be(8)); }
  void operator()(std::array<uint8_t, 32>& v) {
    need(32);
    std::memcpy(v.data(), in_.data() + pos_, 32);
    pos_ += 32;
  }
  void operator()(std::string& v) { v = get_string(kMaxStringBytes); }
  void operator()(MetricList& v) {
    const size_t n = get_be(2);
    if (n > kMaxMetrics) throw ProtocolError("metric map announces " + std::to_string(n) + " entries");
    v.clear();
    v.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      std::string name = get_string(kMaxMetricName);
      double value;
      (*this)(value);
      v.emplace_back(std::move(name), value);
    }
  }
  void operator()(RunSteps& v) {
    const size_t n = get_be(2);
    if (n > kMaxRuns) throw ProtocolError("run list announces " + std::to_string(n) + " entries");
    v.clear();
    v.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      std::string run = get_string(kMaxRunName);
      int64_t step;
      (*this)(step);
      v.emplace_back(std::move(run), step);
    }
  }
  void expect_end() const {
    if (pos_ != in_.size()) {
      throw ProtocolError(std::to_string(in_.size() - pos_) + " trailing bytes after the message");
    }
  }

 private:
  void need(size_t n) const {
    if (in_.size() - pos_ < n) throw ProtocolError("message ends inside a field");
  }
  uint64_t get_be(int bytes) {
    need(size_t(bytes));
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v = (v << 8) | in_[pos_ + i];
    pos_ += size_t(bytes);
    return v;
  }
  std::string get_string(size_t max) {
    const size_t n = get_be(2);
    if (n > max) throw ProtocolError("string of " + std::to_string(n) + " bytes is over the bound");
    need(n);
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

template <size_t I = 0>
Message decode_alternative(size_t type, Reader& reader) {
  if constexpr (I < std::variant_size_v<Message>) {
    if (type == I) {
      std::variant_alternative_t<I, Message> m;
      m.fields(reader);
      return m;
    }
    return decode_alternative<I + 1>(type, reader);
  } else {
    throw ProtocolError("unknown message type " + std::to_string(type));
  }
}

}  // namespace

std::vector<uint8_t> encode(const Message& message) {
  std::vector<uint8_t> out;
  out.push_back(uint8_t(message.index()));
  Writer writer(out);
  std::visit([&](auto m) { m.fields(writer); }, message);
  if (out.size() > kMaxFrameBytes) throw ProtocolError("message over the 64 KiB frame bound");
  return out;
}

std::vector<uint8_t> encode_frame(const Message& message) {
  const std::vector<uint8_t> body = encode(message);
  std::vector<uint8_t> out(4 + body.size());
  const uint32_t n = uint32_t(body.size());
  out[0] = uint8_t(n >> 24); out[1] = uint8_t(n >> 16); out[2] = uint8_t(n >> 8); out[3] = uint8_t(n);
  std::memcpy(out.data() + 4, body.data(), body.size());
  return out;
}

Message decode(std::span<const uint8_t> body) {
  if (body.empty()) throw ProtocolError("empty message");
  Reader reader(body.subspan(1));
  Message m = decode_alternative(body[0], reader);
  reader.expect_end();
  return m;
}

uint32_t read_frame_length(const std::array<uint8_t, 4>& prefix, uint32_t max_bytes) {
  const uint32_t n = (uint32_t(prefix[0]) << 24) | (uint32_t(prefix[1]) << 16) |
                     (uint32_t(prefix[2]) << 8) | uint32_t(prefix[3]);
  if (n == 0) throw ProtocolError("zero-length frame");
  if (n > max_bytes) {
    throw ProtocolError("frame of " + std::to_string(n) + " bytes is over the bound of " +
                        std::to_string(max_bytes));
  }
  return n;
}

const char* message_name(const Message& message) {
  static constexpr const char* kNames[] = {"Challenge", "Auth", "AuthOk", "Heartbeat", "StopRequest",
                                           "StopQuery", "StopAck", "Stop", "Abort", "Bye", "Ping",
                                           "Shutdown"};
  static_assert(std::size(kNames) == std::variant_size_v<Message>);
  return kNames[message.index()];
}

}  // namespace deepen::control
