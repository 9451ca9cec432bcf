// ModelCheckpoints: saving and restoring the whole model (see
// checkpointing.h for the files): the parameter-server variables (values,
// optimizer slots and steps; a table's rows), the strategies' mirrored
// variables and the per-worker iterators' positions.
//
// save     with per-worker datasets, dispatch pauses until no closure or
//          step runs and the iterators' positions are read (so that the
//          variables saved hold the effect of every element the saved
//          iterators handed out); then the variables are read and dispatch
//          resumes while the files are written on the pool.
// restore  variables the program has not created (again) are created with
//          the checkpoint's number of shards; every variable's shards are
//          read from the checkpoint as placed now (strict: one it lacks is
//          an error; else it keeps its value and is listed), a parameter
//          server that restarted gets its shards back first, the mirrored
//          variables become the strategies' seeds, and the iterators are
//          put back where the checkpoint has them.
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
  // The variables and mirrored variables to save.
  kj::Promise<Result<std::vector<VariableState>>> snapshot();
  kj::Promise<Result<Read>> read(Opened opened, bool strict);
  // Writes what was read to the parameter servers, the strategies and the
  // workers' iterators.
  kj::Promise<Result<RestoredCheckpoint>> apply(Read read);

  PsVariables& variables_;
  Strategies& strategies_;
  PerWorkerDatasets& datasets_;
  const Workers& workers_;
  boost::asio::thread_pool& pool_;
  const PauseDispatch pause_dispatch_;
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_MODEL_CHECKPOINTS_H_
