// Control plane, pure parts: SHA-256/HMAC vectors, wire format (round trips, rejects, fuzz), secret
// files, endpoints, watchdog and stop decisions, Prometheus rendering.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "config/input_error.h"
#include "dist/control/control_plane.h"
#include "dist/control/coordinator.h"
#include "dist/control/endpoint.h"
#include "dist/control/policy.h"
#include "dist/control/secret.h"
#include "dist/control/sha256.h"
#include "dist/control/wire.h"
#include "tests/control/control_test_util.h"

namespace deepen::control {
namespace {

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Expected digests computed with Python's hashlib / hmac.
TEST(ControlSha256, MatchesFipsVectorsAndPythonAtBlockBoundaries) {
  EXPECT_EQ(to_hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(to_hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(to_hex(sha256(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Lengths around the 56-byte padding edge and the 64-byte block: bytes 0, 1, 2, ...
  const std::map<size_t, std::string> expected = {
      {55, "463eb28e72f82e0a96c0a4cc53690c571281131f672aa229e0d45ae59b598b59"},
      {56, "da2ae4d6b36748f2a318f23e7ab1dfdf45acdc9d049bd80e59de82a60895f562"},
      {63, "29af2686fd53374a36b0846694cc342177e428d1647515f078784d69cdb9e488"},
      {64, "fdeab9acf3710362bd2658cdc9a29e8f9c757fcf9811603a8c447cd1d9151108"},
      {65, "4bfd2c8b6f1eec7a2afeb48b934ee4b2694182027e6d0fc075074f2fabb31781"},
      {119, "da18797ed7c3a777f0847f429724a2d8cd5138e6ed2895c3fa1a6d39d18f7ec6"},
      {120, "f52b23db1fbb6ded89ef42a23ce0c8922c45f25c50b568a93bf1c075420bbb7c"},
      {127, "92ca0fa6651ee2f97b884b7246a562fa71250fedefe5ebf270d31c546bfea976"},
      {128, "471fb943aa23c511f6f72f8d1652d9c880cfa392ad80503120547703e56a2be5"}};
  for (const auto& [n, hex] : expected) {
    std::vector<uint8_t> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = uint8_t(i);
    EXPECT_EQ(to_hex(sha256(data)), hex) << n << " bytes in one update";
    Sha256 chunked;  // the same bytes fed in uneven pieces
    for (size_t i = 0; i < n; i += 7) chunked.update(std::span(data).subspan(i, std::min<size_t>(7, n - i)));
    EXPECT_EQ(to_hex(chunked.finish()), hex) << n << " bytes in 7-byte updates";
  }
}

TEST(ControlSha256, HmacMatchesRfc4231) {
  const std::vector<uint8_t> key1(20, 0x0b);
  EXPECT_EQ(to_hex(hmac_sha256(key1, {bytes_of("Hi There")})),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(to_hex(hmac_sha256(bytes_of("Jefe"), {bytes_of("what do ya "), bytes_of("want for nothing?")})),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  const std::vector<uint8_t> long_key(131, 0xaa);  // longer than a block: hashed first
  EXPECT_EQ(to_hex(hmac_sha256(long_key, {bytes_of("Test Using Larger Than Block-Size Key - Hash Key First")})),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(ControlSha256, HexRoundTripsAndRejectsNonHex) {
  const std::vector<uint8_t> b = {0x00, 0x7f, 0xff, 0xa5};
  EXPECT_EQ(to_hex(b), "007fffa5");
  EXPECT_EQ(from_hex("007FFFA5"), b);
  EXPECT_FALSE(from_hex("abc").has_value());
  EXPECT_FALSE(from_hex("zz").has_value());
  EXPECT_TRUE(digest_equal(sha256("x"), sha256("x")));
  EXPECT_FALSE(digest_equal(sha256("x"), sha256("y")));
}

std::vector<Message> sample_messages() {
  Nonce n{};
  for (size_t i = 0; i < n.size(); ++i) n[i] = uint8_t(i * 7);
  Heartbeat hb{1234, 3, 4, "train", {{"train_loss", 2.5}, {"tokens_per_s", 1e6}, {"nan", std::nan("")}}};
  return {Challenge{kProtocolVersion, n},
          Auth{7, 16, 4242, "node07", "student 3", n, n},
          AuthOk{n},
          hb,
          StopRequest{"SIGUSR1 on rank 3"},
          StopQuery{},
          StopAck{-1},
          Stop{99, "SIGTERM"},
          Abort{2, "node02", 17, "rank 2 on node02, last step 17: lost"},
          Bye{3, "requeue"},
          Ping{0, "node01", 55},
          Shutdown{}};
}

TEST(ControlWire, EveryMessageRoundTripsExactly) {
  const auto messages = sample_messages();
  ASSERT_EQ(messages.size(), std::variant_size_v<Message>) << "a message type has no sample";
  for (const Message& m : messages) {
    const std::vector<uint8_t> body = encode(m);
    const Message back = decode(body);
    EXPECT_EQ(back.index(), m.index());
    EXPECT_EQ(encode(back), body) << message_name(m);
    const std::vector<uint8_t> frame = encode_frame(m);
    ASSERT_EQ(frame.size(), body.size() + 4);
    EXPECT_EQ(read_frame_length({frame[0], frame[1], frame[2], frame[3]}, kMaxFrameBytes), body.size());
  }
  const auto hb = std::get<Heartbeat>(decode(encode(sample_messages()[3])));
  EXPECT_EQ(hb.step, 1234);
  EXPECT_EQ(hb.phase, "train");
  ASSERT_EQ(hb.metrics.size(), 3u);
  EXPECT_EQ(hb.metrics[1].first, "tokens_per_s");
  EXPECT_EQ(hb.metrics[1].second, 1e6);
  EXPECT_TRUE(std::isnan(hb.metrics[2].second));
}

TEST(ControlWire, RejectsTruncatedTrailingUnknownAndOverLongInput) {
  for (const Message& m : sample_messages()) {
    const std::vector<uint8_t> body = encode(m);
    for (size_t n = 0; n < body.size(); ++n) {
      EXPECT_THROW(decode(std::span(body).first(n)), ProtocolError) << message_name(m) << " cut at " << n;
    }
    std::vector<uint8_t> longer = body;
    longer.push_back(0);
    EXPECT_THROW(decode(longer), ProtocolError) << message_name(m) << " with a trailing byte";
  }
  EXPECT_THROW(decode(std::vector<uint8_t>{uint8_t(std::variant_size_v<Message>)}), ProtocolError);
  EXPECT_THROW(decode(std::vector<uint8_t>{0xff}), ProtocolError);
  // A string announcing more than kMaxStringBytes.
  std::vector<uint8_t> req = {uint8_t(Message(StopRequest{}).index()), 0xff, 0xff};
  req.resize(req.size() + 0xffff, 'x');
  EXPECT_THROW(decode(req), ProtocolError);
  // A metric map announcing 257 entries.
  std::vector<uint8_t> hb = encode(Heartbeat{});
  hb[hb.size() - 2] = 0x01;
  hb[hb.size() - 1] = 0x01;
  EXPECT_THROW(decode(hb), ProtocolError);
  // Sender side: over-long fields are refused before they reach the wire.
  EXPECT_THROW(encode(StopRequest{std::string(kMaxStringBytes + 1, 'x')}), ProtocolError);
  MetricList too_many(kMaxMetrics + 1, {"m", 1.0});
  EXPECT_THROW(encode(Heartbeat{0, 0, 0, "", too_many}), ProtocolError);
  // Length prefixes.
  EXPECT_THROW(read_frame_length({0, 0, 0, 0}, kMaxFrameBytes), ProtocolError);
  EXPECT_THROW(read_frame_length({0xff, 0xff, 0xff, 0xff}, kMaxFrameBytes), ProtocolError);
  EXPECT_THROW(read_frame_length({0, 1, 0, 1}, kMaxFrameBytes), ProtocolError);  // 65537
  EXPECT_EQ(read_frame_length({0, 1, 0, 0}, kMaxFrameBytes), 65536u);
  EXPECT_THROW(read_frame_length({0, 0, 4, 1}, kMaxHandshakeBytes), ProtocolError);
}

// Randomized: random bodies and mutations of valid ones. The parser must either return a message
// that re-encodes to exactly the same bytes (the format is canonical) or throw ProtocolError;
// nothing else (no crash, no other exception, no over-read: run under ASan to check that too).
// Bounded by both an iteration count and 2 s so CI time stays fixed; the seed is printed.
TEST(ControlWire, FuzzedInputIsParsedExactlyOrRejected) {
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  RecordProperty("seed", std::to_string(seed));
  std::cout << "fuzz seed " << seed << "\n";
  const auto valid = sample_messages();
  std::vector<std::vector<uint8_t>> corpus;
  for (const auto& m : valid) corpus.push_back(encode(m));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  size_t accepted = 0, rejected = 0, iterations = 0;
  for (; iterations < 300000 && std::chrono::steady_clock::now() < deadline; ++iterations) {
    std::vector<uint8_t> body;
    const int kind = int(rng() % 4);
    if (kind == 0) {  // random bytes, valid type byte half of the time
      body.resize(rng() % 200);
      for (auto& b : body) b = uint8_t(rng());
      if (!body.empty() && rng() % 2) body[0] = uint8_t(rng() % std::variant_size_v<Message>);
    } else {  // mutate a valid body: flips, truncation, insertion, length-field edits
      body = corpus[rng() % corpus.size()];
      const int edits = 1 + int(rng() % 4);
      for (int e = 0; e < edits && !body.empty(); ++e) {
        const size_t at = rng() % body.size();
        switch (rng() % 5) {
          case 0: body[at] ^= uint8_t(1u << (rng() % 8)); break;
          case 1: body.resize(at); break;
          case 2: body.insert(body.begin() + long(at), uint8_t(rng())); break;
          case 3: body[at] = 0xff; break;
          case 4: body[at] = 0x00; break;
        }
      }
    }
    try {
      const Message m = decode(body);
      ASSERT_EQ(encode(m), body) << "accepted input does not re-encode to itself (seed " << seed << ")";
      ++accepted;
      if (corpus.size() < 64) corpus.push_back(body);
    } catch (const ProtocolError&) {
      ++rejected;
    }
  }
  std::cout << iterations << " fuzz inputs: " << accepted << " accepted, " << rejected << " rejected\n";
  EXPECT_GT(iterations, 1000u);
  EXPECT_GT(rejected, 0u);
}

TEST(ControlSecret, FileIsWrittenOwnerOnlyAndReadBackAndGroupReadableIsRefused) {
  const auto dir = std::filesystem::temp_directory_path() / ("deepen_secret_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "job_secret").string();
  const Secret s = generate_secret();
  EXPECT_NE(s, generate_secret());
  ::umask(022);
  write_secret_file(path, s);
  struct stat st{};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(read_secret_file(path), s);
  ::chmod(path.c_str(), 0644);
  try {
    read_secret_file(path);
    ADD_FAILURE() << "a group-readable secret file was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("0644"), std::string::npos) << e.what();
  }
  ::chmod(path.c_str(), 0600);
  std::ofstream(path) << "not hex\n";
  EXPECT_THROW(read_secret_file(path), InputError);
  EXPECT_THROW(read_secret_file((dir / "missing").string()), InputError);
  std::filesystem::remove_all(dir);
}

TEST(ControlSecret, EnvironmentGivesTheSecretAsHex) {
  const Secret s = generate_secret();
  ::setenv("DEEPEN_JOB_SECRET", (secret_hex(s) + "\n").c_str(), 1);
  EXPECT_EQ(secret_from_env(), s);
  ::setenv("DEEPEN_JOB_SECRET", "abcd", 1);
  try {
    secret_from_env();
    ADD_FAILURE() << "a short secret was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("DEEPEN_JOB_SECRET"), std::string::npos);
  }
  ::unsetenv("DEEPEN_JOB_SECRET");
  ::unsetenv("DEEPEN_JOB_SECRET_FILE");
  EXPECT_FALSE(secret_from_env().has_value());
}

TEST(ControlEndpoint, ParsesHostPortForms) {
  EXPECT_EQ(parse_endpoint("node01:41234", "x"), (Endpoint{"node01", 41234}));
  EXPECT_EQ(parse_endpoint("node01", "x"), (Endpoint{"node01", 0}));
  EXPECT_EQ(parse_endpoint("[::1]:80", "x"), (Endpoint{"::1", 80}));
  EXPECT_EQ((Endpoint{"::1", 80}).str(), "[::1]:80");
  EXPECT_EQ((Endpoint{"10.0.0.5", 7}).str(), "10.0.0.5:7");
  for (const char* bad : {"", ":80", "node:70000", "node:x", "::1:80", "[::1"}) {
    EXPECT_THROW(parse_endpoint(bad, "DEEPEN_COORDINATOR"), InputError) << bad;
  }
  ::setenv("DEEPEN_COORDINATOR", "gpu01:5000", 1);
  EXPECT_EQ(coordinator_from_env(), (Endpoint{"gpu01", 5000}));
  ::unsetenv("DEEPEN_COORDINATOR");
  EXPECT_FALSE(coordinator_from_env().has_value());
}

TEST(ControlEndpoint, LaunchEnvironmentPrefersDeepenCoordinatorThenSlurmsFirstNode) {
  ::unsetenv("DEEPEN_COORDINATOR");
  EXPECT_FALSE(coordinator_from_launch_env(0).has_value()) << "neither set: the caller decides";
  EXPECT_EQ(coordinator_from_launch_env(29500, "gpu07"), (Endpoint{"gpu07", 29500}));
  ::setenv("DEEPEN_COORDINATOR", "gpu08", 1);
  EXPECT_EQ(coordinator_from_launch_env(29500, "gpu07"), (Endpoint{"gpu08", 29500}));
  ::setenv("DEEPEN_COORDINATOR", "gpu08:4000", 1);
  EXPECT_EQ(coordinator_from_launch_env(29500, "gpu07"), (Endpoint{"gpu08", 4000}));
  ::setenv("DEEPEN_COORDINATOR", "gpu08:x", 1);
  EXPECT_THROW(coordinator_from_launch_env(0), InputError);
  ::unsetenv("DEEPEN_COORDINATOR");
}

TEST(ControlHandshake, MacsBindEveryFieldAndTheSecret) {
  const Secret secret = generate_secret();
  const Nonce server = random_nonce();
  Auth auth{3, 8, 99, "node02", "student 1", random_nonce(), {}};
  const Mac mac = agent_mac(secret, server, auth);
  EXPECT_EQ(mac, agent_mac(secret, server, auth));
  Auth changed = auth;
  changed.rank = 4;
  EXPECT_NE(mac, agent_mac(secret, server, changed));
  changed = auth;
  changed.host = "node03";
  EXPECT_NE(mac, agent_mac(secret, server, changed));
  EXPECT_NE(mac, agent_mac(generate_secret(), server, auth));
  EXPECT_NE(mac, agent_mac(secret, random_nonce(), auth));
  EXPECT_NE(coordinator_mac(secret, server, auth.nonce, 3), coordinator_mac(secret, server, auth.nonce, 4));
}

RankView view(int rank, RankState state, int64_t step, double hb_age, double stall) {
  RankView v;
  v.rank = rank;
  v.host = "n" + std::to_string(rank);
  v.role = "student " + std::to_string(rank);
  v.pid = 100 + rank;
  v.state = state;
  v.step = step;
  v.phase = "train";
  v.heartbeat_age_s = hb_age;
  v.stall_s = stall;
  return v;
}

TEST(ControlWatchdog, VerdictFollowsTheDocumentedOrderAndNamesRankHostStep) {
  const WatchdogLimits limits{10, 30};
  std::vector<RankView> ranks = {view(0, RankState::kConnected, 7, 1, 1), view(1, RankState::kConnected, 7, 1, 1),
                                 view(2, RankState::kConnected, 7, 1, 1), view(3, RankState::kConnected, 7, 1, 1)};
  EXPECT_FALSE(watchdog_verdict(ranks, 100, limits).has_value());

  // Job-wide stall: blame the rank that stopped first; nothing while any rank still progresses.
  ranks[0].stall_s = 11; ranks[1].stall_s = 12; ranks[2].stall_s = 14; ranks[3].stall_s = 12;
  auto v = watchdog_verdict(ranks, 100, limits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 2);
  EXPECT_EQ(v->host, "n2");
  EXPECT_EQ(v->step, 7);
  EXPECT_EQ(v->message.rfind("rank 2 on n2 (student 2, pid 102), last step 7: no rank has made progress", 0), 0u)
      << v->message;
  ranks[0].stall_s = 1;
  EXPECT_FALSE(watchdog_verdict(ranks, 100, limits).has_value());

  // Heartbeat silence beats a stall; the oldest silence is blamed.
  ranks[1].heartbeat_age_s = 11;
  ranks[3].heartbeat_age_s = 15;
  v = watchdog_verdict(ranks, 100, limits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 3);
  EXPECT_NE(v->message.find("no heartbeat for 15.0 s"), std::string::npos) << v->message;

  // A failed Bye beats silence; a lost connection beats everything.
  ranks[0].state = RankState::kDone;
  ranks[0].exit_code = 1;
  ranks[0].bye_message = "CUDA error";
  v = watchdog_verdict(ranks, 100, limits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 0);
  EXPECT_NE(v->message.find("exited with code 1: CUDA error"), std::string::npos) << v->message;
  ranks[2].state = RankState::kLost;
  v = watchdog_verdict(ranks, 100, limits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 2);
  EXPECT_EQ(v->message, "rank 2 on n2 (student 2, pid 102), last step 7: control connection lost; the "
                        "process died or its node failed");
  // Dropped by the coordinator for not reading (the send-queue bound): the same rule, its reason.
  ranks[2].dropped_why = "the peer stopped reading: ...";
  v = watchdog_verdict(ranks, 100, limits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 2);
  EXPECT_EQ(v->message, "rank 2 on n2 (student 2, pid 102), last step 7: control connection dropped by the "
                        "coordinator: the peer stopped reading: ...");

  // Clean exits (0, and 3 = requeue) are not failures.
  std::vector<RankView> done = {view(0, RankState::kDone, 9, 50, 50), view(1, RankState::kDone, 9, 50, 50)};
  done[1].exit_code = 3;
  EXPECT_FALSE(watchdog_verdict(done, 100, limits).has_value());

  // Ranks that never connected: only after the connect timeout; all missing ranks listed.
  std::vector<RankView> missing = {view(0, RankState::kConnected, -1, 0, 0), view(1, RankState::kNeverConnected, -1, 0, 0),
                                   view(2, RankState::kNeverConnected, -1, 0, 0)};
  EXPECT_FALSE(watchdog_verdict(missing, 29, limits).has_value());
  v = watchdog_verdict(missing, 31, limits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 1);
  EXPECT_NE(v->message.find("missing ranks: 1, 2"), std::string::npos) << v->message;
}

TEST(ControlStopDecision, IsTheLargestReachOrTheFirstStep) {
  EXPECT_EQ(decide_stop_step(std::vector<int64_t>{12, 9, 9, 10}), 12);
  EXPECT_EQ(decide_stop_step(std::vector<int64_t>{-1, 5}), 5);
  EXPECT_EQ(decide_stop_step(std::vector<int64_t>{-1, -1}), kStopAtFirstStep);
  EXPECT_EQ(decide_stop_step(std::vector<int64_t>{}), kStopAtFirstStep);
}

TEST(ControlMetricsText, IsValidPrometheusWithEscapedLabelsAndSanitizedNames) {
  std::vector<RankView> ranks = {view(0, RankState::kConnected, 17, 0.25, 0), view(1, RankState::kLost, 12, 9, 0),
                                 view(2, RankState::kNeverConnected, -1, 0, 0)};
  ranks[0].host = "we\"ird\\host\nx";
  ranks[0].stage = 2;
  ranks[0].depth = 3;
  ranks[0].metrics = {{"train_loss", 2.5}, {"eval/ce-loss", 3.25}, {"step", 1}, {"eval_ce_loss", 9},
                      {"tokens_per_s", std::nan("")}, {"logit_bytes_per_s", INFINITY}};
  ranks[1].metrics = {{"train_loss", 2.75}};
  const std::string text = render_prometheus(ranks, 20, false);
  std::vector<test::PromSample> samples;
  ASSERT_EQ(test::parse_prometheus(text, samples), "") << text;
  EXPECT_EQ(test::prom_value(samples, "deepen_step", "0"), 17);
  EXPECT_EQ(test::prom_value(samples, "deepen_step", "1"), 12);
  EXPECT_TRUE(std::isnan(test::prom_value(samples, "deepen_step", "2"))) << "never-connected ranks have no series";
  EXPECT_EQ(test::prom_value(samples, "deepen_stage", "0"), 2);
  EXPECT_EQ(test::prom_value(samples, "deepen_active_depth", "0"), 3);
  EXPECT_EQ(test::prom_value(samples, "deepen_heartbeat_age_seconds", "0"), 0.25);
  EXPECT_EQ(test::prom_value(samples, "deepen_rank_up", "1"), 0);
  EXPECT_EQ(test::prom_value(samples, "deepen_ranks_connected"), 1);
  EXPECT_EQ(test::prom_value(samples, "deepen_stop_step"), 20);
  EXPECT_EQ(test::prom_value(samples, "deepen_train_loss", "1"), 2.75);
  EXPECT_EQ(test::prom_value(samples, "deepen_eval_ce_loss", "0"), 3.25) << "first of two names that sanitize alike";
  EXPECT_EQ(test::prom_value(samples, "deepen_metric_step", "0"), 1) << "clash with the built-in deepen_step";
  EXPECT_TRUE(std::isnan(test::prom_value(samples, "deepen_tokens_per_s", "0")));
  EXPECT_TRUE(std::isinf(test::prom_value(samples, "deepen_logit_bytes_per_s", "0")));
  bool found_host = false;
  for (const auto& s : samples) found_host |= s.labels.count("host") && s.labels.at("host") == "we\"ird\\host\nx";
  EXPECT_TRUE(found_host) << "label value did not survive escaping";
  EXPECT_NE(text.find("# TYPE deepen_train_loss gauge"), std::string::npos);
  EXPECT_NE(text.find("# HELP deepen_eval_ce_loss Trainer metric"), std::string::npos);
}

}  // namespace
}  // namespace deepen::control
