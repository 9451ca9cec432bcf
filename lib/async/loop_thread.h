// LoopThread: a thread that runs a KJ event loop with async I/O.
//
// Every Cap'n Proto object lives on exactly one such thread. Other threads
// reach it through run_sync(), which executes a function on the loop thread
// (awaiting the promise it returns, if any) and hands back the result. The
// handoff goes through the loop's Mailbox (async/mailbox.h), so
// ThreadSanitizer sees its ordering.
//
// Thread-safety: run_sync() and stop() may be called from any thread except
// the loop thread itself; io() and timer() only from the loop thread.
#ifndef CAPSTAN_LIB_ASYNC_LOOP_THREAD_H_
#define CAPSTAN_LIB_ASYNC_LOOP_THREAD_H_

#include <kj/async-io.h>
#include <kj/async.h>
#include <kj/debug.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>

#include "async/mailbox.h"
#include "sync/mutex.h"

namespace capstan::async {

namespace internal {

template <typename P>
struct PromiseValue;
template <typename T>
struct PromiseValue<kj::Promise<T>> {
  using type = T;
};

// Where one run_sync() call's outcome meets its waiting caller.
template <typename T>
class SyncCall {
 public:
  // Loop side. The first outcome counts.
  void succeed(T value) LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(mutex_);
    if (done_) return;
    value_.emplace(std::move(value));
    done_ = true;
    cv_.notify_all();
  }
  void fail(kj::Exception exception) LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(mutex_);
    if (done_) return;
    error_ = kj::mv(exception);
    done_ = true;
    cv_.notify_all();
  }
  // Caller side: waits for the outcome; rethrows a failure.
  T get() LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(mutex_);
    while (!done_) cv_.wait(mutex_);
    KJ_IF_MAYBE (e, error_) { kj::throwFatalException(kj::mv(*e)); }
    return std::move(*value_);
  }

 private:
  Mutex mutex_;
  CondVar cv_;
  bool done_ GUARDED_BY(mutex_) = false;
  std::optional<T> value_ GUARDED_BY(mutex_);
  kj::Maybe<kj::Exception> error_ GUARDED_BY(mutex_);
};

struct Unit {};

// Fails the call if it is destroyed before the call finished: the loop
// stopped with the call's function unrun or its promise pending.
template <typename T>
class SyncGuard {
 public:
  explicit SyncGuard(std::shared_ptr<SyncCall<T>> call) : call_(std::move(call)) {}
  SyncGuard(SyncGuard&&) = default;
  SyncGuard& operator=(SyncGuard&&) = default;
  ~SyncGuard() {
    if (call_) call_->fail(KJ_EXCEPTION(DISCONNECTED, "the event loop stopped before the call finished"));
  }

 private:
  std::shared_ptr<SyncCall<T>> call_;
};

}  // namespace internal

class LoopThread {
 public:
  explicit LoopThread(std::string name);
  ~LoopThread();  // stop()s
  LoopThread(const LoopThread&) = delete;
  LoopThread& operator=(const LoopThread&) = delete;

  // Runs `func` on the loop thread and waits for it (and for the promise it
  // returns, if it returns one). Exceptions propagate to the caller as
  // kj::Exception; after stop(), a DISCONNECTED one. Objects the function
  // creates on the loop must also be destroyed there (by another run_sync)
  // before the LoopThread goes away.
  template <typename Func>
  auto run_sync(Func&& func) {
    using T = typename internal::PromiseValue<kj::PromiseForResult<Func, void>>::type;
    using Stored = std::conditional_t<std::is_void_v<T>, internal::Unit, T>;
    KJ_REQUIRE(!on_loop_thread(), "run_sync() on the loop's own thread would wait for itself");
    auto call = std::make_shared<internal::SyncCall<Stored>>();
    bool posted = remote_->post([call, guard = internal::SyncGuard<Stored>(call), &func]() mutable {
      kj::PromiseForResult<Func, void> promise = nullptr;
      KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() {
                     if constexpr (std::is_void_v<decltype(func())>) {
                       func();
                       promise = kj::READY_NOW;
                     } else {
                       promise = func();
                     }
                   })) {
        promise = kj::mv(*e);
      }
      kj::Promise<void> done = nullptr;
      if constexpr (std::is_void_v<T>) {
        done = promise.then([call]() { call->succeed(internal::Unit{}); },
                            [call](kj::Exception&& e) { call->fail(kj::mv(e)); });
      } else {
        done = promise.then([call](T&& value) { call->succeed(kj::mv(value)); },
                            [call](kj::Exception&& e) { call->fail(kj::mv(e)); });
      }
      Mailbox::current().add_task(done.attach(kj::mv(guard)));
    });
    if (!posted) {
      kj::throwFatalException(KJ_EXCEPTION(DISCONNECTED, "the event loop has stopped", name_));
    }
    if constexpr (std::is_void_v<T>) {
      call->get();
    } else {
      return call->get();
    }
  }

  // Runs `fn` on the loop thread later, without waiting for it; functions
  // posted and run_sync() calls run in the order they were made. False
  // (and `fn` is dropped unrun) after stop(). What `fn` throws is logged.
  bool post(kj::Function<void()> fn) { return remote_->post(kj::mv(fn)); }

  kj::AsyncIoProvider& io() { return *io_->provider; }
  kj::LowLevelAsyncIoProvider& low_level_io() { return *io_->lowLevelProvider; }
  kj::Timer& timer() { return io_->provider->getTimer(); }
  kj::WaitScope& wait_scope() { return io_->waitScope; }
  bool on_loop_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

  // Ends the loop and joins the thread. Idempotent.
  void stop();

 private:
  void main();

  const std::string name_;
  std::thread thread_;

  Mutex mutex_;
  CondVar ready_cv_;
  bool ready_ GUARDED_BY(mutex_) = false;

  // Set by the loop thread before ready_; constant afterwards.
  kj::AsyncIoContext* io_ = nullptr;
  std::shared_ptr<MailboxRemote> remote_;
  // Loop thread only.
  kj::Own<kj::PromiseFulfiller<void>> stop_fulfiller_;
};

}  // namespace capstan::async

#endif  // CAPSTAN_LIB_ASYNC_LOOP_THREAD_H_
