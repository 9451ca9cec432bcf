// What the coordinator's parts share on the thread of its KJ event loop.
//
// ChangeSignal: how a part waits for "something changed" (a closure ended,
// a worker joined or left, a parameter server's state moved, a pause ended)
// without knowing what. notify() wakes every waiter; each looks again at
// what it waits for and, if need be, waits again. Cheap and coarse on
// purpose: the coordinator has few waiters (join, fetch, idle lanes, a
// leave or a drain), and a spurious wake-up only costs a look.
//
// LoopContext: the timer, the background tasks, the change signal, the
// stats and the log, which the Coordinator owns and hands to each part by
// reference (they outlive the parts' use of them).
//
// Example:
//   ChangeSignal changes(timer, [&] { refresh_levels(); });
//   changes.until([&] { return queue.idle(); }).then(...);   // a drain
//   queue.complete(...); changes.notify();                   // the drain looks again
//
// Not thread-safe: everything runs on the loop's thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_LOOP_CONTEXT_H_
#define CAPSTAN_DAEMONS_COORDINATOR_LOOP_CONTEXT_H_

#include <kj/async.h>
#include <kj/timer.h>
#include <kj/vector.h>
#include <spdlog/logger.h>

#include <functional>
#include <memory>

#include "daemons/coordinator/stats.h"

namespace capstan::coordinator {

class ChangeSignal {
 public:
  // `before_wake` runs first at every notify() (the coordinator refreshes
  // its stats' levels there). `timer` must outlive this.
  explicit ChangeSignal(kj::Timer& timer, std::function<void()> before_wake = {});
  ChangeSignal(const ChangeSignal&) = delete;
  ChangeSignal& operator=(const ChangeSignal&) = delete;

  // Wakes everything waiting (changed(), and what waits through it).
  void notify();
  // Resolves at the next notify().
  kj::Promise<void> changed();
  // changed(), or `deadline`, whichever comes first.
  kj::Promise<void> changed_or(kj::TimePoint deadline);
  // Resolves once `done()` holds: checked now and at every notify().
  kj::Promise<void> until(std::function<bool()> done);

 private:
  kj::Timer& timer_;
  const std::function<void()> before_wake_;
  kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> waiters_;
};

struct LoopContext {
  kj::Timer& timer;
  // Work that runs in the background (lanes, pings, timers); cancelled
  // when the Coordinator goes.
  kj::TaskSet& tasks;
  ChangeSignal& changes;
  CoordinatorStats& stats;
  std::shared_ptr<spdlog::logger> log;
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_LOOP_CONTEXT_H_
