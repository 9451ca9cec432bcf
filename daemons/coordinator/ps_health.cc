#include "daemons/coordinator/ps_health.h"

#include <algorithm>
#include <utility>

namespace capstan::coordinator {

PsHealth::PsHealth(const ParameterServers& ps, kj::TimePoint first_contact_until,
                   std::chrono::milliseconds recovery_timeout)
    : ps_(ps),
      first_contact_until_(first_contact_until),
      recovery_timeout_(recovery_timeout),
      tasks_(static_cast<size_t>(ps.size())) {}

Status PsHealth::status() const {
  // On every dispatch: no string is built while all are up.
  for (size_t i = 0; i < tasks_.size(); ++i) {
    const Task& task = tasks_[i];
    if (task.state == State::kUp) continue;
    if (task.state == State::kLost) return task.lost;
    std::string who = "parameter server ps:" + std::to_string(i) + " at " + ps_.address(static_cast<int>(i));
    if (task.state == State::kRecovering) return Status::Unavailable(who + " is being restored from a checkpoint");
    if (task.ever_up) return Status::Unavailable(who + " is unreachable");
    return Status::Unavailable(who + " is unreachable: not reached since the coordinator started (is it running, "
                               "and is --ps right?)");
  }
  return Status::Ok();
}

std::optional<kj::TimePoint> PsHealth::pause_deadline(bool recoverable, kj::TimePoint now) const {
  std::optional<kj::TimePoint> until;
  for (const Task& task : tasks_) {
    switch (task.state) {
      case State::kUp: break;
      case State::kLost: return std::nullopt;
      case State::kDown:
        if (!task.ever_up) {
          // Not reached yet: waited for a while after the start.
          until = until ? std::min(*until, first_contact_until_) : first_contact_until_;
          break;
        }
        if (!recoverable) return std::nullopt;
        [[fallthrough]];
      case State::kRecovering: {
        kj::TimePoint end = task.down_since + recovery_timeout_.count() * kj::MILLISECONDS;
        until = until ? std::min(*until, end) : end;
        break;
      }
    }
  }
  if (until && now >= *until) return std::nullopt;
  return until;
}

std::optional<kj::TimePoint> PsHealth::first_contact_deadline(kj::TimePoint now) const {
  if (now >= first_contact_until_) return std::nullopt;
  for (const Task& task : tasks_) {
    if (task.state == State::kDown && !task.ever_up) return first_contact_until_;
  }
  return std::nullopt;
}

bool PsHealth::up_or_lost() const {
  return std::all_of(tasks_.begin(), tasks_.end(),
                     [](const Task& task) { return task.state == State::kUp || task.state == State::kLost; });
}

void PsHealth::set(int task, State state, Status lost, kj::TimePoint now) {
  Task& t = tasks_[static_cast<size_t>(task)];
  if (state == State::kDown && t.state != State::kDown) t.down_since = now;
  if (state == State::kUp) t.ever_up = true;
  if ((state == State::kUp) != (t.state == State::kUp)) ++generation_;
  t.state = state;
  t.lost = std::move(lost);
}

std::string PsHealth::describe(int task) const {
  const Task& t = at(task);
  switch (t.state) {
    case State::kUp: return "up";
    case State::kDown: return t.ever_up ? "down (unreachable)" : "down (never reached)";
    case State::kRecovering: return "recovering from the last checkpoint";
    case State::kLost: return "lost: " + t.lost.message();
  }
  return {};
}

}  // namespace capstan::coordinator
