#include "async/loop_thread.h"

#include <pthread.h>

namespace capstan::async {

LoopThread::LoopThread(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this]() { main(); });
  MutexLock lock(mutex_);
  while (!ready_) ready_cv_.wait(mutex_);
}

LoopThread::~LoopThread() { stop(); }

void LoopThread::main() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  auto io = kj::setupAsyncIo();
  {
    Mailbox mailbox(*io.lowLevelProvider);
    auto paf = kj::newPromiseAndFulfiller<void>();
    stop_fulfiller_ = kj::mv(paf.fulfiller);
    {
      MutexLock lock(mutex_);
      io_ = &io;
      remote_ = mailbox.remote();
      ready_ = true;
    }
    ready_cv_.notify_all();
    paf.promise.wait(io.waitScope);
    // Let already-queued events (e.g. destructors run by the last run_sync)
    // settle before the loop goes away.
    io.provider->getTimer().afterDelay(0 * kj::MILLISECONDS).wait(io.waitScope);
    stop_fulfiller_ = nullptr;
    // The mailbox closes here: later run_sync calls fail with DISCONNECTED.
  }
  io_ = nullptr;
}

void LoopThread::stop() {
  if (!thread_.joinable()) return;
  remote_->post([this]() { stop_fulfiller_->fulfill(); });
  thread_.join();
}

}  // namespace capstan::async
