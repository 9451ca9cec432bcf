// DispatchGate: whether new closures and synchronous steps may start. Two
// things close it: the coordinator draining (SIGTERM: for good), and pauses
// (a model checkpoint reading the per-worker iterators: until the guard it
// holds goes). What runs already is not affected; the lanes and the steps
// look at the gate before they start anything, and wait on the change
// signal while it is paused.
//
// Example:
//   DispatchGate gate;
//   auto guard = gate.pause([&] { changes.notify(); });  // a save reads iterators
//   gate.paused();   // true until `guard` goes, then the callback runs
//
// Not thread-safe: the Coordinator uses it on its loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_DISPATCH_GATE_H_
#define CAPSTAN_DAEMONS_COORDINATOR_DISPATCH_GATE_H_

#include <functional>
#include <memory>
#include <utility>

namespace capstan::coordinator {

class DispatchGate {
 public:
  // drain(): nothing more is dispatched, for good.
  void drain() { draining_ = true; }
  bool draining() const { return draining_; }
  // Closed until the returned guard goes; then `on_resume` runs (to wake
  // what waits). Pauses nest. The gate must outlive the guard.
  std::shared_ptr<void> pause(std::function<void()> on_resume) {
    ++pauses_;
    return std::shared_ptr<void>(this, [on_resume = std::move(on_resume)](DispatchGate* gate) {
      --gate->pauses_;
      if (on_resume) on_resume();
    });
  }
  bool paused() const { return pauses_ > 0; }

 private:
  bool draining_ = false;
  int pauses_ = 0;  // pause() guards alive
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_DISPATCH_GATE_H_
