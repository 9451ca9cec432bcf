// LoopThread: a thread that runs a KJ event loop with async I/O.
//
// Every Cap'n Proto object lives on exactly one such thread. Other threads
// reach it through run_sync(), which executes a function on the loop thread
// (awaiting the promise it returns, if any) and hands back the result.
//
// Thread-safety: run_sync() and stop() may be called from any thread except
// the loop thread itself; io() and timer() only from the loop thread.
#ifndef CAPSTAN_SDK_SRC_RPC_LOOP_THREAD_H_
#define CAPSTAN_SDK_SRC_RPC_LOOP_THREAD_H_

#include <kj/async-io.h>
#include <kj/async.h>

#include <string>
#include <thread>
#include "sync/mutex.h"

namespace capstan::rpc {

class LoopThread {
 public:
  explicit LoopThread(std::string name);
  ~LoopThread();  // stop()s
  LoopThread(const LoopThread&) = delete;
  LoopThread& operator=(const LoopThread&) = delete;

  // Runs `func` on the loop thread and waits for it (and for the promise it
  // returns, if it returns one). Exceptions propagate to the caller as
  // kj::Exception. Objects the function creates on the loop must also be
  // destroyed there (by another run_sync) before the LoopThread goes away.
  template <typename Func>
  auto run_sync(Func&& func) {
    return executor_->executeSync(kj::fwd<Func>(func));
  }

  const kj::Executor& executor() const { return *executor_; }
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
  kj::Own<const kj::Executor> executor_;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop_fulfiller_;
};

}  // namespace capstan::rpc

#endif  // CAPSTAN_SDK_SRC_RPC_LOOP_THREAD_H_
