// The other daemons as the coordinator sees them: each registered worker
// through a WorkerPeer, the parameter servers through ParameterServers. The
// Cap'n Proto implementations are in remote_peers.h; test_fakes.h has fakes.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_PEERS_H_
#define CAPSTAN_DAEMONS_COORDINATOR_PEERS_H_

#include <kj/async.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "capstan/phases.h"
#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan/training.h"
#include "checkpoint/manifest.h"
#include "types/replica.h"
#include "types/shard_checkpoint.h"
#include "types/table_rows.h"

namespace capstan::coordinator {

// One dispatch of a closure to a worker.
struct ClosureRun {
  int64_t closure_id = 0;
  std::string function;
  std::string args;  // serialized Element, as the program sent it
  int64_t placement_version = 0;
  uint32_t attempt = 1;
  uint32_t num_workers = 0;  // workers registered at dispatch
  int32_t worker_index = -1;  // the worker's task index (given or assigned)
  int64_t deadline_unix_ms = 0;  // 0: none
  // A synchronous step: the strategy and the epoch of its group.
  std::string strategy = "";
  int64_t epoch = 0;
  // The replica's share of the strategy's step input (Strategies).
  std::optional<training::StepInput> step_input = std::nullopt;
};

struct ClosureOutcome {
  // The closure's value (a serialized Element) or its error.
  Result<std::string> result = std::string();
  // The link to the worker broke: the worker is gone; `result` says why.
  bool worker_lost = false;
  // A synchronous step's closure read its step input.
  bool input_taken = false;
  // Where a value's run went on the worker (capstan/phases.h; queued: 0).
  PhaseTimes phases = {};
};

// A registered worker. A run_closure promise that rejects counts as a lost
// worker; a ping or dataset promise that rejects, as that call's error.
class WorkerPeer {
 public:
  virtual ~WorkerPeer() = default;
  virtual kj::Promise<ClosureOutcome> run_closure(ClosureRun run) = 0;
  // Several closures, run one after another on the worker; an outcome per
  // run, in order. A run after one that failed is not started (its outcome
  // is Aborted, so it is queued again). Any worker_lost outcome means the
  // worker is gone. The default runs them through run_closure in turn.
  virtual kj::Promise<std::vector<ClosureOutcome>> run_closures(std::vector<ClosureRun> runs);
  // Asks the worker to cancel a run of closure `closure_id` (its context's
  // cancelled() turns true; the run answers Cancelled). Best effort.
  virtual kj::Promise<Status> cancel_closure(int64_t closure_id) = 0;
  // The worker's advertised address, for the status page ("" when unknown).
  virtual std::string address() const { return {}; }
  // OK when the worker answered.
  virtual kj::Promise<Status> ping() = 0;
  // Per-worker datasets: a definition (SHARD_HINT already resolved for this
  // worker), or a dataset function with the worker's input context.
  // `uid` names the dataset across coordinator restarts (the worker keeps
  // an iterator it is sent again with the same uid).
  virtual kj::Promise<Status> create_dataset(int64_t dataset_id, std::string definition, uint64_t uid) = 0;
  virtual kj::Promise<Status> create_dataset_from_function(int64_t dataset_id, std::string function,
                                                           int num_workers, int worker_index, uint64_t uid) = 0;

  // Synchronous training: the worker's replica of a strategy (see
  // worker_server/replicas.h). A promise that rejects counts as a lost
  // worker, as run_closure's. The defaults answer Unimplemented (peers that
  // never take part in synchronous training, such as most test fakes).
  virtual kj::Promise<Result<training::ReplicaReport>> replica_status(std::string strategy) {
    return Result<training::ReplicaReport>(Status::Unimplemented("replica_status"));
  }
  virtual kj::Promise<Result<std::string>> prepare_replica(std::string strategy, int64_t epoch) {
    return Result<std::string>(Status::Unimplemented("prepare_replica"));
  }
  virtual kj::Promise<Result<training::ReplicaReport>> form_replica(training::ReplicaForm form) {
    return Result<training::ReplicaReport>(Status::Unimplemented("form_replica"));
  }
  virtual kj::Promise<Result<training::MirroredState>> read_replica(std::string strategy) {
    return Result<training::MirroredState>(Status::Unimplemented("read_replica"));
  }
  // Has the replica write its state into the checkpoint being saved in
  // `directory` (saveReplica).
  virtual kj::Promise<Result<training::SavedReplica>> save_replica(std::string strategy, std::string directory) {
    return Result<training::SavedReplica>(Status::Unimplemented("save_replica"));
  }
  virtual kj::Promise<Status> abort_replica(std::string strategy, int64_t epoch, std::string reason) {
    return Status::Unimplemented("abort_replica");
  }

  // The position of the worker's iterator of a per-worker dataset, and back
  // (model checkpoints). A promise that rejects is that call's error. The
  // defaults answer Unimplemented.
  virtual kj::Promise<Result<std::string>> save_iterator(int64_t dataset_id) {
    return Result<std::string>(Status::Unimplemented("save_iterator"));
  }
  virtual kj::Promise<Status> restore_iterator(int64_t dataset_id, std::string state) {
    return Status::Unimplemented("restore_iterator");
  }
};

// What a parameter server holds of an embedding table's shard.
struct TableContents {
  ps::TableRows rows;
  int64_t step = 0;
  int64_t version = 0;
};

// A shard whose value the parameter server computes: rows [first_row,
// first_row + rows) of the variable of `dtype` and `logical_shape` that
// `initializer` makes (a scalar: first_row 0, rows 1).
struct InitializedShard {
  Initializer initializer;
  DType dtype = DType::kInvalid;
  Shape logical_shape;
  int64_t first_row = 0;
  int64_t rows = 0;
};

// The parameter server tasks, numbered 0..size()-1. Must outlive the
// Coordinator.
class ParameterServers {
 public:
  virtual ~ParameterServers() = default;
  virtual int size() const = 0;
  virtual std::string address(int task) const = 0;
  // Resolves once `task` can be reached (at once when it can now).
  virtual kj::Promise<void> reachable(int task) = 0;
  // Resolves when the link to `task`, reachable now, breaks.
  virtual kj::Promise<void> unreachable(int task) = 0;
  virtual kj::Promise<Status> create_shard(int task, std::string name, Tensor initial,
                                           const Optimizer& optimizer) = 0;
  // create_shard without a value: the parameter server computes it.
  virtual kj::Promise<Status> create_initialized_shard(int task, std::string name, InitializedShard shard,
                                                       const Optimizer& optimizer) = 0;
  // The names of the shards `task` holds (embedding-table shards too).
  virtual kj::Promise<Result<std::set<std::string>>> list_shards(int task) = 0;

  // Embedding tables (the defaults answer Unimplemented).
  virtual kj::Promise<Status> create_table(int task, std::string name, EmbeddingTableSpec spec) {
    return Status::Unimplemented("create_table");
  }
  // The rows with a version > since; begin > 0 first tags later changes
  // with max(begin, version + 1). contents.version: the version before.
  virtual kj::Promise<Result<TableContents>> export_table(int task, std::string name, int64_t since, int64_t begin) {
    return Result<TableContents>(Status::Unimplemented("export_table"));
  }
  // Checkpoints each parameter server writes and reads itself (the
  // defaults answer Unimplemented). begin_save snapshots `items` and starts
  // writing them as `directory`/`file`; finish_save waits for that file:
  // its manifest entry (size, CRC32C).
  struct SaveStarted {
    uint64_t save_id = 0;
    std::vector<ps::SavedShard> shards;  // in request order
  };
  virtual kj::Promise<Result<SaveStarted>> begin_save(int task, std::string directory, std::string file,
                                                      std::vector<ps::SaveItem> items) {
    return Result<SaveStarted>(Status::Unimplemented("begin_save"));
  }
  virtual kj::Promise<Result<checkpoint::ManifestFile>> finish_save(int task, uint64_t save_id) {
    return Result<checkpoint::ManifestFile>(Status::Unimplemented("finish_save"));
  }
  // Fills (creating where absent) `items` from the committed checkpoint at
  // `path`.
  virtual kj::Promise<Status> restore_shards(int task, std::string path, std::vector<ps::RestoreItem> items) {
    return Status::Unimplemented("restore_shards");
  }
  // Peer snapshots (issue 34 item 5; the defaults answer Unimplemented).
  // send_peer_snapshot: `task` sends the parameter server at `holder` its
  // changes since the last delta that holder acknowledged (all, with
  // `full`).
  struct PeerSent {
    int64_t sequence = 0;
    bool full = false;
    int64_t shards = 0;
    uint64_t bytes = 0;
  };
  virtual kj::Promise<Result<PeerSent>> send_peer_snapshot(int task, std::string holder, bool full) {
    return Result<PeerSent>(Status::Unimplemented("send_peer_snapshot"));
  }
  // `task` (a replacement of `source_task`) creates `shards` from the copy
  // of source_task's shards held at `holder`.
  struct PeerRestored {
    int64_t sequence = 0;
    int64_t taken_ms = 0;  // when the source took the copy, ms since the epoch
    int64_t shards = 0;
  };
  virtual kj::Promise<Result<PeerRestored>> restore_from_peer(int task, std::string holder, int source_task,
                                                               std::vector<std::string> shards) {
    return Result<PeerRestored>(Status::Unimplemented("restore_from_peer"));
  }
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_PEERS_H_
