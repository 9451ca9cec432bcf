#include "daemons/coordinator/worker_times.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace capstan::coordinator {
namespace {

double seconds_between(WorkerTimes::Clock::time_point from, WorkerTimes::Clock::time_point to) {
  return std::max(0.0, std::chrono::duration<double>(to - from).count());
}

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

WorkerTimes::WorkerTimes(std::shared_ptr<spdlog::logger> log) : WorkerTimes(std::move(log), Options{}) {}

WorkerTimes::WorkerTimes(std::shared_ptr<spdlog::logger> log, Options options)
    : log_(std::move(log)), options_(options) {}

int64_t WorkerTimes::begin(int task, int runs, double queued, Clock::time_point now, bool step) {
  MutexLock lock(mutex_);
  Task& t = tasks_[task];
  t.present = true;
  const int64_t ticket = next_ticket_++;
  tickets_[ticket] = Ticket{task, std::max(1, runs), 0, queued, now, step};
  return ticket;
}

void WorkerTimes::end(int64_t ticket, const std::string& function, const PhaseTimes& phases, Clock::time_point now) {
  MutexLock lock(mutex_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) return;
  record(it->second, function, phases, now);
  if (++it->second.ended >= it->second.runs) tickets_.erase(it);
}

void WorkerTimes::end_batch(int64_t ticket, const std::vector<std::pair<const std::string*, PhaseTimes>>& values,
                            Clock::time_point now) {
  MutexLock lock(mutex_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) return;
  for (const auto& [function, phases] : values) record(it->second, *function, phases, now);
  tickets_.erase(it);
}

void WorkerTimes::record(const Ticket& run, const std::string& function, const PhaseTimes& phases,
                         Clock::time_point now) {
  const double seconds = seconds_between(run.since, now) / run.runs;
  PhaseTimes timed = phases;
  timed.queued = run.queued / run.runs;
  Task& t = tasks_[run.task];
  ++t.runs;
  t.totals += timed;
  totals_ += timed;
  Average& average = t.by_function[function];
  const double busy = std::max(0.0, seconds - phases.collective);
  if (average.runs > 0 && now > average.last) {
    const double decay =
        std::exp(-seconds_between(average.last, now) / std::chrono::duration<double>(options_.smoothing).count());
    average.weight *= decay;
    average.busy_sum *= decay;
  }
  average.last = std::max(average.last, now);
  average.weight += 1;
  average.busy_sum += busy;
  ++average.runs;
  ++function_runs_[function];
  if (observer_) observer_(run.task, timed);
}

void WorkerTimes::set_observer(std::function<void(int, const PhaseTimes&)> observer) {
  MutexLock lock(mutex_);
  observer_ = std::move(observer);
}

void WorkerTimes::abandon(int64_t ticket) {
  MutexLock lock(mutex_);
  auto it = tickets_.find(ticket);
  if (it != tickets_.end() && ++it->second.ended >= it->second.runs) tickets_.erase(it);
}

void WorkerTimes::close(int64_t ticket) {
  MutexLock lock(mutex_);
  tickets_.erase(ticket);
}

void WorkerTimes::forget(int task) {
  MutexLock lock(mutex_);
  auto it = tasks_.find(task);
  if (it == tasks_.end()) return;
  it->second.present = false;
  it->second.slow_since.reset();
  it->second.named = false;
  for (auto t = tickets_.begin(); t != tickets_.end();) t = t->second.task == task ? tickets_.erase(t) : std::next(t);
}

std::string WorkerTimes::main_function() const {
  std::string best;
  int64_t most = 0;
  for (const auto& [function, runs] : function_runs_) {
    if (runs > most) {
      most = runs;
      best = function;
    }
  }
  return best;
}

void WorkerTimes::score_all(Clock::time_point now, std::map<int, std::optional<double>>* scores,
                            std::map<int, double>* busy) {
  const std::string function = main_function();
  // Each present worker's busy time per run: its average, or what a run in
  // flight has already taken when that is more.
  std::map<int, double> current;
  for (const auto& [task, t] : tasks_) {
    if (!t.present) continue;
    auto average = t.by_function.find(function);
    if (average == t.by_function.end() || average->second.runs < options_.min_runs) continue;
    current[task] = average->second.busy();
  }
  for (const auto& [ticket, run] : tickets_) {
    auto it = current.find(run.task);
    if (it == current.end() || run.ended > 0 || run.step) continue;
    it->second = std::max(it->second, seconds_between(run.since, now) / run.runs);
  }
  // The median of the averages alone: one worker's run in flight moves its
  // own score, not everyone's.
  std::vector<double> values;
  for (const auto& [task, t] : tasks_) {
    auto average = t.by_function.find(function);
    if (current.count(task) != 0) values.push_back(average->second.busy());
  }
  const double median = values.empty() ? 0 : median_of(values);
  for (auto& [task, t] : tasks_) {
    std::optional<double> score;
    auto it = current.find(task);
    if (it != current.end() && values.size() >= 2 && median > 0) score = it->second / median;
    (*scores)[task] = score;
    (*busy)[task] = it != current.end() ? it->second : 0;
    // Named once per slow spell.
    const bool slow = score.has_value() && *score >= options_.straggler_score;
    if (!slow) {
      t.slow_since.reset();
      if (!t.named) continue;
      // Recovered once it stays below for twice as long (a worker stopped
      // in bursts dips between them: it is not named again each time).
      if (!t.fast_since) t.fast_since = now;
      if (now - *t.fast_since >= 2 * options_.named_after) {
        if (log_) log_->info("worker {} is no longer a straggler (score {:.2f})", task, score.value_or(0));
        t.named = false;
        t.fast_since.reset();
      }
      continue;
    }
    t.fast_since.reset();
    if (!t.slow_since) t.slow_since = now;
    if (!t.named && now - *t.slow_since >= options_.named_after) {
      t.named = true;
      if (log_) {
        log_->warn("worker {} is a straggler: its {} runs take {:.1f}x the median worker's ({:.3f} s against "
                   "{:.3f} s, collectives left out) for {:.0f} s now; its time so far: {}",
                   task, function, *score, it->second, median, seconds_between(*t.slow_since, now),
                   format_phases(t.totals));
      }
    }
  }
}

std::vector<WorkerTimes::Row> WorkerTimes::rows(Clock::time_point now) {
  MutexLock lock(mutex_);
  std::map<int, std::optional<double>> scores;
  std::map<int, double> busy;
  score_all(now, &scores, &busy);
  std::vector<Row> out;
  for (const auto& [task, t] : tasks_) {
    if (!t.present) continue;
    Row row;
    row.task = task;
    row.runs = t.runs;
    row.totals = t.totals;
    row.busy = busy[task];
    row.score = scores[task];
    row.straggler = t.named;
    out.push_back(row);
  }
  return out;
}

PhaseTimes WorkerTimes::totals() const {
  MutexLock lock(mutex_);
  return totals_;
}

std::vector<WorkerTimes::Series> WorkerTimes::sample(Clock::time_point now) {
  MutexLock lock(mutex_);
  std::map<int, std::optional<double>> scores;
  std::map<int, double> busy;
  score_all(now, &scores, &busy);
  const double at = unix_seconds_now();
  const double oldest = at - static_cast<double>(options_.history.count());
  Series score{"straggler score by worker", {}}, busy_time{"busy s/step by worker", {}},
      rate{"closures+steps/s by worker", {}};
  for (auto& [task, t] : tasks_) {
    if (t.present) {
      if (scores[task].has_value()) {
        t.busy_points.emplace_back(at, busy[task]);
        t.score_points.emplace_back(at, *scores[task]);
      }
      if (t.sampled.has_value() && now > *t.sampled) {
        t.rate_points.emplace_back(at, static_cast<double>(t.runs - t.sampled_runs) / seconds_between(*t.sampled, now));
      }
      t.sampled = now;
      t.sampled_runs = t.runs;
    }
    for (auto* points : {&t.busy_points, &t.score_points, &t.rate_points}) {
      while (!points->empty() && points->front().first < oldest) points->pop_front();
    }
    const std::string who = "worker " + std::to_string(task);
    if (!t.score_points.empty()) score.lines.push_back({who, {t.score_points.begin(), t.score_points.end()}});
    if (!t.busy_points.empty()) busy_time.lines.push_back({who, {t.busy_points.begin(), t.busy_points.end()}});
    if (!t.rate_points.empty()) rate.lines.push_back({who, {t.rate_points.begin(), t.rate_points.end()}});
  }
  std::vector<Series> out;
  for (Series* s : {&score, &busy_time, &rate}) {
    if (!s->lines.empty()) out.push_back(std::move(*s));
  }
  return out;
}

}  // namespace capstan::coordinator
