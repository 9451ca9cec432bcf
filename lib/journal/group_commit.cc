#include "journal/group_commit.h"

#include <utility>

namespace capstan::journal {

GroupCommitter::GroupCommitter(std::unique_ptr<JournalWriter> writer) : writer_(std::move(writer)) {}

GroupCommitter::~GroupCommitter() {
  uint64_t last = last_ticket();
  if (last > 0) (void)wait_durable(last);  // best effort: no caller waits for these
}

uint64_t GroupCommitter::enqueue(std::string record) {
  MutexLock lock(mutex_);
  queue_.push_back(std::move(record));
  return ++queued_;
}

uint64_t GroupCommitter::last_ticket() const {
  MutexLock lock(mutex_);
  return queued_;
}

bool GroupCommitter::is_durable(uint64_t ticket) const {
  MutexLock lock(mutex_);
  return durable_ >= ticket;
}

Status GroupCommitter::health() const {
  MutexLock lock(mutex_);
  if (broken_.ok()) return Status::Ok();
  return Status::FailedPrecondition("the journal is broken by an earlier failure: " + broken_.to_string());
}

int64_t GroupCommitter::batches_written() const {
  MutexLock lock(mutex_);
  return batches_;
}

Status GroupCommitter::wait_durable(uint64_t ticket) {
  MutexLock lock(mutex_);
  while (true) {
    if (durable_ >= ticket) return Status::Ok();
    if (!broken_.ok()) return broken_;
    if (writing_) {
      // Our record is in the batch being written or queued for the next.
      written_.wait(mutex_);
      continue;
    }
    // Write everything queued, ours included, outside the lock: callers keep
    // queueing (and waiting) while the fsync runs.
    writing_ = true;
    std::vector<std::string> batch = std::exchange(queue_, {});
    const uint64_t upto = queued_;
    mutex_.unlock();
    Status status = writer_->append_batch(batch);
    mutex_.lock();
    writing_ = false;
    if (status.ok()) {
      durable_ = upto;
      ++batches_;
    } else {
      broken_ = std::move(status);
    }
    written_.notify_all();
  }
}

}  // namespace capstan::journal
