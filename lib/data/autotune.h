// AUTOTUNE: knobs (a map's parallelism, a prefetch buffer's size) that a
// background thread turns according to measured producer/consumer rates.
//
// Every op with an autotuned knob reports how long its consumer waited for
// output. Each period (25 ms) the tuner looks at every knob:
//   - the consumer waited for more than 5% of the period: the op is the
//     bottleneck, so the knob goes up (parallelism +1, buffer x2), within the
//     CPU budget (parallelism) and the RAM budget (buffers);
//   - the consumer has not waited for a whole second: the op has slack, so
//     the knob comes down one step, freeing threads and memory.
// Knobs start at a value that is good for most pipelines (parallelism: the
// CPU budget; buffers: 2), so short pipelines do not pay for the search.
//
// Thread-safety: all methods may be called from any thread.
#ifndef CAPSTAN_LIB_DATA_AUTOTUNE_H_
#define CAPSTAN_LIB_DATA_AUTOTUNE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "sync/mutex.h"

namespace capstan::data {

class Knob {
 public:
  enum class Kind { kParallelism, kBufferSize };
  Knob(Kind kind, int64_t initial, int64_t min, int64_t max);

  int64_t value() const { return value_.load(std::memory_order_relaxed); }
  int64_t max() const { return max_.load(std::memory_order_relaxed); }
  // The buffer limit may depend on element sizes seen so far.
  void set_max(int64_t max);
  // The consumer waited `waited` for this op's output.
  void record_wait(std::chrono::nanoseconds waited) {
    waited_ns_.fetch_add(waited.count(), std::memory_order_relaxed);
  }

  // One tuning step over a period of `period`; returns true if the value
  // changed. Called by the tuner thread.
  bool tune(std::chrono::nanoseconds period);

 private:
  const Kind kind_;
  const int64_t min_;
  std::atomic<int64_t> max_;
  std::atomic<int64_t> value_;
  std::atomic<int64_t> waited_ns_{0};
  int idle_periods_ = 0;  // tuner thread only
};

class Autotuner {
 public:
  // Disabled: knobs stay at their initial values.
  Autotuner(bool enabled, int cpu_budget, int64_t ram_budget);
  ~Autotuner();

  bool enabled() const { return enabled_; }
  int cpu_budget() const { return cpu_budget_; }
  int64_t ram_budget() const { return ram_budget_; }
  // The knob is tuned while the returned pointer (or a copy) is alive.
  std::shared_ptr<Knob> add(Knob::Kind kind, int64_t initial, int64_t min, int64_t max);

 private:
  void run();

  const bool enabled_;
  const int cpu_budget_;
  const int64_t ram_budget_;
  Mutex mutex_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mutex_) = false;
  std::vector<std::weak_ptr<Knob>> knobs_ GUARDED_BY(mutex_);
  std::thread thread_;                      // started with the first knob
};

// Physical memory of the machine in bytes.
int64_t physical_memory();

}  // namespace capstan::data

#endif  // CAPSTAN_LIB_DATA_AUTOTUNE_H_
