#include "async/mailbox.h"

#include <kj/debug.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "capstan/status.h"
#include "async/status_exception.h"

namespace capstan::async {

namespace {
thread_local Mailbox* current_mailbox = nullptr;
}  // namespace

bool MailboxRemote::post(kj::Function<void()> fn) {
  {
    MutexLock lock(mutex_);
    if (!closed_) {
      posted_.push_back(kj::mv(fn));
      wake();
      return true;
    }
  }
  return false;  // `fn` is destroyed here, outside the lock
}

bool MailboxRemote::signal(uint64_t ticket) {
  MutexLock lock(mutex_);
  if (closed_) return false;
  signalled_.push_back(ticket);
  wake();
  return true;
}

void MailboxRemote::wake() {
  if (woken_) return;
  uint64_t one = 1;
  // An eventfd write fails only when the counter would overflow, which the
  // woken_ flag rules out.
  ssize_t written;
  do {
    written = ::write(event_fd_, &one, sizeof(one));
  } while (written < 0 && errno == EINTR);
  KJ_ASSERT(written == sizeof(one), "writing the mailbox eventfd failed", strerror(errno));
  woken_ = true;
}

Mailbox::Mailbox(kj::LowLevelAsyncIoProvider& io) : tasks_(*this), pump_(nullptr) {
  if (current_mailbox != nullptr) {
    throw_status(Status::FailedPrecondition("this thread's event loop already has a Mailbox"));
  }
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) {
    throw_status(Status::ResourceExhausted(std::string("eventfd() for an event loop's mailbox failed: ") +
                                           strerror(errno) + " (raise the open-file limit, ulimit -n)"));
  }
  remote_.reset(new MailboxRemote(fd));
  events_ = io.wrapInputFd(fd, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP |
                                   kj::LowLevelAsyncIoProvider::ALREADY_NONBLOCK |
                                   kj::LowLevelAsyncIoProvider::ALREADY_CLOEXEC);
  pump_ = pump().eagerlyEvaluate([](kj::Exception&& e) {
    KJ_LOG(ERROR, "an event loop stopped reading its mailbox; other threads can no longer reach it", e);
  });
  current_mailbox = this;
}

Mailbox::~Mailbox() {
  current_mailbox = nullptr;
  std::deque<kj::Function<void()>> unrun;
  {
    MutexLock lock(remote_->mutex_);
    remote_->closed_ = true;
    unrun.swap(remote_->posted_);
  }
  // `unrun`, the tasks and the expected tickets are destroyed here, on the
  // loop thread, in that order; the eventfd closes with events_.
}

Mailbox& Mailbox::current() {
  if (current_mailbox == nullptr) {
    throw_status(Status::Internal(
        "this thread has no event-loop Mailbox: run the code on a capstan::async::LoopThread, or construct an "
        "async::Mailbox beside the thread's kj::setupAsyncIo()"));
  }
  return *current_mailbox;
}

std::pair<uint64_t, kj::Promise<void>> Mailbox::expect() {
  auto paf = kj::newPromiseAndFulfiller<void>();
  uint64_t ticket = next_ticket_++;
  expected_.emplace(ticket, kj::mv(paf.fulfiller));
  return {ticket, kj::mv(paf.promise)};
}

void Mailbox::taskFailed(kj::Exception&& exception) {
  KJ_LOG(ERROR, "a task posted to an event loop failed", exception);
}

kj::Promise<void> Mailbox::pump() {
  return events_->read(&event_count_, sizeof(event_count_)).then([this]() {
    drain();
    return pump();
  });
}

void Mailbox::drain() {
  std::deque<kj::Function<void()>> posted;
  std::vector<uint64_t> signalled;
  {
    MutexLock lock(remote_->mutex_);
    remote_->woken_ = false;
    posted.swap(remote_->posted_);
    signalled.swap(remote_->signalled_);
  }
  for (uint64_t ticket : signalled) {
    auto it = expected_.find(ticket);
    if (it == expected_.end()) continue;
    auto fulfiller = kj::mv(it->second);
    expected_.erase(it);
    fulfiller->fulfill();
  }
  for (auto& fn : posted) {
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&fn]() { fn(); })) {
      KJ_LOG(ERROR, "a function posted to an event loop threw", *e);
    }
  }
}

}  // namespace capstan::async
