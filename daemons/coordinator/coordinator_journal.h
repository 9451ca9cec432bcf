// CoordinatorJournal: what the coordinator writes to its journal
// (config.work_dir; DurableLog keeps the files) and how a record reads back.
// The records are CoordinatorUpdate messages (coordinator_journal.capnp);
// this is the one place that builds and parses them.
//
// What is kept, and why (a restarted coordinator must not forget it):
//   variables      their shards' placement and optimizer (the values stay on
//                  the parameter servers), the initializer that filled them
//                  and whether the program still owes their value (a
//                  variable is journaled again once written), and the
//                  placer's round robin;
//   datasets       per-worker datasets with their ids, names and uids;
//   last checkpoint the one a lost parameter server is restored from;
//   closures       every closure scheduled (with the program's request id),
//                  how each ended (its value or error), the errors raised to
//                  the program and the values released. A restarted
//                  coordinator queues again the closures that had not ended
//                  (at-least-once, as when a worker dies) and keeps the
//                  values not yet released;
//   strategies     each strategy (MirroredStrategy) at its creation, at each
//                  group formed and when a restore seeds it: its variables'
//                  specs, options, the seed no group has taken yet (the
//                  initial values inline, up to 32 MiB; a restored
//                  checkpoint's path), the last group's epoch, members (by
//                  task index) and steps. Not each step: the replicas hold
//                  their step, and a restarted coordinator's first step
//                  forms a group from the last one's survivors.
//
// Variables, datasets, strategies and the last checkpoint change rarely: each record is
// appended and fsynced before the change is applied. Closures change often:
// their records are group-committed (DurableLog::enqueue), and a schedule
// is answered once its record is durable (synced()). A compacted journal is
// the state as records (closure_state_record and queue_state_record stand
// for the closure records).
//
// Without a work_dir the journal is closed: every write is a no-op (OK).
//
// Example:
//   CoordinatorJournal journal;
//   std::vector<std::string> replay;
//   journal.open(work_dir, pool, log, compaction, &replay);
//   for (auto& r : replay) apply(decode_record(r, num_ps).value());
//   journal.scheduled(id, "train_step", args, owner);
//   journal.synced().wait(ws);
//
// Not thread-safe: the Coordinator uses it on its loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_COORDINATOR_JOURNAL_H_
#define CAPSTAN_DAEMONS_COORDINATOR_COORDINATOR_JOURNAL_H_

#include <boost/asio/thread_pool.hpp>
#include <kj/async.h>
#include <spdlog/logger.h>

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "capstan/status.h"
#include "daemons/coordinator/closure_queue.h"
#include "daemons/coordinator/durable_log.h"
#include "daemons/coordinator/per_worker_datasets.h"
#include "daemons/coordinator/ps_variables.h"
#include "daemons/coordinator/strategies.h"

namespace capstan::coordinator {

// ---- Records, as they read back
struct VariableCreated {
  PlacedVariable variable;
  int64_t placer_counter = 0;
};
struct DatasetAdded {
  int64_t id = 0;
  PerWorkerDataset dataset;
};
struct LastCheckpointSet {
  std::string path;
};
struct ClosureScheduled {
  int64_t id = 0;
  std::string function;
  std::string args;
  ClosureQueue::Owner owner{};
};
struct ClosureFinished {
  int64_t id = 0;
  Result<std::string> result = std::string();  // the value, or the error it raised
};
struct ErrorTaken {};
struct ClosureReleased {
  int64_t id = 0;
};
// A compacted journal's closure, and its queue's pending error and next id.
struct ClosureSnapshot {
  ClosureQueue::Snapshot::Entry entry;
};
struct QueueSnapshot {
  Status pending_error;
  int64_t next_id = 1;
};
// A strategy as it is now (a later one of a name replaces the earlier).
struct StrategyJournaled {
  Strategies::Journaled strategy;
};
using JournalRecord = std::variant<VariableCreated, DatasetAdded, LastCheckpointSet, ClosureScheduled, ClosureFinished,
                                   ErrorTaken, ClosureReleased, ClosureSnapshot, QueueSnapshot, StrategyJournaled>;

// Parses a record. DataLoss for one that does not parse, of a kind this
// coordinator does not know, or with values no record has (a closure id
// <= 0, an unknown state or error code); FailedPrecondition for a variable
// with a shard beyond `num_ps` parameter servers (started with another ps
// list). A strategy's record is DataLoss when its specs, settings or
// initial values do not read back (or do not match one another).
Result<JournalRecord> decode_record(const std::string& record, int num_ps);

// ---- Records, as they are written
std::string variable_record(const PlacedVariable& variable, int64_t placer_counter);
std::string dataset_record(int64_t id, const PerWorkerDataset& dataset);
std::string last_checkpoint_record(const std::string& path);
std::string closure_state_record(const ClosureQueue::Snapshot::Entry& entry);
std::string queue_state_record(const Status& pending_error, int64_t next_id);
std::string strategy_record(const Strategies::Journaled& strategy);

class CoordinatorJournal {
 public:
  // Opens the journal of `work_dir` and puts its records in *replay (see
  // DurableLog::open for the errors).
  Status open(const std::string& work_dir, boost::asio::thread_pool& pool, std::shared_ptr<spdlog::logger> log,
              DurableLog::Compaction compaction, std::vector<std::string>* replay);
  // Open (work_dir set).
  bool durable() const { return log_ != nullptr; }
  // The failure of a batch: the coordinator refuses changes from then on.
  Status broken() const;
  // Resolves once every closure change so far is fsynced, or to the
  // journal's failure; at once when closed.
  kj::Promise<Status> synced();
  [[nodiscard]] Status compact_if_due();

  // Rare changes: written and fsynced before they return.
  [[nodiscard]] Status variable(const PlacedVariable& variable, int64_t placer_counter);
  [[nodiscard]] Status dataset(int64_t id, const PerWorkerDataset& dataset);
  [[nodiscard]] Status last_checkpoint(const std::string& path);
  [[nodiscard]] Status strategy(const Strategies::Journaled& strategy);

  // Closure changes, group-committed in the order of the calls.
  void scheduled(int64_t id, const std::string& function, const std::string& args, ClosureQueue::Owner owner);
  // After queue.complete() ended closure `id` (kDone or kFailed, with
  // `error`): its value or error. A closure the program released has no
  // record left: its end is journaled without a value, so a restarted
  // coordinator neither runs it again nor keeps anything for it.
  void finished(int64_t id, const Status& error, const ClosureQueue& queue);
  void released(int64_t id);
  // The pending error was raised to the program (queue.take_error()).
  void error_taken();

 private:
  std::unique_ptr<DurableLog> log_;  // null: closed
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_COORDINATOR_JOURNAL_H_
