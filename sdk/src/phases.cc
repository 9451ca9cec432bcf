#include "capstan/phases.h"

#include <algorithm>
#include <cstdio>

#include "capstan/trace.h"

namespace capstan {
namespace {

// The recorder recording on this thread; null when none.
thread_local PhaseRecorder* current_recorder = nullptr;

int64_t nanos_between(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count();
}

}  // namespace

double PhaseTimes::compute() const { return std::max(0.0, total - input - ps - collective); }

PhaseTimes& PhaseTimes::operator+=(const PhaseTimes& other) {
  queued += other.queued;
  input += other.input;
  ps += other.ps;
  collective += other.collective;
  total += other.total;
  return *this;
}

std::string format_phases(const PhaseTimes& times) {
  const double whole = times.queued + std::max(times.total, times.input + times.ps + times.collective);
  if (whole <= 0) return "no steps timed";
  const std::pair<const char*, double> parts[] = {{"queued", times.queued},   {"input", times.input},
                                                  {"ps", times.ps},           {"compute", times.compute()},
                                                  {"all-reduce", times.collective}};
  std::string out;
  for (const auto& [name, seconds] : parts) {
    if (seconds <= 0) continue;
    char piece[48];
    std::snprintf(piece, sizeof(piece), "%s%s %.0f%%", out.empty() ? "" : ", ", name, 100 * seconds / whole);
    out += piece;
  }
  return out;
}

PhaseRecorder::PhaseRecorder() : started_(std::chrono::steady_clock::now()), outer_(current_recorder) {
  current_recorder = this;
}

PhaseRecorder::~PhaseRecorder() { current_recorder = outer_; }

PhaseTimes PhaseRecorder::stop() const {
  PhaseTimes times;
  times.total = static_cast<double>(nanos_between(started_, std::chrono::steady_clock::now())) * 1e-9;
  times.input = static_cast<double>(nanos_[static_cast<int>(Phase::kInput)]) * 1e-9;
  times.ps = static_cast<double>(nanos_[static_cast<int>(Phase::kPs)]) * 1e-9;
  times.collective = static_cast<double>(nanos_[static_cast<int>(Phase::kCollective)]) * 1e-9;
  return times;
}

PhaseScope::PhaseScope(Phase phase) {
  PhaseRecorder* recorder = current_recorder;
  if (recorder == nullptr || recorder->active_ >= 0) return;
  recorder->active_ = static_cast<int>(phase);
  recorder_ = recorder;
  started_ = std::chrono::steady_clock::now();
}

PhaseScope::~PhaseScope() {
  if (recorder_ == nullptr) return;
  const auto ended = std::chrono::steady_clock::now();
  const int phase = recorder_->active_;
  recorder_->nanos_[phase] += nanos_between(started_, ended);
  recorder_->active_ = -1;
  if (trace::Recorder::get().tracing()) {
    static const char* const kNames[] = {"input", "ps", "all-reduce"};
    using std::chrono::nanoseconds;
    trace::record_finished(trace::Kind::kPhase, kNames[phase],
                           std::chrono::duration_cast<nanoseconds>(started_.time_since_epoch()).count(),
                           std::chrono::duration_cast<nanoseconds>(ended.time_since_epoch()).count());
  }
}

}  // namespace capstan
