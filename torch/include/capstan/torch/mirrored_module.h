// Synchronous data-parallel training of a torch::nn::Module on Capstan's
// collectives (PyTorch's DistributedDataParallel; TF: a Keras model under
// MultiWorkerMirroredStrategy). Part of libcapstan_torch.so, like
// capstan/torch.h (whose to_torch/from_torch it uses).
//
// Every rank holds a replica of every parameter (a MirroredVariables of the
// same names); each step, every rank computes the gradient of its own
// batch's loss, the gradients are averaged over the ranks, and every rank
// applies the same optimizer, so the replicas stay bit-identical.
//
//   auto model = std::make_shared<Mlp>();
//   auto ddp = capstan::torch::MirroredModule::create(*group, *model,
//                                                     {.optimizer = capstan::Optimizer::adam(1e-3)}).value();
//   for (...) {
//     auto [x, y] = ...;                                   // this rank's batch
//     auto loss = ddp->train_step([&] { return ::torch::mse_loss(model->forward(x), y); }).value();
//   }
//
// Glossary:
//   replica  this rank's copy of a parameter's value, in MirroredVariables.
//            The module's parameter tensors are views of the replicas (no
//            copy): after a step the module already holds the new values.
//            The replicas are the truth: a parameter whose data the program
//            replaced (set_data with the same shape) is pointed back at its
//            replica at the next step. Writing into a parameter in place
//            writes the replica: do it on every rank alike.
//   bucket   gradients packed into one flat buffer (parameters in reverse
//            order of registration, which is roughly the order backward
//            produces their gradients; at most bucket_bytes each, the first
//            at most first_bucket_bytes; one dtype each), all-reduced (MEAN)
//            in one exchange. A hook on each parameter copies its gradient
//            into its bucket as soon as backward computes it; a complete
//            bucket is handed to Communicator::all_reduce_async at once,
//            while backward goes on with the layers below. Buckets are
//            launched in bucket order on every rank (a bucket completed
//            early waits for the ones before it), so every rank issues the
//            same collectives in the same order.
//   unused   a parameter that gets no gradient in a step (not reached from
//            this rank's loss). Its gradient counts as zero, so the other
//            ranks never wait for it (DDP's find_unused_parameters): with
//            find_unused_parameters, the loss's autograd graph is walked
//            before backward and the unreached parameters' zeros go into
//            their buckets at once; in any case, when backward returns, the
//            buckets not yet launched are finished with zeros and launched.
//            Its update is the mean of the ranks' gradients counting this
//            rank's as zero; one unused on every rank still takes a step
//            with a zero gradient (SGD: no change; Adam: its moments decay
//            and the value moves by them).
//
// Replicas that already exist (MirroredStrategy, capstan/strategy.h: the
// worker-server holds them and hands them to each step's closure as
// ctx.mirrored(), the group as ctx.group(), which may be another after a
// worker was lost): attach() binds the module to them without a
// collective, and each step names its group.
//
//   auto ddp = capstan::torch::MirroredModule::attach(*ctx.mirrored(), *model, {.prefix = "census/"}).value();
//   auto loss = ddp->train_step(*ctx.group(), [&] { return ...; }).value();
//
// A module on a CUDA device (every parameter and buffer on that one
// device; module->to(device) before create or attach) trains the same way,
// with three differences: the parameters are copies of the replicas (which
// stay in host memory, where the optimizer runs and checkpoints read them),
// refreshed after each update; the buckets live on the device, are filled
// by the hooks there and all-reduced through NCCL (capstan::torch::
// all_reduce) one after another once backward returns (not overlapped with
// it), then copied to the host for the update; and buffers are broadcast
// through NCCL, then copied to their replicas. Each step moves the
// gradients to the host and the parameters back (both over PCIe). The
// parameters do not alias the replicas there: write a replica
// (variables()) to change a value between steps; a write into a CUDA
// parameter is overwritten by the next update.
//
// Parameters that do not require grad are mirrored (rank 0's values at
// create) and never updated. Every rank must call train_step the same
// number of times.
//
// Buffers (named_buffers(): BatchNorm's running_mean, running_var,
// num_batches_tracked) change in each rank's forward, from its own batch.
// As PyTorch's DDP with broadcast_buffers=True, rank 0's buffers are
// broadcast to every rank in each step (here at its end, after the update:
// every rank then ends the step, and starts the next forward, with rank
// 0's statistics, which is also what checkpoints and verify_replicas see).
// Broadcast rather than averaged: it is what DDP does, exact for every
// dtype (num_batches_tracked is int64), and a mean of the ranks' running
// variances is not the variance of the global batch either (use a
// synchronized batch norm for that). A float32/float64 buffer is also
// mirrored: create() makes it a mirrored variable (prefix + its
// named_buffers() name, Optimizer::none()) that the buffer views, as a
// parameter views its replica, so save_checkpoint/restore_checkpoint and
// load_checkpoint (capstan/torch.h) carry the running statistics. attach()
// binds a buffer to a replica of its name when the replicas have one
// (created with Optimizer::none()); other buffers are only broadcast.
//
// Thread-safety: one thread at a time (a training loop), like the module.
#ifndef CAPSTAN_TORCH_MIRRORED_MODULE_H_
#define CAPSTAN_TORCH_MIRRORED_MODULE_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "capstan/collectives.h"
#include "capstan/mirrored.h"
#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan/training.h"

namespace capstan::torch {

struct MirroredOptions {
  // Variable name = prefix + parameter name ("encoder." + "0.weight").
  std::string prefix{};
  // The optimizer every replica applies, for every parameter not in
  // `optimizers` (keyed by parameter name, without the prefix).
  Optimizer optimizer = Optimizer::sgd(0.01);
  std::map<std::string, Optimizer> optimizers{};
  // Gradient buckets (DDP's bucket_cap_mb and its smaller first bucket,
  // which starts the first exchange early). Every rank must pass the same.
  int64_t bucket_bytes = 25 << 20;
  int64_t first_bucket_bytes = 1 << 20;
  // Walk the loss's graph before backward to find the parameters it will
  // not reach (see "unused" above). Off: no walk, correct all the same, but
  // a bucket holding an unused parameter (and every bucket after it) waits
  // until backward returns.
  bool find_unused_parameters = true;
  // Broadcast rank 0's buffers at the end of every step (DDP's
  // broadcast_buffers; see "Buffers" above). Every rank must pass the same.
  bool broadcast_buffers = true;
};

// What the steps did, for tests and logs.
struct MirroredStats {
  int64_t buckets = 0;  // fixed at create
  int64_t steps = 0;    // applied
  // Last step: buckets launched before backward returned (while it ran,
  // or, holding only unused parameters, just before it started), and those
  // launched after it returned (holding unused parameters' zeros).
  int64_t launched_in_backward = 0;
  int64_t launched_after_backward = 0;
  // Every step: all-reduces launched and bytes all-reduced by this rank.
  int64_t all_reduces = 0;
  int64_t all_reduce_bytes = 0;
};

class MirroredModule {
 public:
  // Collective: every rank of `group` calls it with a module of the same
  // parameter names, dtypes (float32 or float64) and shapes and the same
  // options (InvalidArgument otherwise, naming what differs). Rank 0's
  // parameter values become every replica's, and the module's parameters
  // become views of the replicas. `group` and `module` must outlive this
  // object.
  static Result<std::unique_ptr<MirroredModule>> create(Communicator& group, ::torch::nn::Module& module,
                                                        MirroredOptions options = {});
  // Not collective: binds `module` to `replicas` that exist already and are
  // identical on every rank (a MirroredStrategy made them so): each
  // parameter becomes a view of the replica named options.prefix + its
  // name. The replicas' own optimizers apply (options.optimizer and
  // options.optimizers are ignored); the bucket options must be the same
  // on every rank (not checked here: no collective). InvalidArgument,
  // naming the parameter and both dtypes and shapes, for a parameter
  // without a replica or whose replica differs in dtype or shape, and for
  // a replica that is no parameter (a step updates every replica). There
  // is no group until a step names one: train_step(group, loss).
  // `replicas` and `module` must outlive this object, or the object must
  // not be used once they are gone (destroying it is fine; it touches only
  // the module's hooks).
  static Result<std::unique_ptr<MirroredModule>> attach(MirroredVariables& replicas, ::torch::nn::Module& module,
                                                        MirroredOptions options = {});
  ~MirroredModule();
  MirroredModule(const MirroredModule&) = delete;
  MirroredModule& operator=(const MirroredModule&) = delete;

  // Collective: one training step. `loss` runs the user's forward and loss
  // on this rank's batch (one value, e.g. a mean); backward all-reduces
  // the gradients in buckets as they come; then every replica applies the
  // ranks' mean gradient. Returns the loss (this rank's, detached).
  //
  // Errors, with nothing applied: `loss` threw (InvalidArgument with its
  // message), returned more than one value or nothing that depends on a
  // parameter (InvalidArgument, naming the shape); the module's parameters
  // changed since create (FailedPrecondition naming the parameter and both
  // shapes, or the parameter added, removed or replaced). Those are found
  // before any collective: when every rank fails alike (the same program),
  // the group stays usable; a rank that fails alone leaves the others in
  // their step's all-reduce until CollectiveOptions::timeout (Unavailable),
  // unless the program calls group.abort(). A failure once buckets were
  // launched (backward threw, a collective failed) aborts the group.
  //
  // options.learning_rate: the rate every replica's optimizer applies in
  // this step instead of its own rate and schedule (fit's
  // LearningRateScheduler; MirroredVariables::apply_averaged_gradients).
  // Not finite or < 0: InvalidArgument naming it, before any collective.
  Result<::torch::Tensor> train_step(const std::function<::torch::Tensor()>& loss,
                                     const ApplyOptions& options = {});
  // The same step on `group`, which becomes this module's group from now
  // on (a strategy's step: ctx.group(), re-formed after a worker loss, with
  // the replicas already moved to it). FailedPrecondition from the plain
  // train_step(loss) of an attached module that was never given a group.
  Result<::torch::Tensor> train_step(Communicator& group, const std::function<::torch::Tensor()>& loss,
                                     const ApplyOptions& options = {});

  // A parameter's replica (name without the prefix): the buffer the
  // module's parameter views. NotFound for an unknown name.
  Result<Tensor> value(const std::string& parameter) const;
  // Delegates to the MirroredVariables: equal on every rank when the
  // replicas (values, optimizer slots, step) are identical.
  uint64_t checksum() const;
  // Collective: OK when every rank's checksum is this rank's; DataLoss
  // naming the ranks that differ.
  Status verify_replicas();
  // Collective on a re-formed group (MirroredVariables::set_group): values,
  // slots and step from rank `source`; the module follows.
  Status set_group(Communicator& group, int source);
  // The replicas themselves (checkpoints: save_checkpoint /
  // restore_checkpoint; the module follows them at the next step).
  MirroredVariables& variables();
  const MirroredStats& stats() const;

  struct Impl;

 private:
  explicit MirroredModule(std::unique_ptr<Impl> impl);
  // create and attach's common end: the views and the hooks.
  static Result<std::unique_ptr<MirroredModule>> finish(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace capstan::torch

#endif  // CAPSTAN_TORCH_MIRRORED_MODULE_H_
