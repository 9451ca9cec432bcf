// WorkerTimes: where the workers' time goes and which of them is slow.
// Every closure and synchronous step that ends is recorded here with the
// worker's phases (capstan/phases.h) and the time the coordinator waited
// for it; from those come each worker's phase totals and its straggler
// score: its busy time per run of the function it runs most, averaged over
// the last seconds (a run's weight decays with its age), relative to the
// median worker's (1 is typical; 2 takes twice as long). Averaged over
// time rather than over runs, a worker stopped in bursts shows: between
// the bursts it runs many fast runs, and a per-run average forgets the
// slow one among them at once.
// Busy time is the run's time less its collectives: in a synchronous step
// the fast replicas wait in the all-reduce for the slow one, so their
// step time is the slow one's, but their busy time is not.
// A run still in flight counts once it has taken longer than its worker's
// average (a worker stopped mid-run climbs at once). A worker that stays
// above `straggler_score` for `named_after` is named in the log, once
// until it recovers (stays below for twice as long) (NVIDIA's straggler detection and PyTorch's flight
// recorder name ranks the same way; TF names nothing).
//
// Example:
//   WorkerTimes times(log);
//   int64_t ticket = times.begin(/*task=*/2, /*runs=*/1);
//   ... the run ends ...
//   times.end(ticket, "train_step", outcome.phases);
//   times.rows();   // per worker: runs, phase totals, score
//
// Thread-safe: the loop thread records; the status page and /metrics read.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_WORKER_TIMES_H_
#define CAPSTAN_DAEMONS_COORDINATOR_WORKER_TIMES_H_

#include <spdlog/logger.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capstan/phases.h"
#include "sync/mutex.h"

namespace capstan::coordinator {

class WorkerTimes {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    // The average weighs each run by how recent it is: a run this long ago
    // counts 1/e as much as one now.
    std::chrono::milliseconds smoothing{5000};
    double straggler_score = 1.5;   // at or above: slow
    std::chrono::milliseconds named_after{5000};  // slow this long: logged
    int min_runs = 3;               // runs of a worker before it has a score
    std::chrono::seconds history{600};            // the status page's plots
  };
  struct Row {
    int task = 0;
    int64_t runs = 0;
    PhaseTimes totals;                 // queued included
    double busy = 0;                   // smoothed busy seconds per run
    std::optional<double> score;       // none until min_runs
    bool straggler = false;            // named in the log
  };

  // `log` may be null (nothing named).
  explicit WorkerTimes(std::shared_ptr<spdlog::logger> log);
  WorkerTimes(std::shared_ptr<spdlog::logger> log, Options options);

  // A dispatch of `runs` closures (a batch) or one step to worker `task`
  // begins; `queued` is how long each waited at the coordinator (summed).
  // A synchronous step's (`step`) time in flight does not count: every
  // replica waits as long as the slowest, and which one that is shows only
  // when the phases come back.
  int64_t begin(int task, int runs, double queued = 0, Clock::time_point now = Clock::now(), bool step = false)
      LOCKS_EXCLUDED(mutex_);
  // One of its runs ended with a value: `function`, the worker's phases.
  // The last one's end (or abandon()) closes the ticket; the runs of a
  // batch share the wait equally.
  void end(int64_t ticket, const std::string& function, const PhaseTimes& phases,
           Clock::time_point now = Clock::now()) LOCKS_EXCLUDED(mutex_);
  // A batch's runs that ended with a value, at once (`function`, phases);
  // closes the ticket (the others ended without one).
  void end_batch(int64_t ticket, const std::vector<std::pair<const std::string*, PhaseTimes>>& values,
                 Clock::time_point now = Clock::now()) LOCKS_EXCLUDED(mutex_);
  // A run that ended without a value (failed, lost): nothing recorded.
  void abandon(int64_t ticket) LOCKS_EXCLUDED(mutex_);
  // The dispatch is over, whatever runs of it did not end.
  void close(int64_t ticket) LOCKS_EXCLUDED(mutex_);
  // Called with each run recorded (its queued time included), under this
  // object's lock: /metrics' histograms. Set before the first run.
  void set_observer(std::function<void(int task, const PhaseTimes& phases)> observer) LOCKS_EXCLUDED(mutex_);
  // The worker left: its row stays in the totals, without a score.
  void forget(int task) LOCKS_EXCLUDED(mutex_);

  // Per worker known now, by task index; scores as of `now` (names a
  // straggler in the log when one is due).
  std::vector<Row> rows(Clock::time_point now = Clock::now()) LOCKS_EXCLUDED(mutex_);
  // Every run's phases, of every worker ever seen.
  PhaseTimes totals() const LOCKS_EXCLUDED(mutex_);

  // For the status page: takes a sample of each worker's score, busy time
  // and runs per second since the last sample (call once per period) and
  // returns the kept history: a series per quantity, a line per worker
  // ("straggler score by worker": "worker 2": [(unix s, v)...]).
  struct Line {
    std::string label;
    std::vector<std::pair<double, double>> points;
  };
  struct Series {
    std::string title;
    std::vector<Line> lines;
  };
  std::vector<Series> sample(Clock::time_point now = Clock::now()) LOCKS_EXCLUDED(mutex_);

 private:
  // Sums whose terms decay with their age (Options::smoothing).
  struct Average {
    int64_t runs = 0;        // not decayed
    double weight = 0;       // runs, decayed
    double busy_sum = 0;     // their busy seconds, decayed
    Clock::time_point last;  // when the sums were last decayed
    double busy() const { return weight > 0 ? busy_sum / weight : 0; }
  };
  struct Task {
    int64_t runs = 0;
    PhaseTimes totals;
    std::map<std::string, Average> by_function;
    bool present = true;
    std::optional<Clock::time_point> slow_since;
    std::optional<Clock::time_point> fast_since;  // named, and below since
    bool named = false;
    std::deque<std::pair<double, double>> busy_points, score_points, rate_points;
    int64_t sampled_runs = 0;                  // runs at the last sample
    std::optional<Clock::time_point> sampled;  // when
  };
  struct Ticket {
    int task = 0;
    int runs = 1;
    int ended = 0;
    double queued = 0;
    Clock::time_point since;
    bool step = false;
  };
  // A run of `run` ended with a value.
  void record(const Ticket& run, const std::string& function, const PhaseTimes& phases, Clock::time_point now)
      EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The function most runs were of (the training step).
  std::string main_function() const EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void score_all(Clock::time_point now, std::map<int, std::optional<double>>* scores,
                 std::map<int, double>* busy) EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const std::shared_ptr<spdlog::logger> log_;
  const Options options_;
  mutable Mutex mutex_;
  std::map<int, Task> tasks_ GUARDED_BY(mutex_);
  std::map<int64_t, Ticket> tickets_ GUARDED_BY(mutex_);
  std::map<std::string, int64_t> function_runs_ GUARDED_BY(mutex_);
  PhaseTimes totals_ GUARDED_BY(mutex_);
  int64_t next_ticket_ GUARDED_BY(mutex_) = 1;
  std::function<void(int, const PhaseTimes&)> observer_ GUARDED_BY(mutex_);
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_WORKER_TIMES_H_
