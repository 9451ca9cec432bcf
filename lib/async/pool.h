// Running heavy work off the KJ loop.
//
// run_on_pool() posts `func` to a Boost.Asio thread pool and returns a
// promise, on the calling loop thread, for its result. The pool thread
// stores the result in a slot both sides share and signals the loop's
// Mailbox (async/mailbox.h), whose mutex orders the two; nothing else is
// touched from the pool thread. Cancelling the promise does not stop `func`;
// its result is then dropped. Work the pool discards unrun (a stopped pool)
// rejects the promise.
//
// The calling thread must have a Mailbox (every LoopThread has one).
#ifndef CAPSTAN_LIB_ASYNC_POOL_H_
#define CAPSTAN_LIB_ASYNC_POOL_H_

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <kj/async.h>
#include <kj/debug.h>

#include <exception>
#include <memory>
#include <optional>
#include <type_traits>

#include "async/status_exception.h"
#include "async/mailbox.h"

namespace capstan::async {

namespace internal {

// One pool call's result. Written on the pool thread before the ticket is
// signalled, read on the loop after the ticket's promise resolves: the
// mailbox's mutex orders the two.
template <typename T>
struct PoolSlot {
  std::optional<std::conditional_t<std::is_void_v<T>, bool, T>> value;
  kj::Maybe<kj::Exception> error;

  T take() {
    KJ_IF_MAYBE (e, error) { kj::throwFatalException(kj::mv(*e)); }
    if (!value) kj::throwFatalException(KJ_EXCEPTION(DISCONNECTED, "the thread pool dropped the work unrun"));
    if constexpr (!std::is_void_v<T>) return std::move(*value);
  }
};

// Signals the ticket when destroyed (after the work ran, or when the pool
// drops the work unrun).
class TicketSignal {
 public:
  TicketSignal(std::shared_ptr<MailboxRemote> remote, uint64_t ticket) : remote_(std::move(remote)), ticket_(ticket) {}
  TicketSignal(TicketSignal&&) = default;
  TicketSignal& operator=(TicketSignal&&) = default;
  ~TicketSignal() {
    if (remote_) remote_->signal(ticket_);
  }

 private:
  std::shared_ptr<MailboxRemote> remote_;
  uint64_t ticket_;
};

}  // namespace internal

template <typename Func>
auto run_on_pool(boost::asio::thread_pool& pool, Func func) -> kj::Promise<std::invoke_result_t<Func&>> {
  using T = std::invoke_result_t<Func&>;
  auto& mailbox = Mailbox::current();
  auto [ticket, ready] = mailbox.expect();
  auto slot = std::make_shared<internal::PoolSlot<T>>();
  boost::asio::post(pool, [signal = internal::TicketSignal(mailbox.remote(), ticket), slot,
                           func = std::move(func)]() mutable {
    try {
      if constexpr (std::is_void_v<T>) {
        func();
        slot->value.emplace(true);
      } else {
        slot->value.emplace(func());
      }
    } catch (const kj::Exception& e) {
      slot->error = kj::cp(e);
    } catch (const std::exception& e) {
      slot->error = to_exception(Status::Internal(e.what()));
    }
    auto done = kj::mv(signal);  // signals now, after the slot is written
  });
  return ready.then([slot]() { return slot->take(); });
}

}  // namespace capstan::async

#endif  // CAPSTAN_LIB_ASYNC_POOL_H_
