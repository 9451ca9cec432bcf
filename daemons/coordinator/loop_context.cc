#include "daemons/coordinator/loop_context.h"

#include <utility>

namespace capstan::coordinator {

ChangeSignal::ChangeSignal(kj::Timer& timer, std::function<void()> before_wake)
    : timer_(timer), before_wake_(std::move(before_wake)) {}

void ChangeSignal::notify() {
  if (before_wake_) before_wake_();
  auto waiters = kj::mv(waiters_);
  waiters_ = kj::Vector<kj::Own<kj::PromiseFulfiller<void>>>();
  for (auto& w : waiters) w->fulfill();
}

kj::Promise<void> ChangeSignal::changed() {
  auto paf = kj::newPromiseAndFulfiller<void>();
  waiters_.add(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

kj::Promise<void> ChangeSignal::changed_or(kj::TimePoint deadline) {
  return changed().exclusiveJoin(timer_.atTime(deadline));
}

kj::Promise<void> ChangeSignal::until(std::function<bool()> done) {
  if (done()) return kj::READY_NOW;
  return changed().then([this, done = std::move(done)]() mutable { return until(std::move(done)); });
}

}  // namespace capstan::coordinator
