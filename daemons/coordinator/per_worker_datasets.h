// PerWorkerDatasets: the coordinator's per-worker datasets (TF's
// create_per_worker_dataset), and their iterators on the workers. Each
// worker builds its own copy of every dataset: a definition (its SHARD_HINT
// resolved for the worker's task index) or a dataset function of the
// workers' modules. A dataset keeps its id and uid for good (journaled), so
// a restarted coordinator, and a program that reconnects and names it again,
// find the same iterators.
//
// The workers are handed in by each call (DatasetTarget: what is needed to
// reach one), in the coordinator's order; nothing here keeps a worker.
//
// Example:
//   PerWorkerDatasets datasets(expected_workers, log, journal_dataset);
//   int64_t id = datasets.add(dataset, registered_now).wait(ws).value();
//   datasets.send_all(newcomer, registered_count);   // a worker registers later
//   auto positions = datasets.iterator_states(registered_now).wait(ws);
//
// Not thread-safe: the Coordinator uses it on its loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_PER_WORKER_DATASETS_H_
#define CAPSTAN_DAEMONS_COORDINATOR_PER_WORKER_DATASETS_H_

#include <kj/async.h>
#include <kj/vector.h>
#include <spdlog/logger.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "daemons/coordinator/peers.h"

namespace capstan::coordinator {

// A per-worker dataset: a definition (SHARD_HINT resolved per worker) or
// the name of a dataset function in the workers' modules.
struct PerWorkerDataset {
  std::string definition;
  std::string function;
  std::string name;  // "": anonymous
  uint64_t uid = 0;  // random, journaled: the same dataset after a restart
  // A strategy's step input: each worker holds all of its elements and
  // reads the positions each step hands it, so it has no iterator position
  // to checkpoint (the position travels with the strategy's replicas).
  bool step_input = false;
};

// A registered worker, as the datasets reach it. `peer` is used only while
// a call is started.
struct DatasetTarget {
  int64_t id = 0;
  int task_index = 0;
  WorkerPeer* peer = nullptr;
};

class PerWorkerDatasets {
 public:
  // Called before a new dataset is added (the journal): an error refuses
  // the add, and the id is not used.
  using Journal = std::function<Status(int64_t id, const PerWorkerDataset& dataset)>;

  // Workers shard a dataset as one of max(expected_workers, registered).
  PerWorkerDatasets(int expected_workers, std::shared_ptr<spdlog::logger> log, Journal journal);

  // Adds `dataset` (its uid is drawn here) and sends it to `workers`, the
  // workers registered now; resolves to its id once each has been sent it
  // (a worker that fails to build it is logged). A named dataset that
  // exists with the same definition is handed back as it is (its iterators
  // keep their positions); AlreadyExists when the definition differs;
  // InvalidArgument for a name over 256 bytes.
  kj::Promise<Result<int64_t>> add(PerWorkerDataset dataset, const std::vector<DatasetTarget>& workers);
  // Sends every dataset to `worker`, one of `registered` workers.
  kj::Promise<void> send_all(const DatasetTarget& worker, size_t registered);

  // Each of `workers`' iterator position of each dataset, by
  // iterator_tensor_name(); a position a worker cannot give (a dataset read
  // through the data service, a worker lost meanwhile) is left out and logged.
  kj::Promise<std::map<std::string, std::string>> iterator_states(const std::vector<DatasetTarget>& workers);
  // Puts `workers`' iterators back where `states` has them; resolves to how
  // many. A worker that rejects a state fails the restore.
  kj::Promise<Result<int>> restore_iterators(std::map<std::string, std::string> states,
                                             const std::vector<DatasetTarget>& workers);

  // A dataset read back from the journal.
  void restore(int64_t id, PerWorkerDataset dataset);
  const std::map<int64_t, PerWorkerDataset>& all() const { return datasets_; }
  size_t size() const { return datasets_.size(); }
  bool empty() const { return datasets_.empty(); }

 private:
  kj::Promise<void> send(const DatasetTarget& worker, size_t registered, int64_t id, const PerWorkerDataset& dataset);

  const int expected_workers_;
  const std::shared_ptr<spdlog::logger> log_;
  const Journal journal_;
  std::map<int64_t, PerWorkerDataset> datasets_;
  int64_t next_id_ = 1;
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_PER_WORKER_DATASETS_H_
