// Mirrored variables (TF's MirroredVariable under MultiWorkerMirroredStrategy):
// every rank of a collective group holds a copy of each variable. They start
// identical (rank 0's initial values are broadcast), and each step
// apply_gradients() all-reduces the ranks' gradients (MEAN, fused into few
// exchanges) and every replica applies the same update with the same
// optimizer code the parameter servers run, so the replicas stay
// bit-identical. checksum()/verify_replicas() check that they are.
//
//   auto group = cluster->join_group("dense", 2, rank).value();
//   auto vars = capstan::MirroredVariables::create(*group, {{"w", w0, capstan::Optimizer::adam(1e-3)}}).value();
//   for (...) {
//     ... gradient of this rank's mean loss on its batch ...
//     CAPSTAN_RETURN_IF_ERROR(vars->apply_gradients({grad_w}));   // the global batch's mean gradient
//   }
//
// After a rank is lost, the survivors form a new group (join_group under the
// same name: the next generation) and call set_group(): a rank that kept the
// variables (source) broadcasts them, with the optimizer slots and the step,
// to every member; a rank that (re)joins with nothing calls join() instead.
// recovery_source() tells every member which rank that is.
//
// Exactly-once input (MirroredInput, below): every process holds the same
// finite dataset; each step, each rank reads its share of the next global
// batch at input_position(), which advances with the update that used it
// and travels with the variables (set_group, join). A step that fails
// advances nothing, so the next one reads the same examples again; a
// process restarted by its supervisor rejoins (join_group under the same
// name, then join()) and reads on from the group's position.
//
//   auto input = capstan::MirroredInput::read(examples, {.global_batch = 256, .seed = 7}).value();
//   while (vars->input_position() < epochs * input->size()) {
//     Element batch = input->next(*group, *vars).value();   // this rank's share
//     ... gradients of this rank's mean loss on `batch` ...
//     Status s = vars->apply_gradients(grads);              // advances input_position()
//     if (s.code() == StatusCode::kUnavailable) {           // a rank was lost
//       group = cluster->join_group("dense", n, rank).value();   // waits for its restart
//       int source = capstan::MirroredVariables::recovery_source(*group, vars.get()).value();
//       vars->set_group(*group, source).ok();
//     }
//   }
//
// Thread-safety: one thread at a time (a training loop).
#ifndef CAPSTAN_MIRRORED_H_
#define CAPSTAN_MIRRORED_H_

#include "capstan/export.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capstan/collectives.h"
#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan/training.h"

namespace capstan CAPSTAN_API {

class FunctionRegistry;
namespace data {
class Dataset;
}

struct MirroredVariableSpec {
  std::string name;
  Tensor initial;  // float32 or float64; rank 0's is what every replica starts from
  Optimizer optimizer;
};

class MirroredVariables {
 public:
  // Collective: every rank of `group` calls it with the same names, dtypes,
  // shapes and optimizers (InvalidArgument otherwise).
  static Result<std::unique_ptr<MirroredVariables>> create(Communicator& group,
                                                           std::vector<MirroredVariableSpec> specs);
  // A rank that (re)joins a group the others moved to with set_group():
  // the variables of `specs` (values ignored), then every value, slot and
  // the step from rank `source`. The others call set_group(group, source) at
  // the same time.
  static Result<std::unique_ptr<MirroredVariables>> join(Communicator& group, std::vector<MirroredVariableSpec> specs,
                                                         int source);
  // Collective on a group formed after a failure (or at a start that may
  // be a restart): every member passes the variables it holds, or nullptr
  // (a process that starts with nothing). Returns the rank every member
  // takes the variables from: of those holding some, the one with the
  // fewest steps applied (the last step every holder finished; a holder
  // ahead of it drops its extra update, and the input position with it),
  // the lowest rank on a tie. Holders then call set_group(group, source),
  // the others join(group, specs, source). NotFound when no member holds
  // any (a fresh start: create()).
  static Result<int> recovery_source(Communicator& group, const MirroredVariables* held);
  ~MirroredVariables();

  // The variables' names, in creation order.
  std::vector<std::string> names() const;
  // The current value; updated in place by apply_gradients() and
  // apply_averaged_gradients() (copy it to keep a snapshot; a view of its
  // buffer follows the training). set_group() and restore_checkpoint()
  // put new buffers in place: take value() again after them. NotFound for
  // an unknown name.
  Result<Tensor> value(const std::string& name) const;
  // Updates applied so far.
  int64_t step() const;
  // The examples the updates so far trained on, as a position in the step
  // input's global order (MirroredInput): epoch e of an input of N
  // examples is positions [e*N, (e+1)*N). 0 without a MirroredInput.
  int64_t input_position() const;
  // The global batch the next update trains on (MirroredInput::next sets
  // it): the next update that succeeds advances input_position() by it;
  // a failed one leaves it pending. InvalidArgument when < 0.
  Status set_step_examples(int64_t examples);

  // This rank's weight in the mean of the ranks' gradients: the mean
  // apply_gradients() all-reduces is (1/n) * sum of w_r * g_r, which is the
  // global batch's mean gradient when each g_r is the mean over rank r's
  // own b_r examples and w_r = b_r * n / B (B examples in all). 1 (equal
  // shares) by default. A MirroredStrategy step with a constant global
  // batch split unevenly sets it for its closure (MirroredModule's buckets
  // apply it too). InvalidArgument when not finite or < 0.
  Status set_gradient_weight(double weight);
  double gradient_weight() const;

  // Collective: one dense gradient per variable, in creation order, of this
  // rank's mean loss. They are averaged over the ranks (weighted by
  // gradient_weight()), then every replica applies its variable's
  // optimizer.
  Status apply_gradients(const std::vector<Tensor>& gradients);
  // The same at options.learning_rate instead of the optimizers' own rates
  // (every variable's; InvalidArgument naming it, before any collective,
  // when not finite or < 0).
  Status apply_gradients(const std::vector<Tensor>& gradients, const ApplyOptions& options);
  // The same update, for gradients the caller already averaged over the
  // ranks (e.g. all-reduced with MEAN in buckets while backward ran, as
  // capstan::torch::MirroredModule does): no collective here. Every rank
  // must pass bit-identical gradients, or the replicas diverge
  // (verify_replicas() tells). InvalidArgument, naming the variable, for a
  // gradient of the wrong count, dtype or shape; nothing is applied then.
  Status apply_averaged_gradients(const std::vector<Tensor>& gradients);
  Status apply_averaged_gradients(const std::vector<Tensor>& gradients, const ApplyOptions& options);

  // A digest of every value, slot, the step and the input position: equal
  // on every rank when the replicas are identical.
  uint64_t checksum() const;
  // Collective: OK when every rank's checksum is this rank's; DataLoss
  // listing the ranks that differ.
  Status verify_replicas();

  // Collective on the new group: from now on use `group`, and take every
  // value, slot, the step and the input position from its rank `source` (a
  // rank that still holds the variables). Every member must have created
  // the same variables.
  Status set_group(Communicator& group, int source);

  // Checkpoints in the parameter servers' format (safetensors + manifest,
  // capstanctl-readable), written through the parameter servers of
  // `cluster`: rank 0 puts the values into parameter-server variables of the
  // same names (created with the same optimizers when missing) and has the
  // coordinator save a checkpoint. restore_checkpoint() restores one into
  // those variables and broadcasts rank 0's reading. A model trained on
  // parameter servers therefore restores into mirrored training, and back.
  // The mirrored optimizer slots are not carried (they start afresh after a
  // restore); the checkpoint also holds the cluster's other variables.
  // Collective; save returns the checkpoint's path on rank 0 and "" on the
  // others.
  Result<std::string> save_checkpoint(ClusterCoordinator& cluster, const std::string& directory, int64_t step,
                                      int max_to_keep = 5);
  // Returns the checkpoint's step, which becomes step().
  Result<int64_t> restore_checkpoint(ClusterCoordinator& cluster, const std::string& path);

  struct CAPSTAN_HIDDEN Impl;
  // Capstan's worker-servers move whole replicas (values, slots, step) in
  // and out (lib/training/mirrored_access.h).
  struct CAPSTAN_HIDDEN Access;
  friend struct Access;

 private:
  explicit MirroredVariables(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A step input's options (MirroredStrategy::distribute_step_input,
// MirroredInput::read): exactly one batch size > 0.
struct StepInputOptions {
  // constant_global_batch: every step trains on this many examples, split
  // among the live replicas (as evenly as it goes; each replica's gradient
  // is weighted by its share, so the optimizer sees the global batch's
  // mean gradient whatever the replicas).
  int64_t global_batch = 0;
  // Or each replica takes this many (TF's behaviour: the step's batch
  // grows and shrinks with the replicas).
  int64_t per_replica_batch = 0;
  // Each epoch visits the examples in a fresh permutation drawn from the
  // seed and the epoch (a global shuffle); false: the dataset's order.
  bool shuffle = true;
  uint64_t seed = 0;
};

// The element indices (in the dataset's order) of a step input's positions
// [start, start + count), for an input of `size` elements read with
// `options`: what the replicas of the steps that consumed them trained on.
// A MirroredStrategy program learns a failed step's positions from the next
// step (its PerReplica::input_position less its global batch, when that is
// past where the program was): the group kept that step's update.
std::vector<int64_t> step_input_indices(int64_t size, const StepInputOptions& options, int64_t start, int64_t count);

// Exactly-once input for a multi-client group (see the top of this file):
// every element of a finite, deterministic dataset held in this process,
// and each step's share of this rank, read at the group's input position.
// What holds: every example is trained on exactly once per epoch across
// failures and restarts, as long as every process reads the same elements
// in the same order (a dataset whose order or content differs between runs
// or processes, e.g. an unseeded shuffle, breaks it: the shares would not
// partition the epoch). Not thread-safe.
class MirroredInput {
 public:
  // Reads every element of `examples` (which must end: no repeat(); steps
  // go on through the epochs by themselves). FailedPrecondition when they
  // take more than `memory_budget_bytes`, or there are none;
  // InvalidArgument unless exactly one of options' batch sizes is > 0.
  static Result<std::unique_ptr<MirroredInput>> read(const data::Dataset& examples, StepInputOptions options,
                                                     const FunctionRegistry* functions = nullptr,
                                                     int64_t memory_budget_bytes = int64_t{1} << 30);
  ~MirroredInput();

  // Examples in one epoch.
  int64_t size() const;
  // A step's global batch in a group of `replicas`.
  int64_t global_batch(int replicas) const;
  // This rank's share of the step at vars.input_position(): the positions
  // after the shares of the ranks before it, its elements stacked into a
  // batch. Sets vars' gradient weight (the share's weight in the global
  // batch's mean) and step examples (the global batch), so that the
  // update that follows commits the step's input. Not collective.
  // FailedPrecondition when the global batch has fewer examples than the
  // group has ranks.
  Result<Element> next(const Communicator& group, MirroredVariables& vars);

  struct CAPSTAN_HIDDEN Impl;

 private:
  explicit MirroredInput(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace capstan

#endif  // CAPSTAN_MIRRORED_H_
