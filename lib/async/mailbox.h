// Mailbox: how other threads reach a KJ event loop.
//
// KJ has its own cross-thread calls (kj::Executor, cross-thread fulfillers),
// but they synchronize with futexes inside Debian's libkj-async, which is not
// built with ThreadSanitizer: every handoff through them looks like a data
// race to TSan, and suppressing those reports would hide real races on the
// loop threads too. A Mailbox hands work over through a capstan::Mutex (a
// pthread mutex, which TSan understands) and wakes the loop with an eventfd.
//
// One Mailbox per loop thread, constructed on it (LoopThread makes one); any
// code on that thread finds it with Mailbox::current(). Other threads hold a
// MailboxRemote, which outlives the Mailbox: once the loop's Mailbox is gone,
// post() and signal() return false.
//
//   // On the loop:
//   auto [ticket, ready] = Mailbox::current().expect();
//   auto remote = Mailbox::current().remote();
//   // On any thread, later:
//   remote->signal(ticket);  // `ready` resolves on the loop
//
// Thread-safety: MailboxRemote is thread-safe; Mailbox is used only on its
// loop thread.
#ifndef CAPSTAN_LIB_ASYNC_MAILBOX_H_
#define CAPSTAN_LIB_ASYNC_MAILBOX_H_

#include <kj/async-io.h>
#include <kj/async.h>
#include <kj/function.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sync/mutex.h"

namespace capstan::async {

class Mailbox;

class MailboxRemote {
 public:
  ~MailboxRemote() = default;
  MailboxRemote(const MailboxRemote&) = delete;
  MailboxRemote& operator=(const MailboxRemote&) = delete;

  // Runs `fn` on the loop thread; functions run in the order they were
  // posted. False when the loop's Mailbox is gone (then `fn` is destroyed
  // here, unrun).
  bool post(kj::Function<void()> fn) LOCKS_EXCLUDED(mutex_);

  // Resolves the promise that Mailbox::expect() returned with `ticket`. A
  // ticket is signalled once; later signals of it are ignored.
  bool signal(uint64_t ticket) LOCKS_EXCLUDED(mutex_);

 private:
  friend class Mailbox;
  explicit MailboxRemote(int event_fd) : event_fd_(event_fd) {}

  // Writes the eventfd unless a write is already pending.
  void wake() REQUIRES(mutex_);

  const int event_fd_;  // owned by the Mailbox's stream; never used once closed_
  Mutex mutex_;
  bool closed_ GUARDED_BY(mutex_) = false;
  bool woken_ GUARDED_BY(mutex_) = false;
  std::deque<kj::Function<void()>> posted_ GUARDED_BY(mutex_);
  std::vector<uint64_t> signalled_ GUARDED_BY(mutex_);
};

class Mailbox final : private kj::TaskSet::ErrorHandler {
 public:
  // On the loop thread, which must not have a Mailbox yet.
  explicit Mailbox(kj::LowLevelAsyncIoProvider& io);
  // Closes the remote, then drops what has not run: posted functions, tasks
  // and expected tickets (their promises never resolve).
  ~Mailbox();
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  // The calling loop thread's Mailbox; throws when it has none.
  static Mailbox& current();

  const std::shared_ptr<MailboxRemote>& remote() const { return remote_; }

  // A ticket and the promise that another thread's signal(ticket) resolves.
  std::pair<uint64_t, kj::Promise<void>> expect();

  // Keeps `task` running until it finishes or the Mailbox goes away.
  void add_task(kj::Promise<void> task) { tasks_.add(kj::mv(task)); }

 private:
  void taskFailed(kj::Exception&& exception) override;
  kj::Promise<void> pump();
  void drain();

  std::shared_ptr<MailboxRemote> remote_;
  kj::Own<kj::AsyncInputStream> events_;  // owns the eventfd
  uint64_t event_count_ = 0;              // read buffer for events_
  uint64_t next_ticket_ = 1;
  std::unordered_map<uint64_t, kj::Own<kj::PromiseFulfiller<void>>> expected_;
  kj::TaskSet tasks_;
  kj::Promise<void> pump_;
};

}  // namespace capstan::async

#endif  // CAPSTAN_LIB_ASYNC_MAILBOX_H_
