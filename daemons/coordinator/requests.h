// The coordinator's requests and replies in plain C++ (the service converts
// them to and from schemas/coordinator.capnp): variables and their
// placement, the status page's overview, a restored checkpoint, synchronous
// strategies and their steps.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_REQUESTS_H_
#define CAPSTAN_DAEMONS_COORDINATOR_REQUESTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan/training.h"
#include "placement/placement.h"
#include "types/replica.h"
#include "types/shard_location.h"

namespace capstan::coordinator {

// A variable to create. Its value is `initial` (older programs: the whole
// value, through the coordinator), or, with `initial` invalid, that of
// `initializer` (computed by the parameter servers) or zeros the program
// overwrites itself (value_from_program), for a variable of `dtype` and
// `shape`.
struct VariableRequest {
  std::string name;
  Tensor initial;  // the whole initial value, or Tensor()
  Optimizer optimizer;  // as the program sent it; the parameter servers check it
  placement::Partitioner partitioner;
  Initializer initializer{};
  DType dtype = DType::kInvalid;
  Shape shape{};
  bool value_from_program = false;
};

// A variable as the coordinator hands it out: each shard's ps_address is the
// task's address now.
using ps::ShardLocation;
using ps::VariableLocation;

struct Placements {
  int64_t version = 0;
  std::vector<VariableLocation> variables;  // by name
};

// The coordinator's members and state, for its status page.
struct CoordinatorOverview {
  struct WorkerRow {
    int64_t id = 0;
    int task_index = 0;
    std::string address;
    bool leaving = false;
  };
  struct PsRow {
    int task = 0;
    std::string address;
    std::string state;  // "up", "down (since 12 s)", "recovering", "lost: ..."
    size_t shards = 0;
  };
  std::vector<WorkerRow> workers;
  std::vector<PsRow> ps;
  Placements placements;
  size_t per_worker_datasets = 0;
  std::string last_checkpoint;
};

// A checkpoint restored (Coordinator::restore_checkpoint).
struct RestoredCheckpoint {
  std::string path;  // the checkpoint (a directory's newest)
  int64_t step = 0;
  std::vector<std::string> not_in_checkpoint;
  int iterators = 0;  // per-worker iterators put back where the checkpoint has them
};

// Synchronous training (MirroredStrategy).

// A worker's answer to a replica call, or that it was lost (the link broke,
// it was dropped, or it did not answer in time).
template <typename T>
struct ReplicaAnswer {
  Result<T> result = Status::Unknown("no answer");
  bool lost = false;
};

struct MirroredVariableInit {
  std::string name;
  Tensor initial;
  Optimizer optimizer;
};

struct StrategyConfig {
  int min_replicas = 1;  // a step waits (up to settings.timeout) for this many workers
  training::CollectiveSettings settings;
};

// A strategy's step input (exactly-once input for synchronous steps): the
// per-worker dataset whose elements every step takes a share of, and how a
// step's batch is split among its replicas. Exactly one of the batches is
// set: `global_batch` (constant_global_batch: the step's batch re-split
// among the live replicas) or `per_replica_batch` (each replica's batch
// stays; the step's grows and shrinks with the replicas).
struct StepInputConfig {
  int64_t dataset_id = 0;
  int64_t global_batch = 0;
  int64_t per_replica_batch = 0;
  uint64_t seed = 0;
  bool shuffle = true;
};

struct StepOutcome {
  std::vector<std::string> values;  // serialized Elements, by replica
  int64_t steps = 0;                // steps of the strategy run so far
  int64_t epoch = 0;
  std::vector<int> task_indexes;    // by replica
  // With a step input: the examples each replica took (by replica), and
  // the input position after the step (the positions consumed so far).
  std::vector<int64_t> examples;
  int64_t input_position = 0;
};

struct ReplicaInfo {
  int64_t worker_id = 0;
  int task_index = 0;
  int rank = 0;
  training::ReplicaReport report;
  Status status;  // the worker's answer to replica_status
};

struct StrategyStatus {
  int64_t epoch = 0;
  int64_t steps = 0;
  std::vector<ReplicaInfo> replicas;  // by rank
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_REQUESTS_H_
