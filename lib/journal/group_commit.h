// Group commit over a JournalWriter: records are queued as their changes are
// made, and a caller that may not answer before its record is durable waits
// for it. The first waiter writes everything queued with one append_batch
// (one fsync); records queued while that fsync is in flight go out together
// with the next one. So N changes arriving during one fsync cost two fsyncs,
// not N (LevelDB's DBImpl::Write; the coordinator's closure journal).
//
//   GroupCommitter journal(std::move(writer));
//   uint64_t ticket = journal.enqueue(encode(update));   // never blocks on disk
//   state.apply(update);
//   ... on another thread, before answering:
//   CAPSTAN_RETURN_IF_ERROR(journal.wait_durable(ticket));
//
// A failed write or fsync breaks the journal for good (JournalWriter's rule):
// every waiter whose records were not durable gets the failure, and so does
// every later one; health() says so before a change is made. Reopen (i.e.
// restart) to recover.
//
// Thread-safe. The JournalWriter is used by one waiting thread at a time.
#ifndef CAPSTAN_LIB_JOURNAL_GROUP_COMMIT_H_
#define CAPSTAN_LIB_JOURNAL_GROUP_COMMIT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "journal/journal.h"
#include "sync/mutex.h"

namespace capstan::journal {

class GroupCommitter {
 public:
  explicit GroupCommitter(std::unique_ptr<JournalWriter> writer);
  // Writes what is still queued (a clean shutdown loses nothing), ignoring
  // a failure: nobody waits for those records any more.
  ~GroupCommitter();
  GroupCommitter(const GroupCommitter&) = delete;
  GroupCommitter& operator=(const GroupCommitter&) = delete;

  // Queues `record` after every record queued before it and returns its
  // ticket: 1 for the first record, then 2, 3, ...
  uint64_t enqueue(std::string record) LOCKS_EXCLUDED(mutex_);
  // The ticket of the last record queued (0: none yet).
  uint64_t last_ticket() const LOCKS_EXCLUDED(mutex_);
  // Whether records up to `ticket` are durable already.
  bool is_durable(uint64_t ticket) const LOCKS_EXCLUDED(mutex_);
  // Blocks until records up to `ticket` are durable (OK), writing them (and
  // all queued with them) if no other thread is; or returns the failure
  // that broke the journal.
  [[nodiscard]] Status wait_durable(uint64_t ticket) LOCKS_EXCLUDED(mutex_);
  // OK, or kFailedPrecondition naming the failure that broke the journal.
  [[nodiscard]] Status health() const LOCKS_EXCLUDED(mutex_);
  // Batches written (each one append_batch: one fsync), for tests and metrics.
  int64_t batches_written() const LOCKS_EXCLUDED(mutex_);

 private:
  // Constant after construction; used only by the thread that set writing_.
  const std::unique_ptr<JournalWriter> writer_;

  mutable Mutex mutex_;
  CondVar written_;  // signalled when a batch is done
  std::vector<std::string> queue_ GUARDED_BY(mutex_);
  uint64_t queued_ GUARDED_BY(mutex_) = 0;   // tickets handed out
  uint64_t durable_ GUARDED_BY(mutex_) = 0;  // tickets durable
  bool writing_ GUARDED_BY(mutex_) = false;  // a thread is writing a batch
  Status broken_ GUARDED_BY(mutex_);
  int64_t batches_ GUARDED_BY(mutex_) = 0;
};

}  // namespace capstan::journal

#endif  // CAPSTAN_LIB_JOURNAL_GROUP_COMMIT_H_
