// Where a step's time goes: waiting for input, the parameter servers, the
// collectives, and the rest (the model's compute), measured on the thread
// that runs the step. TF has no such breakdown; PyTorch's profiler and Ray
// Train's "exposed data-loading time" are the nearest.
//
//   capstan::PhaseTimes totals;
//   for (int step = 0; step < steps; ++step) {
//     capstan::PhaseRecorder recorder;               // this thread, from now
//     auto batch = iterator->get_next();             // counted as input when
//     ...                                            //   Capstan reads it
//     totals += recorder.stop();
//   }
//   std::printf("%s\n", capstan::format_phases(totals).c_str());
//   // "input 12%, ps 30%, compute 50%, all-reduce 8%"
//
// Capstan marks its own waits (PhaseScope): a worker's per-worker iterators
// and step inputs and MirroredInput::next are input; a closure's reads,
// gathers, lookups and gradient pushes to the parameter servers are ps; the
// Communicator's blocking collectives (and so MirroredVariables'
// all-reduce) are all-reduce. The worker-server records every closure and
// step this way and sends the phases to the coordinator with the result
// (ClusterCoordinator::worker_stats()).
//
// Cost: with no recorder on the thread, a PhaseScope is one thread-local
// read. Scopes nest: only the outermost counts (an input pipeline that
// reads a parameter server is input).
//
// Thread-safety: a PhaseRecorder and its scopes belong to one thread.
#ifndef CAPSTAN_PHASES_H_
#define CAPSTAN_PHASES_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "capstan/export.h"

namespace capstan CAPSTAN_API {

enum class Phase : int { kInput = 0, kPs = 1, kCollective = 2 };

// Seconds. `total` is the step's wall time; compute() is what the marked
// phases leave of it. `queued` (a closure's wait at the coordinator for a
// worker) is outside `total`.
struct PhaseTimes {
  double queued = 0;
  double input = 0;
  double ps = 0;
  double collective = 0;
  double total = 0;

  double compute() const;
  PhaseTimes& operator+=(const PhaseTimes& other);
};

// "input 12%, ps 30%, compute 50%, all-reduce 8%": each phase's share of
// queued + total (queued shown only when there was any, phases that took
// no time left out); "no steps timed" when there is nothing.
std::string format_phases(const PhaseTimes& times);

// Records where this thread's time goes while it lives. A recorder made
// while another records on the thread takes over until it is gone (the
// inner one's time is not the outer one's as well).
class PhaseRecorder {
 public:
  PhaseRecorder();
  ~PhaseRecorder();
  PhaseRecorder(const PhaseRecorder&) = delete;
  PhaseRecorder& operator=(const PhaseRecorder&) = delete;

  // The times so far: total is the wall time since construction.
  PhaseTimes stop() const;

 private:
  friend class PhaseScope;
  std::chrono::steady_clock::time_point started_;
  PhaseRecorder* outer_;
  int active_ = -1;  // the Phase an open scope counts; -1: none
  int64_t nanos_[3] = {0, 0, 0};
};

// Counts this thread's time as `phase` while it lives, when a recorder
// records on the thread and no other scope is open.
class PhaseScope {
 public:
  explicit PhaseScope(Phase phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseRecorder* recorder_ = nullptr;  // null: this scope counts nothing
  std::chrono::steady_clock::time_point started_;
};

}  // namespace capstan

#endif  // CAPSTAN_PHASES_H_
