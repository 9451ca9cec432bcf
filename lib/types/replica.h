// Synchronous training's shared vocabulary: what the coordinator and a
// worker-server say about a worker's replica of a strategy's mirrored
// variables (schemas/worker.capnp has the wire form, rpc/replica_codec.h
// converts). Plain values; no behaviour.
#ifndef CAPSTAN_LIB_TYPES_REPLICA_H_
#define CAPSTAN_LIB_TYPES_REPLICA_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "capstan/collectives.h"
#include "capstan/tensor.h"
#include "capstan/training.h"
#include "types/shard_checkpoint.h"

namespace capstan::training {

// A mirrored variable without its value.
struct MirroredSpec {
  std::string name;
  DType dtype = DType::kInvalid;
  Shape shape;
  Optimizer optimizer;
};

struct MirroredValue {
  std::string name;
  Tensor value;
  std::map<std::string, Tensor> slots;  // by the parameter servers' slot names
};

// Every value and slot of one replica, and its optimizer step.
struct MirroredState {
  int64_t step = 0;
  std::vector<MirroredValue> variables;
};

struct CollectiveSettings {
  std::chrono::milliseconds timeout{60000};
  CollectiveOptions::Transport transport = CollectiveOptions::Transport::kAuto;
  int tcp_streams = 4;

  CollectiveOptions options() const {
    CollectiveOptions o;
    o.timeout = timeout;
    o.transport = transport;
    o.tcp_streams = tcp_streams;
    return o;
  }
};

struct ReplicaReport {
  bool holds = false;
  int64_t step = 0;
  uint64_t checksum = 0;
  // The strategy's step input consumed up to here (StepInput::end of the
  // last step this replica's variables took): it travels with the state.
  int64_t input_position = 0;
  std::vector<std::string> transports;  // formReplica only: to each member, by rank
};

// formReplica's request.
struct ReplicaForm {
  std::string strategy;
  int64_t epoch = 0;
  int rank = 0;
  std::vector<std::string> addresses;  // by rank
  int source = 0;
  std::vector<MirroredSpec> specs;
  std::optional<MirroredState> seed;  // only to the source
  // Only to the source: read variables `seed_from_checkpoint` (values, slots
  // of the same optimizer kind, the step) from the committed checkpoint at
  // this path, and take the others from `seed`. A restore sends the path,
  // not the values: the coordinator never holds them.
  std::string seed_checkpoint;
  std::vector<std::string> seed_from_checkpoint;

  bool has_seed() const { return seed.has_value() || !seed_checkpoint.empty(); }
  CollectiveSettings settings;
  // The source's input position (ReplicaReport::input_position): every
  // member takes it with the state.
  int64_t input_position = 0;
};

// A synchronous step's share of the strategy's step input (exactly-once
// input): the positions [start, start + count) of the input's global order,
// where position p is element perm(seed, p / N)[p % N] of the N elements
// (each epoch a fresh permutation, or the dataset's order without
// shuffle). The step as a whole takes [first, end); `weight` scales this
// replica's gradients in the group's mean (count * replicas / global
// count), so that uneven shares give the global batch's mean gradient.
struct StepInput {
  int64_t dataset_id = 0;
  int64_t start = 0;
  int64_t count = 0;
  int64_t first = 0;
  int64_t end = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  double weight = 1.0;
};

// saveReplica's answer: the file a replica wrote into a checkpoint being
// saved (checkpoint/mirrored_files.h), its size and CRC32C, and what the
// manifest needs of each variable (dtype, shape, the slots written; step
// is the replica's).
struct SavedReplica {
  std::string file;
  uint64_t size = 0;
  uint32_t crc32c = 0;
  int64_t step = 0;
  std::vector<ps::SavedShard> variables;
};

}  // namespace capstan::training

#endif  // CAPSTAN_LIB_TYPES_REPLICA_H_
