#include "daemons/common/metrics.h"

#include <catch2/catch.hpp>
#include <atomic>

#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

namespace capstan::daemon {
namespace {

TEST_CASE("MetricsRegistry renders counters, gauges and callbacks exactly",
          "[metrics]") {
  MetricsRegistry registry;
  registry.counter("rpcs_total", "RPCs served.", {{"method", "fetch"}})->inc(3);
  registry.counter("rpcs_total", "ignored", {{"method", "apply"}})->inc();
  Gauge* queue = registry.gauge("queue_depth", "Items waiting.");
  queue->set(2.5);
  queue->add(-1);
  registry.callback_gauge("uptime_seconds", "Seconds since start.",
                          [] { return 12.25; });
  registry.gauge("temperature", "Degrees.", {{"zone", "b"}, {"rack", "1"}})
      ->set(-0.1);

  CHECK(registry.render() ==
        "# HELP rpcs_total RPCs served.\n"
        "# TYPE rpcs_total counter\n"
        "rpcs_total{method=\"apply\"} 1\n"
        "rpcs_total{method=\"fetch\"} 3\n"
        "# HELP queue_depth Items waiting.\n"
        "# TYPE queue_depth gauge\n"
        "queue_depth 1.5\n"
        "# HELP uptime_seconds Seconds since start.\n"
        "# TYPE uptime_seconds gauge\n"
        "uptime_seconds 12.25\n"
        "# HELP temperature Degrees.\n"
        "# TYPE temperature gauge\n"
        "temperature{rack=\"1\",zone=\"b\"} -0.1\n");
}

TEST_CASE("A histogram renders cumulative buckets with le, the sum and the count", "[metrics][histogram]") {
  MetricsRegistry registry;
  Histogram* h = registry.histogram("capstan_x_seconds", "Latency.", {{"method", "Ps.pull"}}, {1, 2, 4});
  for (double v : {0.5, 1.0, 1.5, 3.0, 8.0, 100.0}) h->observe(v);
  CHECK(registry.histogram("capstan_x_seconds", "Latency.", {{"method", "Ps.pull"}}) == h);
  const std::string text = registry.render();
  CHECK(text ==
        "# HELP capstan_x_seconds Latency.\n"
        "# TYPE capstan_x_seconds histogram\n"
        "capstan_x_seconds_bucket{method=\"Ps.pull\",le=\"1\"} 2\n"
        "capstan_x_seconds_bucket{method=\"Ps.pull\",le=\"2\"} 3\n"
        "capstan_x_seconds_bucket{method=\"Ps.pull\",le=\"4\"} 4\n"
        "capstan_x_seconds_bucket{method=\"Ps.pull\",le=\"+Inf\"} 6\n"
        "capstan_x_seconds_sum{method=\"Ps.pull\"} 114\n"
        "capstan_x_seconds_count{method=\"Ps.pull\"} 6\n");
  CHECK_THROWS_AS(registry.histogram("capstan_y", "h", {{"le", "1"}}), std::invalid_argument);
  CHECK_THROWS_AS(Histogram({0.1, 0.01}), std::invalid_argument);
  // Bad bounds leave nothing behind: /metrics still renders.
  CHECK_THROWS_AS(registry.histogram("capstan_z_seconds", "z", {}, {2, 1}), std::invalid_argument);
  CHECK_NOTHROW(registry.render());
  CHECK_THROWS_AS(registry.counter("capstan_x_seconds", "c"), std::logic_error);
}

TEST_CASE("A callback counter renders as a counter with the value its function reads", "[metrics]") {
  MetricsRegistry registry;
  std::atomic<int64_t> total{7};
  registry.callback_counter("closures_total", "Closures.", [&total] { return static_cast<double>(total.load()); });
  CHECK(registry.render() == "# HELP closures_total Closures.\n# TYPE closures_total counter\nclosures_total 7\n");
  total = 9;
  CHECK(registry.render().find("closures_total 9\n") != std::string::npos);
  CHECK_THROWS_AS(registry.callback_counter("closures_total", "again", [] { return 1.0; }), std::logic_error);
}

TEST_CASE("The process metrics read this process from /proc", "[metrics]") {
  MetricsRegistry registry;
  register_process_metrics(registry);
  std::string text = registry.render();
  auto value = [&text](const std::string& name) {
    size_t at = text.find("\n" + name + " ");
    REQUIRE(at != std::string::npos);
    return std::stod(text.substr(at + name.size() + 2));
  };
  CHECK_THAT(text, Catch::Contains("# TYPE process_cpu_seconds_total counter"));
  CHECK(value("process_cpu_seconds_total") >= 0);
  CHECK(value("process_resident_memory_bytes") > 1 << 20);
  CHECK(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
  CHECK(value("process_open_fds") >= 3);  // stdin, stdout, stderr at least
  CHECK(value("process_max_fds") >= value("process_open_fds"));
  CHECK(value("process_start_time_seconds") > 1.7e9);
}

TEST_CASE("MetricsRegistry renders an empty registry as empty text",
          "[metrics]") {
  MetricsRegistry registry;
  CHECK(registry.render().empty());
}

TEST_CASE("Metric values print integers plainly and others round-trip",
          "[metrics]") {
  MetricsRegistry registry;
  Gauge* g = registry.gauge("g", "h");
  auto line = [&registry] {
    std::string text = registry.render();
    return text.substr(text.rfind('\n', text.size() - 2) + 1);
  };
  g->set(3);
  CHECK(line() == "g 3\n");
  g->set(-0.0);
  CHECK(line() == "g 0\n");
  g->set(1e15);
  CHECK(line() == "g 1000000000000000\n");
  g->set(1e300);
  CHECK(line() == "g 1e+300\n");
  g->set(0.1 + 0.2);
  CHECK(line() == "g 0.30000000000000004\n");
  g->set(std::numeric_limits<double>::infinity());
  CHECK(line() == "g +Inf\n");
  g->set(-std::numeric_limits<double>::infinity());
  CHECK(line() == "g -Inf\n");
  g->set(std::numeric_limits<double>::quiet_NaN());
  CHECK(line() == "g NaN\n");
}

TEST_CASE("MetricsRegistry escapes label values and help text", "[metrics]") {
  MetricsRegistry registry;
  registry.counter("c", "line one\nback\\slash \"quoted\"",
                   {{"path", "a\\b\"c\nd"}});
  CHECK(registry.render() ==
        "# HELP c line one\\nback\\\\slash \"quoted\"\n"
        "# TYPE c counter\n"
        "c{path=\"a\\\\b\\\"c\\nd\"} 0\n");
}

TEST_CASE("MetricsRegistry returns the same object for the same name and labels",
          "[metrics]") {
  MetricsRegistry registry;
  Counter* a = registry.counter("c", "h", {{"x", "1"}, {"y", "2"}});
  CHECK(registry.counter("c", "h", {{"x", "1"}, {"y", "2"}}) == a);
  CHECK(registry.counter("c", "h", {{"y", "2"}, {"x", "1"}}) == a);
  CHECK(registry.counter("c", "h", {{"x", "2"}, {"y", "2"}}) != a);
  CHECK(registry.counter("c", "h") != a);
  Gauge* g = registry.gauge("g", "h");
  CHECK(registry.gauge("g", "other help") == g);
}

TEST_CASE("MetricsRegistry rejects a name registered with another type",
          "[metrics]") {
  MetricsRegistry registry;
  registry.counter("m", "h");
  CHECK_THROWS_AS(registry.gauge("m", "h"), std::logic_error);
  CHECK_THROWS_AS(registry.callback_gauge("m", "h", [] { return 1.0; }),
                  std::logic_error);
  registry.callback_gauge("cb", "h", [] { return 1.0; });
  CHECK_THROWS_AS(registry.gauge("cb", "h"), std::logic_error);
  CHECK_THROWS_AS(registry.callback_gauge("cb", "h", [] { return 2.0; }),
                  std::logic_error);
}

TEST_CASE("MetricsRegistry rejects invalid metric and label names",
          "[metrics]") {
  MetricsRegistry registry;
  CHECK_THROWS_AS(registry.counter("", "h"), std::invalid_argument);
  CHECK_THROWS_AS(registry.counter("1abc", "h"), std::invalid_argument);
  CHECK_THROWS_AS(registry.gauge("has-dash", "h"), std::invalid_argument);
  CHECK_THROWS_AS(registry.callback_gauge("sp ace", "h", [] { return 0.0; }),
                  std::invalid_argument);
  CHECK_THROWS_AS(registry.counter("ok", "h", {{"bad-label", "v"}}),
                  std::invalid_argument);
  CHECK_THROWS_AS(registry.counter("ok", "h", {{"9x", "v"}}),
                  std::invalid_argument);
  CHECK_THROWS_AS(registry.counter("ok", "h", {{"a:b", "v"}}),
                  std::invalid_argument);
  CHECK_THROWS_AS(registry.counter("ok", "h", {{"a", "1"}, {"a", "2"}}),
                  std::invalid_argument);
  CHECK_THROWS_AS(registry.callback_gauge("ok2", "h", nullptr),
                  std::invalid_argument);
  // Valid names, including colons in metric names.
  CHECK_NOTHROW(registry.counter("ns:sub_system_total", "h", {{"_l1", "v"}}));
  // Nothing half-registered is rendered.
  CHECK(registry.render() ==
        "# HELP ns:sub_system_total h\n"
        "# TYPE ns:sub_system_total counter\n"
        "ns:sub_system_total{_l1=\"v\"} 0\n");
}

TEST_CASE("Callback gauge that throws renders NaN", "[metrics]") {
  MetricsRegistry registry;
  registry.callback_gauge("broken", "h",
                          []() -> double { throw std::runtime_error("x"); });
  CHECK(registry.render() == "# HELP broken h\n# TYPE broken gauge\nbroken NaN\n");
}

TEST_CASE("Callback gauge may use the registry while rendering", "[metrics]") {
  MetricsRegistry registry;
  Counter* c = registry.counter("c", "h");
  c->inc(7);
  registry.callback_gauge("mirror", "h", [&registry] {
    return registry.counter("c", "h")->value();
  });
  CHECK(registry.render() ==
        "# HELP c h\n# TYPE c counter\nc 7\n"
        "# HELP mirror h\n# TYPE mirror gauge\nmirror 7\n");
}

TEST_CASE("Concurrent increments from several threads sum correctly",
          "[metrics]") {
  MetricsRegistry registry;
  constexpr int kThreads = 4;
  constexpr int kIncrements = 100000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&registry] {
      // Registration races with the others, and render() with the updates.
      Counter* c = registry.counter("hits_total", "h", {{"k", "v"}});
      Gauge* g = registry.gauge("level", "h");
      for (int i = 0; i < kIncrements; ++i) {
        c->inc();
        g->add(2);
        if (i % 10000 == 0) (void)registry.render();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(registry.counter("hits_total", "h", {{"k", "v"}})->value() ==
        kThreads * kIncrements);
  CHECK(registry.gauge("level", "h")->value() == 2.0 * kThreads * kIncrements);
}

}  // namespace
}  // namespace capstan::daemon
