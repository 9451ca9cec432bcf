#include "daemons/common/metrics.h"
#include "sync/mutex.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <fstream>
#include <limits>
#include <sstream>
#include <charconv>
#include <cmath>
#include <map>
#include <stdexcept>

namespace capstan::daemon {
namespace {

bool is_valid_name(std::string_view name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (allow_colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

void check_metric_name(std::string_view name) {
  if (!is_valid_name(name, /*allow_colon=*/true)) {
    throw std::invalid_argument("invalid metric name '" + std::string(name) +
                                "'");
  }
}

// Sorts "labels" by name so that label order does not make a new series, and
// validates them.
MetricLabels canonical_labels(std::string_view metric, MetricLabels labels) {
  std::sort(labels.begin(), labels.end());
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string& label = labels[i].first;
    if (!is_valid_name(label, /*allow_colon=*/false)) {
      throw std::invalid_argument("invalid label name '" + label +
                                  "' for metric '" + std::string(metric) + "'");
    }
    if (i > 0 && labels[i - 1].first == label) {
      throw std::invalid_argument("label '" + label + "' repeated for metric '" +
                                  std::string(metric) + "'");
    }
  }
  return labels;
}

// Escapes backslash and newline (HELP text), and also the double quote when
// "quote" (label values), as the exposition format requires.
void append_escaped(std::string& out, std::string_view text, bool quote) {
  for (char c : text) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '"':
        out += quote ? "\\\"" : "\"";
        break;
      default: out += c;
    }
  }
}

std::string render_labels(const MetricLabels& labels) {
  if (labels.empty()) return {};
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ',';
    out += labels[i].first;
    out += "=\"";
    append_escaped(out, labels[i].second, /*quote=*/true);
    out += '"';
  }
  out += '}';
  return out;
}

void append_value(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
    return;
  }
  char buf[64];
  std::to_chars_result r;
  // Integers print in full (no exponent, no decimal point) while exactly
  // representable; anything else in the shortest form that round-trips.
  constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53
  if (v == std::trunc(v) && std::fabs(v) <= kMaxExactInteger) {
    r = std::to_chars(buf, buf + sizeof(buf), v == 0 ? 0.0 : v,
                      std::chars_format::fixed);
  } else {
    r = std::to_chars(buf, buf + sizeof(buf), v);
  }
  assert(r.ec == std::errc());
  out.append(buf, r.ptr);
}

// NAME_bucket{labels,le="bound"} per bound and +Inf, NAME_sum, NAME_count.
void render_histogram(std::string& out, const std::string& name, const MetricLabels& labels,
                      const Histogram::Snapshot& h) {
  for (size_t i = 0; i < h.cumulative.size(); ++i) {
    MetricLabels with_le = labels;
    std::string le;
    if (i < h.bounds.size()) {
      append_value(le, h.bounds[i]);
    } else {
      le = "+Inf";
    }
    with_le.emplace_back("le", le);
    out += name + "_bucket" + render_labels(with_le) + ' ';
    append_value(out, static_cast<double>(h.cumulative[i]));
    out += '\n';
  }
  out += name + "_sum" + render_labels(labels) + ' ';
  append_value(out, h.sum);
  out += '\n' + name + "_count" + render_labels(labels) + ' ';
  append_value(out, static_cast<double>(h.cumulative.back()));
  out += '\n';
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1])) {
      throw std::invalid_argument("histogram bounds must be finite and ascending");
    }
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double v) {
  // The first bound that holds v; the +Inf bucket past the last.
  const size_t bucket = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot out;
  out.bounds = bounds_;
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    out.cumulative.push_back(total);
  }
  out.sum = sum_.load(std::memory_order_relaxed);
  return out;
}

const std::vector<double>& latency_buckets_seconds() {
  static const std::vector<double> bounds = {0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01,
                                             0.02,    0.05,   0.1,    0.2,    0.5,   1,     2,     5, 10};
  return bounds;
}

void Counter::inc(double v) {
  assert(v >= 0 && "Counter::inc with a negative value");
  value_.fetch_add(v, std::memory_order_relaxed);
}

struct MetricsRegistry::Family {
  std::string name;
  std::string help;
  Kind kind;
  // kCounter / kGauge: series by canonical label set. std::map keeps them in
  // label order for render(); nodes are never removed.
  std::map<MetricLabels, std::unique_ptr<Counter>> counters;
  std::map<MetricLabels, std::unique_ptr<Gauge>> gauges;
  // kHistogram: series by label set, all with `bounds`.
  std::map<MetricLabels, std::unique_ptr<Histogram>> histograms;
  std::vector<double> bounds;
  // kCallbackGauge only. Shared so that render() can call it unlocked.
  std::shared_ptr<const std::function<double()>> callback;
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

MetricsRegistry::Family& MetricsRegistry::family(std::string_view name,
                                                 std::string_view help,
                                                 Kind kind) {
  auto it = by_name_.find(std::string(name));
  if (it != by_name_.end()) {
    if (it->second->kind != kind) {
      throw std::logic_error("metric '" + std::string(name) +
                             "' is already registered with another type");
    }
    return *it->second;
  }
  auto family = std::make_unique<Family>();
  family->name = std::string(name);
  family->help = std::string(help);
  family->kind = kind;
  Family* raw = family.get();
  families_.push_back(std::move(family));
  by_name_.emplace(raw->name, raw);
  return *raw;
}

Counter* MetricsRegistry::counter(std::string_view name, std::string_view help,
                                  MetricLabels labels) {
  check_metric_name(name);
  labels = canonical_labels(name, std::move(labels));
  MutexLock lock(mutex_);
  std::unique_ptr<Counter>& series =
      family(name, help, Kind::kCounter).counters[std::move(labels)];
  if (!series) series = std::make_unique<Counter>();
  return series.get();
}

Gauge* MetricsRegistry::gauge(std::string_view name, std::string_view help,
                              MetricLabels labels) {
  check_metric_name(name);
  labels = canonical_labels(name, std::move(labels));
  MutexLock lock(mutex_);
  std::unique_ptr<Gauge>& series =
      family(name, help, Kind::kGauge).gauges[std::move(labels)];
  if (!series) series = std::make_unique<Gauge>();
  return series.get();
}

Histogram* MetricsRegistry::histogram(std::string_view name, std::string_view help, MetricLabels labels,
                                      const std::vector<double>& bounds) {
  check_metric_name(name);
  labels = canonical_labels(name, std::move(labels));
  for (const auto& [label, value] : labels) {
    if (label == "le") throw std::invalid_argument("label 'le' is the bucket's, for histogram '" + std::string(name) + "'");
  }
  MutexLock lock(mutex_);
  Family& f = family(name, help, Kind::kHistogram);
  auto it = f.histograms.find(labels);
  if (it != f.histograms.end()) return it->second.get();
  // Built (and its bounds checked) before anything is stored.
  auto made = std::make_unique<Histogram>(f.bounds.empty() ? bounds : f.bounds);
  if (f.bounds.empty()) f.bounds = bounds;
  Histogram* series = made.get();
  f.histograms.emplace(std::move(labels), std::move(made));
  return series;
}

void MetricsRegistry::callback_gauge(std::string_view name,
                                     std::string_view help,
                                     std::function<double()> fn) {
  add_callback(name, help, Kind::kCallbackGauge, std::move(fn));
}

void MetricsRegistry::callback_counter(std::string_view name,
                                       std::string_view help,
                                       std::function<double()> fn) {
  add_callback(name, help, Kind::kCallbackCounter, std::move(fn));
}

void MetricsRegistry::add_callback(std::string_view name, std::string_view help,
                                   Kind kind, std::function<double()> fn) {
  check_metric_name(name);
  if (!fn) {
    throw std::invalid_argument("callback gauge '" + std::string(name) +
                                "' has no function");
  }
  MutexLock lock(mutex_);
  if (by_name_.count(std::string(name)) != 0) {
    throw std::logic_error("metric '" + std::string(name) +
                           "' is already registered");
  }
  family(name, help, kind).callback =
      std::make_shared<const std::function<double()>>(std::move(fn));
}

std::string MetricsRegistry::render() const {
  // Snapshot under the lock, format after: callbacks must run unlocked, and
  // the series objects outlive the registry's lock anyway (never removed).
  struct Series {
    std::string labels;
    const Counter* counter = nullptr;
    const Gauge* gauge = nullptr;
    const Histogram* histogram = nullptr;
    MetricLabels histogram_labels;
  };
  struct FamilySnapshot {
    const Family* family;  // name, help and kind are constant once created
    std::vector<Series> series;
    std::shared_ptr<const std::function<double()>> callback;
  };
  std::vector<FamilySnapshot> snapshot;
  {
    MutexLock lock(mutex_);
    snapshot.reserve(families_.size());
    for (const std::unique_ptr<Family>& f : families_) {
      FamilySnapshot& s = snapshot.emplace_back();
      s.family = f.get();
      s.callback = f->callback;
      for (const auto& [labels, c] : f->counters) {
        s.series.push_back({render_labels(labels), c.get(), nullptr, nullptr, {}});
      }
      for (const auto& [labels, g] : f->gauges) {
        s.series.push_back({render_labels(labels), nullptr, g.get(), nullptr, {}});
      }
      for (const auto& [labels, h] : f->histograms) {
        s.series.push_back({render_labels(labels), nullptr, nullptr, h.get(), labels});
      }
    }
  }

  std::string out;
  for (const FamilySnapshot& s : snapshot) {
    const Family& f = *s.family;
    out += "# HELP ";
    out += f.name;
    out += ' ';
    append_escaped(out, f.help, /*quote=*/false);
    out += "\n# TYPE ";
    out += f.name;
    out += f.kind == Kind::kCounter || f.kind == Kind::kCallbackCounter ? " counter\n"
           : f.kind == Kind::kHistogram                                ? " histogram\n"
                                                                       : " gauge\n";
    if (s.callback) {
      double v;
      try {
        v = (*s.callback)();
      } catch (...) {
        v = std::nan("");
      }
      out += f.name;
      out += ' ';
      append_value(out, v);
      out += '\n';
    }
    for (const Series& series : s.series) {
      if (series.histogram != nullptr) {
        render_histogram(out, f.name, series.histogram_labels, series.histogram->snapshot());
        continue;
      }
      out += f.name;
      out += series.labels;
      out += ' ';
      append_value(out, series.counter != nullptr ? series.counter->value()
                                                  : series.gauge->value());
      out += '\n';
    }
  }
  return out;
}

namespace {

// Fields 14 and 15 (utime, stime, in clock ticks) of /proc/self/stat; the
// command name (field 2) may hold spaces, so parsing starts after its ')'.
double cpu_seconds() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nan("");
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Field `index` (0: size, 1: resident) of /proc/self/statm, in bytes.
double statm_bytes(int index) {
  std::ifstream in("/proc/self/statm");
  double pages[2] = {0, 0};
  if (!(in >> pages[0] >> pages[1])) return std::nan("");
  return pages[index] * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

double open_fds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return std::nan("");
  double count = 0;
  while (struct dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count - 1;  // the directory stream's own descriptor
}

double max_fds() {
  struct rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return std::nan("");
  return limit.rlim_cur == RLIM_INFINITY ? std::numeric_limits<double>::infinity()
                                         : static_cast<double>(limit.rlim_cur);
}

}  // namespace

double process_cpu_seconds() { return cpu_seconds(); }
double process_resident_memory_bytes() { return statm_bytes(1); }

void register_process_metrics(MetricsRegistry& registry) {
  const double started = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  registry.callback_counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                            cpu_seconds);
  registry.callback_gauge("process_resident_memory_bytes", "Resident memory size in bytes.",
                          [] { return statm_bytes(1); });
  registry.callback_gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                          [] { return statm_bytes(0); });
  registry.callback_gauge("process_open_fds", "Number of open file descriptors.", open_fds);
  registry.callback_gauge("process_max_fds", "Maximum number of open file descriptors.", max_fds);
  registry.callback_gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                          [started] { return started; });
}

PhaseHistograms::PhaseHistograms(MetricsRegistry& registry, std::string_view name, std::string_view help,
                                 const MetricLabels& labels) {
  auto series = [&](const char* phase) {
    MetricLabels with = labels;
    with.emplace_back("phase", phase);
    return registry.histogram(name, help, std::move(with));
  };
  queued_ = series("queued");
  input_ = series("input");
  ps_ = series("ps");
  compute_ = series("compute");
  collective_ = series("all-reduce");
}

void PhaseHistograms::observe(const PhaseTimes& times, bool with_queued) {
  if (with_queued) queued_->observe(times.queued);
  input_->observe(times.input);
  ps_->observe(times.ps);
  compute_->observe(times.compute());
  collective_->observe(times.collective);
}

}  // namespace capstan::daemon
