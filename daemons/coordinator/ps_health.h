// PsHealth: the parameter servers' health as the coordinator sees it, one
// state per task, and what it means for calls (see "Parameter servers" in
// coordinator.h, and ps_recovery.h for the transitions):
//   kDown        unreachable (at start, or its link broke): dispatch pauses
//   kUp          reachable with its shards
//   kRecovering  came back without some shards; they are being restored
//   kLost        came back empty and cannot be recovered: calls fail with
//                the Status it was set with until a checkpoint is restored
// generation() goes up whenever a task enters or leaves kUp: a closure whose
// run saw it change failed because of it and runs again.
//
// Example:
//   PsHealth health(ps, start + kFirstContactWindow, config.ps_recovery_timeout);
//   health.set(0, PsHealth::State::kUp, Status::Ok(), now);
//   if (!health.status().ok()) ...            // dispatch pauses
//   if (auto until = health.pause_deadline(recoverable, now)) wait_until(*until);
//
// Not thread-safe: the Coordinator uses it on its loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_PS_HEALTH_H_
#define CAPSTAN_DAEMONS_COORDINATOR_PS_HEALTH_H_

#include <kj/time.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "daemons/coordinator/peers.h"

namespace capstan::coordinator {

class PsHealth {
 public:
  enum class State { kDown, kUp, kRecovering, kLost };

  // Every task starts kDown, never reached. Until `first_contact_until` a
  // task not reached yet is waited for; a recoverable task that went down
  // is waited for `recovery_timeout`. `ps` (its size and addresses, for
  // messages) must outlive this.
  PsHealth(const ParameterServers& ps, kj::TimePoint first_contact_until, std::chrono::milliseconds recovery_timeout);

  // Unavailable naming the first parameter server that is not up (the
  // Status it was lost with for a kLost one), or OK. Cheap while all are up.
  Status status() const;
  // While every parameter server that is not up is one that may still come
  // back (not reached yet, or `recoverable`: a checkpoint exists to restore
  // one that comes back empty) or is being recovered: when calls stop
  // waiting for it. nullopt: fail now (or nothing to wait for).
  std::optional<kj::TimePoint> pause_deadline(bool recoverable, kj::TimePoint now) const;
  // While a parameter server has not been reached since the start and the
  // first-contact window has not passed: when to stop waiting.
  std::optional<kj::TimePoint> first_contact_deadline(kj::TimePoint now) const;
  // Every task is kUp or kLost (none unreachable or being recovered).
  bool up_or_lost() const;

  // Moves `task` to `state` at `now`; `lost` says why for kLost.
  void set(int task, State state, Status lost, kj::TimePoint now);

  int size() const { return static_cast<int>(tasks_.size()); }
  State state(int task) const { return at(task).state; }
  bool ever_up(int task) const { return at(task).ever_up; }
  kj::TimePoint down_since(int task) const { return at(task).down_since; }
  const Status& lost(int task) const { return at(task).lost; }
  // For the status page: "up", "down (unreachable)", "lost: ...".
  std::string describe(int task) const;
  int64_t generation() const { return generation_; }

 private:
  struct Task {
    State state = State::kDown;
    bool ever_up = false;
    kj::TimePoint down_since = kj::origin<kj::TimePoint>();
    Status lost;  // kLost: why, and what fixes it
  };
  const Task& at(int task) const { return tasks_[static_cast<size_t>(task)]; }

  const ParameterServers& ps_;
  const kj::TimePoint first_contact_until_;
  const std::chrono::milliseconds recovery_timeout_;
  std::vector<Task> tasks_;  // by task
  int64_t generation_ = 0;
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_PS_HEALTH_H_
