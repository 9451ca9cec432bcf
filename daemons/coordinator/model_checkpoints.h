// ModelCheckpoints: saving and restoring the whole model (see
// checkpointing.h for the files): the parameter-server variables (values,
// optimizer slots and steps; a table's rows), the strategies' mirrored
// variables and the per-worker iterators' positions.
//
// save     the checkpoint's .tmp directory is made; with per-worker
//          datasets, dispatch pauses until no closure or step runs and the
//          iterators' positions are read (so that the variables saved hold
//          the effect of every element the saved iterators handed out);
//          every parameter server snapshots its shards (copy-on-write: the
//          pause is that and no more) and rank 0 of each strategy writes
//          its mirrored variables' file (Strategies::save); dispatch resumes
//          while each server writes its own file; the coordinator writes
//          the iterators' file and commits the manifest, with the servers'
//          and replicas' sizes and CRC32Cs, last. No variable or table byte
//          passes through the coordinator.
// restore  variables the program has not created (again) are placed with
//          the checkpoint's number of shards; every variable is checked
//          against the manifest (strict: one it lacks is an error; else it
//          keeps its value and is listed); each parameter server reads its
//          shards as placed now from the files itself (creating those it
//          lacks), the checkpoint becomes the strategies' seeds (the next
//          group's source reads the mirrored variables from it), and
//          the iterators are put back where the checkpoint has them.
//
// Example:
//   ModelCheckpoints checkpoints(variables, strategies, datasets, workers, pool, pause_dispatch);
//   auto path = checkpoints.save("/ckpt", 100, 3).wait(ws);   // "/ckpt/ckpt-100"
//   auto restored = checkpoints.restore("/ckpt", false).wait(ws);
//
// Not thread-safe: the Coordinator uses it on its loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_MODEL_CHECKPOINTS_H_
#define CAPSTAN_DAEMONS_COORDINATOR_MODEL_CHECKPOINTS_H_

#include <boost/asio/thread_pool.hpp>
#include <kj/async.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "checkpoint/checkpoint.h"
#include "daemons/coordinator/checkpointing.h"
#include "daemons/coordinator/per_worker_datasets.h"
#include "daemons/coordinator/ps_variables.h"
#include "daemons/coordinator/requests.h"
#include "daemons/coordinator/strategies.h"
#include "daemons/coordinator/workers.h"

namespace capstan::coordinator {

class ModelCheckpoints {
 public:
  // Stops new closures and steps; resolves, once none runs, to a guard that
  // lets them start again when it goes (Coordinator::pause_dispatch).
  using PauseDispatch = std::function<kj::Promise<std::shared_ptr<void>>()>;
  // Everything given must outlive this.
  ModelCheckpoints(PsVariables& variables, Strategies& strategies, PerWorkerDatasets& datasets, const Workers& workers,
                   boost::asio::thread_pool& pool, PauseDispatch pause_dispatch);

  // Writes directory/ckpt-<step>, keeping `max_to_keep`; its path.
  kj::Promise<Result<std::string>> save(std::string directory, int64_t step, int max_to_keep);
  // How the last save that succeeded went: how long dispatch paused for it
  // (0 without per-worker datasets: nothing paused), and how long it took
  // in all; wall-clock milliseconds.
  struct SaveTimes {
    double pause_ms = 0;
    double total_ms = 0;
  };
  const SaveTimes& last_save() const { return last_save_; }
  // Restores the checkpoint at `path` (or the newest in the directory
  // `path`); the result names the one restored.
  kj::Promise<Result<RestoredCheckpoint>> restore(std::string path, bool strict);

 private:
  using Reader = std::shared_ptr<checkpoint::CheckpointReader>;
  struct Opened {
    std::string path;  // resolved
    Reader reader;
  };
  // What restore reads from the checkpoint (on the pool).
  struct Read {
    std::string path;
    int64_t step = 0;
    std::vector<VariableState> states;
    std::vector<std::string> missing;
    Strategies::Restore mirrored;
    std::map<std::string, std::string> iterators;
  };
  // A save's snapshots: the parameter servers' (their files being written)
  // and the mirrored variables' files (written by the workers).
  struct Snapshot {
    PsVariables::ServerSave servers;
    Strategies::MirroredSave mirrored;
  };
  // Has the parameter servers snapshot their shards and the strategies'
  // replicas write their files (into `directory`).
  kj::Promise<Result<Snapshot>> snapshot(std::string directory);
  // Checks the checkpoint against the variables (those placed now and
  // `absent`, placed for the restore) and reads the mirrored variables and
  // the iterators (on the pool).
  kj::Promise<Result<Read>> read(Opened opened, bool strict, const std::vector<PlacedVariable>& absent);
  // Has the parameter servers read their shards, records `absent`, seeds
  // the strategies and puts the workers' iterators back.
  kj::Promise<Result<RestoredCheckpoint>> apply(Read read, std::vector<PlacedVariable> absent);

  PsVariables& variables_;
  Strategies& strategies_;
  PerWorkerDatasets& datasets_;
  const Workers& workers_;
  boost::asio::thread_pool& pool_;
  const PauseDispatch pause_dispatch_;
  SaveTimes last_save_;
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_MODEL_CHECKPOINTS_H_
