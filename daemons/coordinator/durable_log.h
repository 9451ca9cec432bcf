// DurableLog: the coordinator's journal on disk (config.work_dir) and its
// group commit. It knows files and records, not what they mean: the
// coordinator writes the records (durable.cc) and replays them.
//
// Glossary:
//   record       one change, a serialized CoordinatorUpdate.
//   append_now   a rare change (a variable, a dataset, a checkpoint path):
//                written and fsynced before the call returns.
//   enqueue      a frequent change (the closure queue's): written with the
//                others enqueued meanwhile, one fsync per batch, on the pool.
//   generation   the journal in use: 0 is work_dir itself (a journal never
//                compacted), n is work_dir/journal-<n>, named by
//                work_dir/CURRENT.
//   compaction   once the journal holds Compaction::min_records records and
//                more than twice the live ones, the state (snapshot()) is
//                written as the next generation, fsynced, CURRENT replaced
//                to name it (written, fsynced, renamed, directory fsynced)
//                and the old generation deleted. A crash at any step leaves
//                CURRENT naming a whole journal; open() removes leftovers.
//
// Example:
//   std::vector<std::string> replay;
//   auto log = DurableLog::open(dir, pool, logger, compaction, &replay).value();
//   for (auto& r : replay) apply(r);
//   log->enqueue(record);
//   log->synced().wait(ws);   // OK once the record is fsynced
//
// Not thread-safe: every method runs on the thread of the KJ event loop it
// was opened on; the batches are written on the pool under the file's mutex.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_DURABLE_LOG_H_
#define CAPSTAN_DAEMONS_COORDINATOR_DURABLE_LOG_H_

#include <boost/asio/thread_pool.hpp>
#include <kj/async.h>
#include <spdlog/logger.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "sync/mutex.h"

namespace capstan::journal {
class JournalWriter;
}

namespace capstan::coordinator {

class DurableLog final : private kj::TaskSet::ErrorHandler {
 public:
  struct Compaction {
    int64_t min_records = 100000;
    // Records the state holds now (a compacted journal has about as many).
    std::function<int64_t()> live_records;
    // The state as records: the journal that replaces the one in use.
    std::function<std::vector<std::string>()> snapshot;
  };

  // Opens the journal of `work_dir` (the generation CURRENT names, else
  // work_dir itself), puts its records in *replay, and removes what a
  // compaction that crashed left behind. DataLoss for a damaged journal or
  // CURRENT naming a missing one; FailedPrecondition when another process
  // has it open.
  static Result<std::unique_ptr<DurableLog>> open(const std::string& work_dir, boost::asio::thread_pool& pool,
                                                  std::shared_ptr<spdlog::logger> log, Compaction compaction,
                                                  std::vector<std::string>* replay);
  ~DurableLog();
  DurableLog(const DurableLog&) = delete;
  DurableLog& operator=(const DurableLog&) = delete;

  // Writes the record and fsyncs it before returning.
  [[nodiscard]] Status append_now(const std::string& record);
  // Queues the record for the next batch (see the glossary).
  void enqueue(std::string record);
  // Resolves once every record enqueued so far is durable, or to the
  // failure that broke the log.
  kj::Promise<Status> synced();
  // Compacts at once when due (after the replay: snapshot() reads the state
  // it rebuilt).
  [[nodiscard]] Status compact_if_due();

  // The failure of a batch (OK while none failed): the coordinator refuses
  // changes from then on, and a restart reopens the journal.
  const Status& broken() const { return broken_; }
  int64_t records() const { return records_; }  // in the journal now (replayed, appended, enqueued)
  int64_t compactions() const { return compactions_; }
  int64_t generation() const;
  const std::string& work_dir() const { return work_dir_; }

 private:
  // The writer, used by the loop thread (append_now) and the pool (batches,
  // compactions). Shared with a batch in flight.
  struct File {
    Mutex mutex;
    std::unique_ptr<journal::JournalWriter> writer GUARDED_BY(mutex);
    int64_t generation GUARDED_BY(mutex) = 0;
  };
  DurableLog(std::string work_dir, boost::asio::thread_pool& pool, std::shared_ptr<spdlog::logger> log,
             Compaction compaction, std::shared_ptr<File> file);
  void taskFailed(kj::Exception&& exception) override;
  bool compaction_due() const;
  // Starts writing the queued records (or a compaction) unless a batch is
  // being written; the next starts when it ends.
  void flush();
  // Writes `records` as the next generation, makes CURRENT name it, swaps
  // the writer and deletes the old journal (any thread).
  static Status write_compacted(const std::string& work_dir, File& file, const std::vector<std::string>& records)
      LOCKS_EXCLUDED(file.mutex);

  const std::string work_dir_;
  boost::asio::thread_pool& pool_;
  const std::shared_ptr<spdlog::logger> log_;
  const Compaction compaction_;
  const std::shared_ptr<File> file_;

  int64_t records_ = 0;
  int64_t compactions_ = 0;
  std::vector<std::string> queue_;  // enqueued, not yet handed to a batch
  int64_t enqueued_ = 0;            // records enqueued so far
  int64_t durable_ = 0;             // of them, fsynced
  bool flushing_ = false;
  Status broken_;
  std::multimap<int64_t, kj::Own<kj::PromiseFulfiller<Status>>> waiters_;  // by records enqueued
  kj::TaskSet tasks_;  // last: its promises use everything above
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_DURABLE_LOG_H_
