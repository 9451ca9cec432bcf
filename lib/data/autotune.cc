#include "data/autotune.h"
#include "sync/mutex.h"

#include <unistd.h>

#include <algorithm>

namespace capstan::data {
namespace {

constexpr auto kPeriod = std::chrono::milliseconds(25);
constexpr double kBottleneckFraction = 0.05;
constexpr int kIdlePeriodsBeforeShrinking = 40;  // one second

}  // namespace

Knob::Knob(Kind kind, int64_t initial, int64_t min, int64_t max)
    : kind_(kind), min_(min), max_(std::max(min, max)), value_(std::clamp(initial, min, std::max(min, max))) {}

void Knob::set_max(int64_t max) {
  max = std::max(max, min_);
  max_.store(max, std::memory_order_relaxed);
  if (value() > max) value_.store(max, std::memory_order_relaxed);
}

bool Knob::tune(std::chrono::nanoseconds period) {
  int64_t waited = waited_ns_.exchange(0, std::memory_order_relaxed);
  int64_t value = this->value();
  int64_t next = value;
  if (static_cast<double>(waited) > kBottleneckFraction * static_cast<double>(period.count())) {
    idle_periods_ = 0;
    next = kind_ == Kind::kParallelism ? value + 1 : value * 2;
  } else if (waited == 0 && ++idle_periods_ >= kIdlePeriodsBeforeShrinking) {
    idle_periods_ = 0;
    next = kind_ == Kind::kParallelism ? value - 1 : value / 2;
  }
  next = std::clamp(next, min_, max());
  if (next == value) return false;
  value_.store(next, std::memory_order_relaxed);
  return true;
}

Autotuner::Autotuner(bool enabled, int cpu_budget, int64_t ram_budget)
    : enabled_(enabled), cpu_budget_(std::max(1, cpu_budget)), ram_budget_(ram_budget) {}

Autotuner::~Autotuner() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<Knob> Autotuner::add(Knob::Kind kind, int64_t initial, int64_t min, int64_t max) {
  auto knob = std::make_shared<Knob>(kind, initial, min, max);
  if (!enabled_) return knob;
  MutexLock lock(mutex_);
  knobs_.push_back(knob);
  if (!thread_.joinable()) thread_ = std::thread([this]() { run(); });
  return knob;
}

void Autotuner::run() {
  MutexLock lock(mutex_);
  while (true) {
    auto deadline = std::chrono::steady_clock::now() + kPeriod;
    while (!stopping_ && cv_.wait_until(mutex_, deadline)) {
    }
    if (stopping_) return;
    knobs_.erase(std::remove_if(knobs_.begin(), knobs_.end(),
                                [](const std::weak_ptr<Knob>& k) { return k.expired(); }),
                 knobs_.end());
    for (auto& weak : knobs_) {
      if (auto knob = weak.lock()) knob->tune(kPeriod);
    }
  }
}

int64_t physical_memory() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return int64_t{8} << 30;
  return static_cast<int64_t>(pages) * page_size;
}

}  // namespace capstan::data
