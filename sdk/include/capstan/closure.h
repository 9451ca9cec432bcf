// What a closure sees while it runs on a worker.
//
//   CAPSTAN_MODULE(registry) {
//     registry.register_closure("train_step",
//         [](capstan::ClosureContext& ctx, const capstan::Element& args) -> capstan::Result<capstan::Element> {
//           auto* it = ctx.iterator(args.components[0]).value();   // this worker's iterator
//           auto batch = it->get_next().value();
//           auto w = ctx.read("w").value();
//           ... compute the gradient ...
//           CAPSTAN_RETURN_IF_ERROR(ctx.apply_gradients("w", grad));
//           return capstan::Element{{capstan::Tensor::scalar<float>(loss)}, {}};
//         });
//   }
//
// Variable calls go to the parameter servers holding the variable's shards,
// in parallel when it is partitioned; updates to one shard are atomic.
//
// A synchronous step (MirroredStrategy::run, capstan/strategy.h) runs the
// closure on every worker at once, as the replicas of one collective group
// (TF's ReplicaContext): group() reaches the others, mirrored() is this
// replica's copy of the strategy's variables.
//
//   registry.register_closure("sync_step", [](capstan::ClosureContext& ctx, const capstan::Element& args)
//       -> capstan::Result<capstan::Element> {
//     auto w = ctx.mirrored()->value("w").value();
//     ... this replica's gradient of its batch ...
//     CAPSTAN_RETURN_IF_ERROR(ctx.mirrored()->apply_gradients({grad_w}));   // all-reduced (MEAN)
//     return capstan::Element{{capstan::Tensor::scalar<float>(loss)}, {}};
//   });
//
// Thread-safety: one closure runs with one context at a time.
#ifndef CAPSTAN_CLOSURE_H_
#define CAPSTAN_CLOSURE_H_

#include "capstan/export.h"

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "capstan/collectives.h"
#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan/training.h"

namespace capstan CAPSTAN_API {

namespace data {
class Iterator;
}
class MirroredVariables;

class ClosureContext {
 public:
  virtual ~ClosureContext() = default;

  virtual int worker_index() const = 0;
  // The number of workers registered with the coordinator when this closure
  // was dispatched.
  virtual int num_workers() const = 0;
  // Retries of a closure after a worker failure run it again: `attempt` is
  // 1 for the first run.
  virtual int attempt() const = 0;

  // Cooperative cancellation (TF cancels running closures once another one
  // failed): true once the coordinator cancelled this run. A long closure
  // checks it between steps and returns early (any value or error: the
  // result of a cancelled run is abandoned and its fetch() raises
  // Cancelled). Side effects made before returning stay.
  virtual bool cancelled() const { return false; }
  // When the coordinator gives up on this run (its closure_timeout_ms; the
  // run then fails with DeadlineExceeded); time_point::max() when there is
  // no deadline. cancelled() turns true once it has passed.
  virtual std::chrono::system_clock::time_point deadline() const {
    return std::chrono::system_clock::time_point::max();
  }

  // The whole variable, gathered from its shards.
  virtual Result<Tensor> read(const std::string& variable) = 0;
  // Several whole variables, read in parallel (all their shards at once):
  // a model's parameters before a step. The values come in the order of
  // `variables`; the first error fails the call.
  virtual Result<std::vector<Tensor>> read_many(const std::vector<std::string>& variables) {
    std::vector<Tensor> values;
    for (const auto& variable : variables) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor value, read(variable));
      values.push_back(std::move(value));
    }
    return values;
  }
  // Rows `ids` (int32/int64, any shape) of a variable: an embedding lookup.
  virtual Result<Tensor> gather(const std::string& variable, const Tensor& ids) = 0;
  virtual Status assign(const std::string& variable, const Tensor& value) = 0;
  virtual Status assign_add(const std::string& variable, const Tensor& delta) = 0;
  // Applies the variable's optimizer with a dense gradient (its shape).
  // `options.learning_rate` travels with the update to the parameter servers,
  // whose optimizer uses it instead of its own rate (Keras: setting
  // optimizer.learning_rate before apply_gradients); a context that cannot
  // carry it answers Unimplemented rather than apply the wrong rate.
  // Overrides repeat the default `= {}`.
  virtual Status apply_gradients(const std::string& variable, const Tensor& gradient,
                                 const ApplyOptions& options = {}) = 0;
  // Dense gradients of several variables (gradients[i] for variables[i]),
  // sent in parallel after all are checked; each variable's update is atomic,
  // as with apply_gradients one by one, not the set.
  virtual Status apply_gradients_many(const std::vector<std::string>& variables,
                                      const std::vector<Tensor>& gradients, const ApplyOptions& options = {}) {
    if (variables.size() != gradients.size()) {
      return Status::InvalidArgument("apply_gradients_many: " + std::to_string(variables.size()) +
                                     " variables but " + std::to_string(gradients.size()) + " gradients");
    }
    for (size_t i = 0; i < variables.size(); ++i) {
      CAPSTAN_RETURN_IF_ERROR(apply_gradients(variables[i], gradients[i], options));
    }
    return Status::Ok();
  }
  // Sparse gradient: rows for `ids` (IndexedSlices); duplicates are summed.
  virtual Status apply_sparse_gradients(const std::string& variable, const Tensor& ids, const Tensor& rows,
                                        const ApplyOptions& options = {}) = 0;
  // An embedding table's rows for `ids` (int64 or int32, any shape): a
  // tensor of ids.shape() + [dim] (EmbeddingTableSpec in capstan/training.h).
  // insert (training): missing keys that pass admission are inserted with
  // their initial row; insert = false (evaluation): nothing is inserted and
  // missing keys get the default row. apply_sparse_gradients() updates a
  // table's rows.
  virtual Result<Tensor> lookup(const std::string& table, const Tensor& ids, bool insert = true) {
    return Status::Unimplemented("lookup('" + table + "'): this context has no embedding tables");
  }
  // This worker's iterator of the per-worker dataset `arg` stands for
  // (PerWorkerDataset::arg(), passed through schedule()).
  virtual Result<data::Iterator*> iterator(const Tensor& arg) = 0;

  // ---- Synchronous steps (MirroredStrategy::run); null / 0 / 1 elsewhere.
  // The step's group: every replica calls the same collectives in the same
  // order. If this closure fails, the group is aborted so that the other
  // replicas' collectives fail at once.
  virtual Communicator* group() { return nullptr; }
  // This replica's mirrored variables (apply_gradients all-reduces).
  virtual MirroredVariables* mirrored() { return nullptr; }
  // TF's replica_id_in_sync_group and num_replicas_in_sync.
  int replica_id() { return group() != nullptr ? group()->rank() : 0; }
  int num_replicas_in_sync() { return group() != nullptr ? group()->size() : 1; }
  // group()->all_reduce, or FailedPrecondition outside a synchronous step.
  Result<Tensor> all_reduce(const Tensor& tensor, ReduceOp op) {
    if (group() == nullptr) {
      return Status::FailedPrecondition(
          "all_reduce: this closure is not a synchronous step (run it with MirroredStrategy::run, not schedule)");
    }
    return group()->all_reduce(tensor, op);
  }
};

using ClosureFunction = std::function<Result<Element>(ClosureContext& context, const Element& args)>;

}  // namespace capstan

#endif  // CAPSTAN_CLOSURE_H_
