// /metrics over real sockets: a scrape is valid Prometheus text that follows the trainers' steps and
// that the Prometheus client's own parser reads; other paths, methods, malformed, oversized and
// silent requests, and floods of them, are refused within bounds.
#include <algorithm>
#include <cmath>
#include <map>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/control/control_test_util.h"
#include "tests/control/loopback_job.h"
#include "tests/control/raw_peer.h"
#include "tests/test_paths.h"

namespace deepen::control {
namespace {

using namespace test_support;

TEST(ControlMetricsHttp, ScrapeReturnsValidPrometheusTextWhoseStepIncreases) {
  LocalJob job(2, 2, [](CoordinatorOptions& o) { o.metrics = true; });
  const Coordinator& coord = *job.coord;
  ASSERT_TRUE(coord.metrics_endpoint().has_value());
  EXPECT_EQ(coord.metrics_endpoint()->host, "127.0.0.1");
  const uint16_t port = coord.metrics_endpoint()->port;
  Trainer t0(job.agent(0), std::chrono::milliseconds(5)), t1(job.agent(1), std::chrono::milliseconds(5));
  ASSERT_TRUE(eventually([&] { return job.step(0) > 2; }, 10));
  auto scrape = [&](std::vector<test::PromSample>& samples) {
    const std::string response = http_get(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << response;
    EXPECT_NE(response.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
    const std::string body = response.substr(response.find("\r\n\r\n") + 4);
    EXPECT_EQ(test::parse_prometheus(body, samples), "") << body;
    return body;
  };
  std::vector<test::PromSample> first, second;
  const std::string body = scrape(first);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  scrape(second);
  const double step_before = test::prom_value(first, "deepen_step", "0");
  const double step_after = test::prom_value(second, "deepen_step", "0");
  EXPECT_GT(step_before, 0);
  EXPECT_GT(step_after, step_before);
  EXPECT_EQ(test::prom_value(second, "deepen_world_size"), 2);
  EXPECT_EQ(test::prom_value(second, "deepen_ranks_connected"), 2);
  EXPECT_LT(test::prom_value(second, "deepen_heartbeat_age_seconds", "1"), 3.0);
  EXPECT_GT(test::prom_value(second, "deepen_train_loss", "1"), 0);
  for (const char* family : {"deepen_step", "deepen_stage", "deepen_active_depth", "deepen_heartbeat_age_seconds",
                             "deepen_train_loss"}) {
    EXPECT_NE(body.find(std::string("# HELP ") + family + " "), std::string::npos) << family;
    EXPECT_NE(body.find(std::string("# TYPE ") + family + " gauge"), std::string::npos) << family;
  }
}

TEST(ControlMetricsHttp, OtherPathsMethodsAndBadRequestsAreRefusedWithinBounds) {
  LocalJob job(1, 0, [](CoordinatorOptions& o) {
    o.metrics = true;
    o.http_timeout_s = 0.3;
  });
  const uint16_t port = job.coord->metrics_endpoint()->port;
  EXPECT_EQ(http_get(port, "GET /other HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  const std::string post = http_get(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(post.rfind("HTTP/1.1 405", 0), 0u) << post;
  EXPECT_NE(post.find("Allow: GET"), std::string::npos);
  EXPECT_EQ(http_get(port, "DELETE /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(http_get(port, "POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello").rfind("HTTP/1.1 405", 0), 0u);
  const std::string big_body = http_get(port, "GET /metrics HTTP/1.1\r\nContent-Length: 100000\r\n\r\n" +
                                                  std::string(100000, 'b'));
  EXPECT_EQ(big_body.rfind("HTTP/1.1 413", 0), 0u) << big_body;
  EXPECT_EQ(http_get(port, "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(http_get(port, "GET /metrics HTTP/2.0\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u) << "only HTTP/1.x";
  EXPECT_EQ(http_get(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  // Most of this request is never read; the answer must still arrive whole (no reset on close).
  const std::string huge = "GET /metrics HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n";
  const std::string too_large = http_get(port, huge);
  EXPECT_EQ(too_large.rfind("HTTP/1.1 431", 0), 0u) << too_large;
  EXPECT_NE(too_large.find("\r\n\r\nrequest headers too large\n"), std::string::npos) << too_large;
  // A client that connects and says nothing is closed after http_timeout_s, others still served.
  const int silent = raw_connect(port);
  ASSERT_GE(silent, 0);
  EXPECT_EQ(http_get(port, "GET /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_TRUE(closed_by_peer(silent, 5));
  ::close(silent);
}

// At most 16 scrape connections are held at once; a flood of silent clients gets the rest closed
// unanswered at once (so it cannot exhaust the coordinator's descriptors), and scrapes are served
// again once the silent ones time out.
TEST(ControlMetricsHttp, AFloodOfSilentClientsIsBoundedAndScrapesResumeAfterTheirTimeout) {
  LocalJob job(1, 0, [](CoordinatorOptions& o) {
    o.metrics = true;
    o.http_timeout_s = 3;
  });
  const uint16_t port = job.coord->metrics_endpoint()->port;
  std::vector<int> silent;
  for (int i = 0; i < 24; ++i) {
    silent.push_back(raw_connect(port));
    ASSERT_GE(silent.back(), 0);
  }
  std::vector<bool> closed(silent.size());
  auto closed_count = [&] {
    for (size_t i = 0; i < silent.size(); ++i) {
      if (!closed[i]) closed[i] = closed_by_peer(silent[i], 0.01);
    }
    return std::count(closed.begin(), closed.end(), true);
  };
  EXPECT_TRUE(eventually([&] { return closed_count() >= 8; }, 2)) << closed_count() << " closed";
  EXPECT_EQ(closed_count(), 8) << "the 16 held connections must wait for their timeout";
  EXPECT_EQ(http_get(port, "GET /metrics HTTP/1.1\r\n\r\n", 1), "") << "a 17th connection is closed unanswered";
  EXPECT_TRUE(eventually([&] { return http_get(port, "GET /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0) == 0; }, 10));
  EXPECT_EQ(closed_count(), 24);
  for (int fd : silent) ::close(fd);
}

// The Prometheus project's Python client (prometheus_client, pinned in requirements.txt) scrapes a
// live coordinator over HTTP with urllib and parses the text with its own parser: every family is a
// gauge with help, every rank's series carries its rank, host and role, and values arrive as the
// trainers reported them, NaN and Inf included, with a host name that needs escaping intact.
TEST(ControlMetricsHttp, PrometheusClientParserReadsEveryRanksSeries) {
  LogSink log;
  const Secret secret = generate_secret();
  CoordinatorOptions o = fast_coordinator(2, secret, log);
  o.metrics = true;
  Coordinator coord(o);
  const std::string odd_host = "we\"ird\\host\nx";
  Agents agents(2, 2, secret, log, coord.endpoint(), [&](AgentOptions& a) {
    if (a.rank == 1) a.host = odd_host;
  });
  agents[0].report(7, 1, 2, {{"train_loss", 2.5}, {"tokens_per_s", std::nan("")}, {"eval/ce-loss", 3.25}});
  agents[1].report(5, 1, 3, {{"train_loss", 2.75}, {"logit_bytes_per_s", INFINITY}});
  ASSERT_TRUE(eventually([&] {
    const auto r = coord.ranks();
    return r[0].step == 7 && r[1].step == 5 && !r[0].metrics.empty() && !r[1].metrics.empty();
  }, 10));

  const std::string url = "http://127.0.0.1:" + std::to_string(coord.metrics_endpoint()->port) + "/metrics";
  deepen::test::TestProcess parse(
      {deepen::test::kPython, std::string(deepen::test::kSourceDir) + "/tests/control/prometheus_client_scrape.py",
       "--url", url},
      {}, "prometheus_client");
  ASSERT_EQ(parse.wait_exit(60), 0) << parse.err();
  const auto read = nlohmann::json::parse(parse.out());
  EXPECT_EQ(read["status"], 200);
  EXPECT_EQ(read["content_type"].get<std::string>().rfind("text/plain; version=0.0.4", 0), 0u) << read["content_type"];

  std::map<std::string, std::map<std::string, nlohmann::json>> series;  // family -> rank ("" = job) -> labels
  std::map<std::string, std::map<std::string, double>> value;           // family -> rank -> value
  for (const auto& f : read["families"]) {
    const std::string name = f["name"];
    // The coordinator's own counters (prometheus_client names a counter family without "_total").
    EXPECT_EQ(f["type"], name.rfind("deepen_control_", 0) == 0 ? "counter" : "gauge") << name;
    EXPECT_FALSE(f["help"].get<std::string>().empty()) << name;
    for (const auto& s : f["samples"]) {
      const std::string rank = s["labels"].value("rank", "");
      series[name][rank] = s["labels"];
      value[name][rank] = std::stod(s["value"].get<std::string>());
    }
  }
  EXPECT_EQ(value["deepen_world_size"][""], 2);
  EXPECT_TRUE(series.count("deepen_control_connections")) << "the coordinator's counters were not parsed";
  EXPECT_EQ(value["deepen_ranks_connected"][""], 2);
  EXPECT_EQ(value["deepen_step"]["0"], 7);
  EXPECT_EQ(value["deepen_step"]["1"], 5);
  EXPECT_EQ(value["deepen_active_depth"]["1"], 3);
  EXPECT_EQ(value["deepen_train_loss"]["0"], 2.5);
  EXPECT_EQ(value["deepen_train_loss"]["1"], 2.75);
  EXPECT_EQ(value["deepen_eval_ce_loss"]["0"], 3.25);
  EXPECT_TRUE(std::isnan(value["deepen_tokens_per_s"]["0"]));
  EXPECT_TRUE(std::isinf(value["deepen_logit_bytes_per_s"]["1"]));
  EXPECT_EQ(series["deepen_step"]["1"]["host"], odd_host);
  EXPECT_EQ(series["deepen_step"]["1"]["role"], "student 1");
  EXPECT_EQ(series["deepen_step"]["0"]["host"], "host-0");
}

}  // namespace
}  // namespace deepen::control
