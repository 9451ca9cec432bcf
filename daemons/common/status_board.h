// StatusBoard: what a daemon shows on its status page, `/` on its HTTP port
// (a page that reads /status.json every two seconds; no external service or
// script).
//
// Glossary:
//   plot   a quantity sampled once a second and kept for the last ten
//          minutes: a level (a gauge's value) or a rate (a counter's change
//          per second), or points the service records itself (a program's
//          reported loss).
//   table  rows the service lists (members and their health, variables and
//          their placement, jobs), rebuilt at each sample.
//
// Example (in a service's constructor):
//   ctx.status.plot("closures/s", StatusBoard::Plot::kRate, stat_reader(stats, &Stats::done));
//   ctx.status.tables([this] { return status_tables(); });   // any thread
//
// Thread-safety: every method may be called from any thread. Functions given
// to it run on the sampler thread only (from start() to stop()), so a page
// request never waits for a service (the HTTP thread also answers /healthz)
// and never runs one before start() or after stop(); json() returns what the
// last sample saw. They must be thread-safe; stop() drops them.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sync/mutex.h"

namespace capstan::daemon {

class StatusBoard {
 public:
  struct Table {
    std::string title;
    std::vector<std::string> columns;
    std::vector<std::vector<std::string>> rows;
    std::string note;  // shown under the table (e.g. "none registered yet")
  };
  // A series of (unix seconds, value) points; or, with `lines`, one plot
  // of several (e.g. one per worker, each labelled), `points` unused.
  struct Line {
    std::string label;
    std::vector<std::pair<double, double>> points;
  };
  struct Series {
    std::string title;
    std::vector<std::pair<double, double>> points;
    std::vector<Line> lines = {};
  };
  enum class Plot { kLevel, kRate };

  // `history`: how long plots keep their points; `every`: the sampling period.
  explicit StatusBoard(std::chrono::seconds history = std::chrono::seconds(600),
                       std::chrono::milliseconds every = std::chrono::milliseconds(1000));
  ~StatusBoard();  // stop()s
  StatusBoard(const StatusBoard&) = delete;
  StatusBoard& operator=(const StatusBoard&) = delete;

  // The page's heading: role, version, address and the like, in order.
  void set_facts(std::vector<std::pair<std::string, std::string>> facts) LOCKS_EXCLUDED(mutex_);
  // A fact computed at each sample (e.g. readiness).
  void fact(std::string name, std::function<std::string()> read) LOCKS_EXCLUDED(mutex_);
  // A sampled plot; `read` returns the gauge or counter value.
  void plot(std::string title, Plot kind, std::function<double()> read) LOCKS_EXCLUDED(mutex_);
  // Plots whose points the service keeps itself (read at each sample).
  void series(std::function<std::vector<Series>()> read) LOCKS_EXCLUDED(mutex_);
  // The tables, built at each sample. Replaces an earlier function.
  void tables(std::function<std::vector<Table>()> build) LOCKS_EXCLUDED(mutex_);

  // Starts the sampler thread (its first sample at once); idempotent. Call
  // once the service is up.
  void start() LOCKS_EXCLUDED(mutex_);
  // Joins the sampler and drops every function given: call before what they
  // reference goes away. Idempotent.
  void stop() LOCKS_EXCLUDED(mutex_);

  // {"facts": [[name, value]...], "plots": [{"title", "points": [[t, v]...]}...],
  //  "tables": [{"title", "columns", "rows", "note"}...]}
  std::string json() const LOCKS_EXCLUDED(mutex_);

  // The page served at `/` (static; it renders json()).
  static const std::string& page();

 private:
  // One sample: plots, facts, series and tables (the sampler thread's step).
  void sample() LOCKS_EXCLUDED(mutex_);

  struct Sampled {
    std::string title;
    Plot kind;
    std::function<double()> read;
    double last = 0;  // kRate: the previous reading
    std::chrono::steady_clock::time_point last_at;
    bool primed = false;
    std::deque<std::pair<double, double>> points;
  };

  const double history_s_;
  const std::chrono::milliseconds every_;
  mutable Mutex mutex_;
  std::vector<std::pair<std::string, std::string>> facts_ GUARDED_BY(mutex_);
  std::vector<std::pair<std::string, std::function<std::string()>>> computed_facts_ GUARDED_BY(mutex_);
  std::vector<std::shared_ptr<Sampled>> plots_ GUARDED_BY(mutex_);
  std::vector<std::function<std::vector<Series>()>> series_ GUARDED_BY(mutex_);
  std::function<std::vector<Table>()> tables_ GUARDED_BY(mutex_);
  // What the last sample read (json() serves these).
  std::vector<std::pair<std::string, std::string>> sampled_facts_ GUARDED_BY(mutex_);
  std::vector<Series> sampled_series_ GUARDED_BY(mutex_);
  std::vector<Table> sampled_tables_ GUARDED_BY(mutex_);
  bool stopping_ GUARDED_BY(mutex_) = false;
  CondVar wake_;
  std::thread sampler_;  // started by start(), joined by stop(); owning thread only
};

}  // namespace capstan::daemon
