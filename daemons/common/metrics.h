// Metrics that each daemon exposes on /metrics, in the Prometheus text
// exposition format, version 0.0.4.
//
// Glossary:
//   family  - all series sharing one metric name; it has one HELP text and one
//             TYPE (counter, gauge or histogram).
//   series  - one family member, identified by its label set.
//
// Example:
//   MetricsRegistry registry;                        // built in main()
//   Counter* rpcs = registry.counter("capstan_rpcs_total", "RPCs served.",
//                                    {{"method", "fetch"}});
//   rpcs->inc();                                     // any thread, lock-free
//   http.handle("/metrics", [&registry] {
//     return HttpResponse{200, std::string(kPrometheusContentType),
//                         registry.render()};
//   });
//
// renders
//   # HELP capstan_rpcs_total RPCs served.
//   # TYPE capstan_rpcs_total counter
//   capstan_rpcs_total{method="fetch"} 1

#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>
#include "capstan/phases.h"
#include "sync/mutex.h"

namespace capstan::daemon {

// The Content-Type that Prometheus expects for render()'s output.
inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// A monotonically increasing value. Thread-safe and lock-free.
class Counter {
 public:
  // "v" must be non-negative: a counter only goes up (Prometheus detects
  // restarts by seeing it go down).
  void inc(double v = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down. Thread-safe and lock-free.
class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into buckets by upper bound (Prometheus' cumulative
// histogram: NAME_bucket{le="..."}, NAME_sum, NAME_count). Thread-safe and
// lock-free; observe() is a few relaxed atomic adds.
class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, ascending and finite; a +Inf bucket
  // is implied.
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf (== count)
    double sum = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> bounds_;
  const std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1
  std::atomic<double> sum_{0};
};

// Bucket bounds for latencies in seconds, 50 us to 10 s, three per decade.
const std::vector<double>& latency_buckets_seconds();

// Owns every Counter, Gauge and Histogram of a daemon and renders them.
//
// MetricsRegistry is thread-safe: registration and render() serialize on an
// internal mutex; the returned Counter/Gauge are updated without it.
//
// Names must match [a-zA-Z_:][a-zA-Z0-9_:]*; label names follow Prometheus'
// stricter [a-zA-Z_][a-zA-Z0-9_]* (no colon) and must not repeat within one
// series. Label order does not matter: {a,b} and {b,a} name the same series.
class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Returns the series for name+labels, creating it (at 0) on first use. The
  // pointer is owned by the registry and valid for its lifetime. The HELP text
  // of the first registration of a name wins.
  // Throws std::invalid_argument for a bad metric or label name, or a label
  // name repeated; std::logic_error if "name" is registered with another type.
  Counter* counter(std::string_view name, std::string_view help,
                   MetricLabels labels = {});
  Gauge* gauge(std::string_view name, std::string_view help,
               MetricLabels labels = {});
  // `bounds` as Histogram's; the first registration of a name sets them for
  // the family. The label "le" is the bucket's and may not be given.
  Histogram* histogram(std::string_view name, std::string_view help, MetricLabels labels = {},
                       const std::vector<double>& bounds = latency_buckets_seconds());

  // A gauge without labels whose value "fn" computes at each render() (e.g.
  // uptime). "fn" runs on the thread calling render(), without the registry's
  // lock held, so it may use the registry; it must be thread-safe if render()
  // is called from several threads. If it throws, the value renders as NaN.
  // Throws std::logic_error if "name" is already registered (of any type).
  void callback_gauge(std::string_view name, std::string_view help,
                      std::function<double()> fn);
  // The same for a counter: "fn" must never go down (a total another
  // component keeps, read at each render()).
  void callback_counter(std::string_view name, std::string_view help,
                        std::function<double()> fn);

  // All families in registration order, series sorted by label set.
  std::string render() const;

 private:
  enum class Kind { kCounter, kGauge, kCallbackGauge, kCallbackCounter, kHistogram };
  void add_callback(std::string_view name, std::string_view help, Kind kind, std::function<double()> fn);
  struct Family;

  // Finds or creates the family "name" of "kind"; throws on a type conflict.
  Family& family(std::string_view name, std::string_view help, Kind kind)
      EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  mutable Mutex mutex_;
  // Families in registration order; never removed, so Counter/Gauge pointers
  // stay valid.
  std::vector<std::unique_ptr<Family>> families_ GUARDED_BY(mutex_);
  std::unordered_map<std::string, Family*> by_name_ GUARDED_BY(mutex_);
};

// A callback for callback_counter/callback_gauge that reads one atomic
// field of a component's statistics (kept alive by the callback):
//   metrics.callback_counter("capstan_ps_reads_total", "...", stat_reader(store.stats(), &Stats::reads));
template <typename Stats>
std::function<double()> stat_reader(std::shared_ptr<const Stats> stats, const std::atomic<int64_t> Stats::*field) {
  return [stats = std::move(stats), field]() { return static_cast<double>(((*stats).*field).load()); };
}

// Where steps' time went (capstan/phases.h) as one histogram family, a
// series per phase: NAME{LABELS..., phase="queued"|"input"|"ps"|"compute"|
// "all-reduce"} in seconds ("queued" only where a caller measures it).
// Thread-safe; observe() is lock-free.
class PhaseHistograms {
 public:
  PhaseHistograms(MetricsRegistry& registry, std::string_view name, std::string_view help,
                  const MetricLabels& labels = {});
  // One step's phases; queued only when `with_queued`.
  void observe(const PhaseTimes& times, bool with_queued = false);

 private:
  Histogram* queued_;
  Histogram* input_;
  Histogram* ps_;
  Histogram* compute_;
  Histogram* collective_;
};

// Prometheus' standard process metrics, read from /proc/self at each
// render(): process_cpu_seconds_total, process_resident_memory_bytes,
// process_virtual_memory_bytes, process_open_fds, process_max_fds and
// process_start_time_seconds (when this was called, unix time).
void register_process_metrics(MetricsRegistry& registry);
// Two of them, read now: CPU seconds (user + system) and resident bytes.
double process_cpu_seconds();
double process_resident_memory_bytes();

}  // namespace capstan::daemon
