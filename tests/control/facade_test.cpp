// The ControlPlane facade the trainer uses: host, connect, report, a coordinated stop, requeue exit.
#include <gtest/gtest.h>

#include <csignal>

#include "config/input_error.h"
#include "dist/control/control_plane.h"
#include "dist/control/stop_signals.h"
#include "tests/control/control_test_util.h"

namespace deepen::control {
namespace {

using deepen::test::eventually;

TEST(ControlPlaneFacade, HostConnectReportStopAndRequeueExitWithoutAbort) {
  ControlConfig cfg;
  cfg.heartbeat_s = 0.05;
  cfg.watchdog_s = 2;
  cfg.metrics_port = 0;
  const Secret secret = generate_secret();
  ControlOptions o0 = control_options(cfg, 0, 2, secret), o1 = control_options(cfg, 1, 2, secret);
  for (auto* o : {&o0, &o1}) {
    o->coordinator_bind = "127.0.0.1";
    o->handle_signals = false;
    o->hard_exit_after_s = -1;
  }
  o0.metrics = true;  // metrics_port 0 in the config means off; tests ask for a free port directly
  ControlPlane p0(o0), p1(o1);
  const Endpoint ep = p0.host_coordinator();
  EXPECT_EQ(ep.host, "127.0.0.1");
  EXPECT_NE(ep.port, 0);
  ASSERT_TRUE(p0.metrics_endpoint().has_value());
  p0.connect(ep);
  p1.connect(ep);
  p0.report(3, 0, 1, {{"train_loss", 2.0}});
  p1.report(3, 0, 1, {{"train_loss", 2.0}});
  EXPECT_EQ(p0.stop_step(3), std::nullopt);
  EXPECT_EQ(p1.stop_step(3), std::nullopt);
  p1.request_stop("test");
  ASSERT_TRUE(eventually([&] { return p0.coordinator()->stop_step().has_value(); }, 10));
  EXPECT_EQ(p0.stop_step(4), 4) << "both had begun step 3, so they stop once 4 are complete";
  EXPECT_EQ(p1.stop_step(4), 4);
  p1.shutdown(kExitRequeue);
  p0.shutdown(kExitRequeue);
  EXPECT_FALSE(p0.aborted().has_value());
  EXPECT_FALSE(p1.aborted().has_value());
}

// A stop signal before the control plane exists (a rank still loading) is kept, not fatal, and the
// control plane, once connected, turns it into a coordinated stop at the first step.
TEST(ControlPlaneFacade, StopSignalBeforeTheControlPlaneStartsBecomesACoordinatedStop) {
  catch_early_stop_signals();
  std::raise(SIGUSR1);  // the default action would end this test process here
  ControlConfig cfg;
  cfg.heartbeat_s = 0.05;
  cfg.watchdog_s = 2;
  ControlOptions o = control_options(cfg, 0, 1, generate_secret());
  o.coordinator_bind = "127.0.0.1";
  o.handle_signals = true;
  o.hard_exit_after_s = -1;
  {
    ControlPlane p(o);
    p.connect(p.host_coordinator());
    ASSERT_TRUE(eventually([&] { return p.coordinator()->stop_step().has_value(); }, 10));
    EXPECT_EQ(p.stop_step(0), 0) << "stopped before any step: at the first";
    p.shutdown(kExitRequeue);
  }
  EXPECT_EQ(take_early_stop_signal(), 0) << "taken once, by the control plane";
  std::signal(SIGUSR1, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

}  // namespace
}  // namespace deepen::control
