// Synchronous training on the worker-servers: TensorFlow's
// MultiWorkerMirroredStrategy (strategy.run, strategy.reduce, mirrored
// variables, distributed datasets), driven from one training program
// through the coordinator, beside parameter-server training.
//
//   auto cluster = capstan::ClusterCoordinator::connect("10.0.0.1:7000").value();
//   auto strategy = capstan::MirroredStrategy::create(*cluster,
//       {{"dense/w", w0, capstan::Optimizer::adam(1e-3)}, {"dense/b", b0, capstan::Optimizer::adam(1e-3)}}).value();
//   auto input = strategy->distribute_dataset(pipeline).value();   // each replica its shard
//   for (int step = 0; step < steps; ++step) {
//     auto per_replica = strategy->run("train_step", {{input.arg()}, {}});
//     if (!per_replica.ok()) { ... a worker was lost: the next run goes on without it ... }
//     float loss = strategy->reduce(capstan::ReduceOp::kMean, *per_replica).value().flat<float>()[0];
//   }
//
// The closure ("train_step", in the workers' module) runs on every worker at
// once, each one a replica of a collective group; ctx.mirrored() is its copy
// of the variables, and apply_gradients() all-reduces the replicas'
// gradients (MEAN) and applies the same optimizer code the parameter
// servers run, so the replicas stay bit-identical (verify_replicas()).
//
// Beyond TF: a worker that dies or stops mid-step fails that step on the
// others within the collective deadline (never a hang), and the next run()
// re-forms the group from the live workers, without restarting anything;
// the variables stay where they were (in the surviving replicas' memory),
// at the last step every replica finished. A worker that comes back joins
// at the next step and receives the variables by broadcast. Mirrored
// variables go into the cluster's checkpoints in the parameter servers'
// format, so a model trained on parameter servers restores into mirrored
// training and back.
//
// A coordinator with a work_dir journals its strategies (their variables'
// specs, options, initial values until the first group takes them, and
// each group formed), so a kill -9 and a restart on the same address loses
// no strategy: the worker-servers keep their replicas, re-register, and the
// same program object goes on. create(), read_variable(), replicas() and
// verify_replicas() whose link breaks are sent again once reconnected (as
// closures are, within ClientOptions::connect_timeout). A run() whose link
// breaks is not: the step may have run on the workers and its values went
// with the coordinator, so run() waits until the coordinator answers again
// and returns Unavailable ("the step's outcome was lost"), as for a lost
// worker; the next run() forms the group again from the last step every
// replica finished, its step counter going on from the replicas' (never
// reset). A run() made while the coordinator is down waits for it (up to
// connect_timeout) and runs.
//
// Thread-safety: one thread at a time (a training loop); steps of one
// strategy run one after the other.
#ifndef CAPSTAN_STRATEGY_H_
#define CAPSTAN_STRATEGY_H_

#include "capstan/export.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capstan/collectives.h"
#include "capstan/mirrored.h"
#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan/training.h"

namespace capstan CAPSTAN_API {

namespace data {
class Dataset;
}

struct StrategyOptions {
  // The strategy's name: a program that reconnects finds it (and its
  // replicas' values) by name.
  std::string name = "mirrored";
  // A step waits (up to collective.timeout) until this many workers with
  // the step's closure are registered.
  int min_replicas = 1;
  // The replicas' collectives: deadline (also how long a step waits for
  // workers), transport, TCP streams.
  CollectiveOptions collective;
};

// TF's PerReplica: one step's values, by replica (replica r ran on the
// worker of task task_indexes[r]).
struct PerReplica {
  std::vector<Element> values;
  std::vector<int> task_indexes;
  int64_t step = 0;   // synchronous steps the strategy has run, this one included
  int64_t epoch = 0;  // the group the step ran in (a new one after each re-formation)
  // With a step input: the examples replica r took, and the positions of
  // the input consumed after this step (epoch e of an input of N examples
  // is positions [e*N, (e+1)*N)).
  std::vector<int64_t> examples;
  int64_t input_position = 0;
};

struct ReplicaStatus {
  int64_t worker_id = 0;
  int task_index = 0;
  int rank = 0;
  bool holds = false;  // the worker holds the variables
  int64_t step = 0;    // optimizer steps applied to them
  uint64_t checksum = 0;
  std::string error;   // why the worker did not answer; empty when it did
};

class MirroredStrategy {
 public:
  // Creates strategy options.name with `variables` (float32/float64; the
  // initial values are rank 0's, broadcast to every replica when the first
  // group forms), or, for a reconnecting program, finds it (AlreadyExists
  // when its variables differ, or a parameter-server variable has a name).
  static Result<std::unique_ptr<MirroredStrategy>> create(ClusterCoordinator& cluster,
                                                          std::vector<MirroredVariableSpec> variables,
                                                          StrategyOptions options = {});
  ~MirroredStrategy();

  // strategy.run: `function` on every live worker that has it, at once,
  // with `args`; their values by replica. Unavailable naming the workers
  // lost when one died or stopped answering during the step (call run()
  // again: it goes on with the others); the closure's own error when a
  // replica's closure failed; Unavailable when a durable coordinator
  // restarted during the step (see the header comment).
  Result<PerReplica> run(const std::string& function, const Element& args = {});
  // strategy.reduce: component `component` of every replica's value,
  // reduced element-wise (SUM, MEAN, MIN, MAX, PROD) into one tensor.
  static Result<Tensor> reduce(ReduceOp op, const PerReplica& values, size_t component = 0);

  // Replicas of the last step (TF's num_replicas_in_sync); 0 before one ran.
  int num_replicas_in_sync() const;
  // A mirrored variable's value (replica 0's).
  Result<Tensor> read_variable(const std::string& name);
  // Every replica of the current group: step and checksum.
  Result<std::vector<ReplicaStatus>> replicas();
  // OK when every replica holds the variables with the same checksum;
  // DataLoss naming the workers that differ or do not answer.
  Status verify_replicas();

  // experimental_distribute_dataset: each worker iterates its shard
  // (SHARD_HINT resolved to the workers); pass arg() to run() and read it in
  // the closure with ctx.iterator(). A pipeline reading the data service
  // (DYNAMIC sharding) shares the work across whatever replicas there are.
  Result<PerWorkerDataset> distribute_dataset(const data::Dataset& dataset);
  // Exactly-once input for the steps (beyond TF, whose input loses a failed
  // step's examples and a lost worker's position): `examples`, a finite,
  // deterministic dataset of single examples (no batch(), shuffle() or
  // repeat(): the steps batch, shuffle and go on through epochs), held
  // whole in every worker's memory. Each step hands every replica the next
  // positions of the input as one batch, through ctx.iterator(arg) as
  // usual, and commits them with the step's update; a step that fails
  // commits nothing, and the next step's replicas, however many, read the
  // same positions again. A worker that dies takes nothing with it, and
  // one that joins needs no input state: the position travels with the
  // replicas' variables. Every example is seen exactly once per epoch.
  // InvalidArgument for options without exactly one batch size.
  Result<PerWorkerDataset> distribute_step_input(const data::Dataset& examples, StepInputOptions options);
  // distribute_datasets_from_function: `dataset_function` (in the workers'
  // module) builds each worker's pipeline from its InputContext.
  Result<PerWorkerDataset> distribute_datasets_from_function(const std::string& dataset_function);

  // The cluster's checkpoint, mirrored variables (values, slots, step)
  // included, in the parameter servers' format; restore puts them back
  // (the next run() starts from them).
  Result<std::string> save_checkpoint(const std::string& directory, int64_t step, int max_to_keep = 5);
  Result<int64_t> restore_checkpoint(const std::string& path);

  const std::string& name() const;

  struct CAPSTAN_HIDDEN Impl;

 private:
  explicit MirroredStrategy(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace capstan

#endif  // CAPSTAN_STRATEGY_H_
