// The census program's use of the LibTorch model, behind a header without
// torch: torch_program.cc loads libcensus_torch_program.so at run time.
#ifndef CAPSTAN_EXAMPLES_CENSUS_TORCH_PROGRAM_H_
#define CAPSTAN_EXAMPLES_CENSUS_TORCH_PROGRAM_H_

#include <capstan/collectives.h>
#include <capstan/mirrored.h>
#include <capstan/training.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace census {

// The optimizers of the model's two parts: the wide part (the wide table
// and the bias) and the deep part (the embeddings and the MLP).
struct Optimizers {
  capstan::Optimizer wide = capstan::Optimizer::adagrad(0.05);
  capstan::Optimizer deep = capstan::Optimizer::adam(0.0005);
};

// Whether the LibTorch part loads (built with CAPSTAN_TORCH, and LibTorch
// installed where this runs); if not, why.
bool torch_available();
std::string torch_unavailable_reason();
// Creates the LibTorch Wide & Deep model's variables on the parameter
// servers (torch_model.h: ps_options) with `optimizers`, its initial values
// from `seed`.
capstan::Status create_torch_variables(capstan::ClusterCoordinator& cluster, const Optimizers& optimizers,
                                       uint64_t seed);

// ---- The synchronous modes' replicas (one process each) -----------------------

struct TorchReplicaOptions {
  // false (sync): every parameter mirrored, the tables as dense parameters
  // (torch_model.h: Tables::kMirrored). true (hybrid): the wide table and
  // the embeddings on the parameter servers (pulled and pushed each step,
  // sparse), the MLP and the bias mirrored.
  bool hybrid = false;
  Optimizers mirrored;  // the mirrored parameters'
  Optimizers tables;    // hybrid: the tables' on the parameter servers
  uint64_t seed = 0;  // the initial weights (rank 0's are every replica's)
  // >= 0: a process that (re)joins a group whose other members hold the
  // model: its mirrored parameters come from that rank (MirroredVariables::
  // join; the others call set_group), and hybrid tables are not created.
  int join_source = -1;
};

// One training step's figures, this replica's batch.
struct StepFigures {
  double loss = 0;  // mean over the batch
  int64_t correct = 0;
  int64_t n = 0;
};

// This process's replica of the LibTorch model, trained with
// capstan::torch::MirroredModule (variable names "census/" + the module's
// parameter names). Not thread-safe: one training loop uses it.
class TorchReplica {
 public:
  virtual ~TorchReplica() = default;
  // Collective: one step on `batch` (wide_ids int64[n, 15], numeric
  // float32[n, 5], label float32[n]): forward, one backward whose dense
  // gradients are all-reduced while it runs, the same update on every
  // replica; in hybrid mode the tables' sparse gradients go to the
  // parameter servers.
  virtual capstan::Result<StepFigures> train_step(const capstan::Element& batch) = 0;
  // P(label = 1) of each example of `batch`, with this replica's values
  // (and, in hybrid mode, the parameter servers' rows). Not collective.
  virtual capstan::Result<std::vector<float>> predict(const capstan::Element& batch) = 0;
  // The mirrored parameters: checksum, verify_replicas, save_checkpoint.
  virtual capstan::MirroredVariables& variables() = 0;
  // Collective on a group re-formed after a failure: the parameters from
  // rank `source` (MirroredVariables::recovery_source), and the steps from
  // now on on `group` (which must outlive the replica, or the next
  // set_group).
  virtual capstan::Status set_group(capstan::Communicator& group, int source) = 0;
};

// Collective over `group`: every replica builds the model and mirrors it;
// in hybrid mode rank 0 first creates the tables on the parameter servers
// (kept as they are when they exist). With options.join_source, this
// process joins a group whose other members call set_group. `group` and `cluster` must outlive
// the replica. FailedPrecondition when the LibTorch part does not load.
capstan::Result<std::unique_ptr<TorchReplica>> create_torch_replica(capstan::Communicator& group,
                                                                    capstan::ClusterCoordinator& cluster,
                                                                    const TorchReplicaOptions& options);

// ---- The strategy modes (MirroredStrategy: the worker-servers are the replicas)

// The LibTorch model's mirrored variables, for MirroredStrategy::create:
// "census/" + the module's parameter names, the initial values from
// options.seed, the synchronous modes' optimizers (Adagrad on the wide
// part, Adam on the deep part). With options.hybrid the wide table and the
// embeddings go to the parameter servers first (created, or given their
// initial rows again) and the mirrored variables are the MLP and the bias;
// without, every parameter is mirrored, the tables included. The
// worker-servers train them with libcensus_torch_module.so's
// census_torch_sync_step. FailedPrecondition when the LibTorch part does
// not load.
capstan::Result<std::vector<capstan::MirroredVariableSpec>> torch_strategy_variables(
    capstan::ClusterCoordinator& cluster, const TorchReplicaOptions& options);

}  // namespace census

#endif  // CAPSTAN_EXAMPLES_CENSUS_TORCH_PROGRAM_H_
