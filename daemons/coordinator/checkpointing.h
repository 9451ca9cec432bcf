// Checkpoints of the whole model, taken and restored by the coordinator.
//
// save: each parameter server writes one safetensors file of its shards
// (values, optimizer slots, steps; a table's rows) into the checkpoint's
// .tmp directory, rank 0 of each strategy its mirrored variables'
// (checkpoint/mirrored_files.h); the coordinator adds the iterators' file
// and writes the manifest last, atomically (lib/checkpoint).
// restore: each parameter server reads, for each of its shards as placed
// *now*, the rows it covers from the checkpoint, whatever partitioning or
// number of PS tasks it was saved with (value, slots, step). Variables the
// program did not create again are created with the checkpoint's number of
// shards.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_CHECKPOINTING_H_
#define CAPSTAN_DAEMONS_COORDINATOR_CHECKPOINTING_H_

#include <map>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "checkpoint/checkpoint.h"
#include "io/file_system.h"
#include "types/shard_location.h"
#include "types/table_rows.h"

namespace capstan::coordinator {

// A shard (where it lives: ps_address stays "") and what it holds.
struct ShardState : ps::ShardLocation {
  Tensor value;
  std::map<std::string, Tensor> slots;
  int64_t step = 0;
  // An embedding table's shard: its rows (value and slots stay empty) and
  // the version its changes were tagged with.
  ps::TableRows table_rows;
  int64_t version = 0;
};

struct VariableState {
  std::string name;
  DType dtype = DType::kInvalid;
  Shape shape;
  Optimizer optimizer;
  std::vector<ShardState> shards;
  // An embedding table: shard i on task i, of `table_shards` in all (a
  // recovery's state lists only the shards lost); `generation` as in
  // checkpoint::ManifestTable.
  std::optional<EmbeddingTableSpec> table;
  int table_shards = 0;
  int64_t generation = 0;
};

// The file of a checkpoint that holds the per-worker iterators' positions:
// one uint8 tensor per dataset and worker, named by iterator_tensor_name().
inline constexpr const char* kIteratorsFile = "iterators.safetensors";
// "iterator/<dataset>/worker-<task index>"; <dataset> is the dataset's name,
// or "#<id>" for an unnamed one.
std::string iterator_tensor_name(const std::string& dataset_name, int64_t dataset_id, int task_index);

// The file where add_files() and write_checkpoint() put shards whose
// ps_task is < 0: the strategies' mirrored variables as the coordinator
// wrote them before each strategy's rank 0 wrote its own
// mirrored-<strategy>.safetensors (checkpoint/mirrored_files.h). Such
// checkpoints still restore (variables are found by name). A parameter
// server's shards are in ps-<task>.safetensors (checkpoint/shard_files.h).
inline constexpr const char* kMirroredFile = "mirrored.safetensors";

// Adds to `writer` the files of `variables` (their values in hand: the
// mirrored ones, or all of them in tests) and of the iterator positions
// (none: no iterators file), and their entries to `manifest`.
Status add_files(checkpoint::CheckpointWriter& writer, const std::vector<VariableState>& variables,
                 const std::map<std::string, std::string>& iterators, checkpoint::Manifest* manifest);

// Writes dir/ckpt-<step> (keeping `max_to_keep`) with the variables and the
// iterator positions (none: no iterators file), through `fs`; returns its
// path. The coordinator's own saves go through ModelCheckpoints, where the
// parameter servers write their files; this writes every value given.
Result<std::string> write_checkpoint(const std::string& dir, int64_t step, int max_to_keep,
                                     const std::vector<VariableState>& variables,
                                     const std::map<std::string, std::string>& iterators = {},
                                     io::FileSystem& fs = io::local_file_system());

// Writes a table's rows (state.shards[*].rows) as one safetensors file at
// `path`, durably: "keys" int64[n], "values" dtype[n, dim], "meta"
// int64[n, 4], metadata capstan.table (its name) and capstan.dim. The rows.
Result<int64_t> write_table_export(const VariableState& state, const std::string& path,
                                   io::FileSystem& fs = io::local_file_system());

// The iterator positions of a checkpoint, by tensor name (none when it has
// no iterators file).
Result<std::map<std::string, std::string>> read_iterator_states(const checkpoint::CheckpointReader& reader);

// A checkpoint path, or a directory of checkpoints (its latest).
Result<std::string> resolve_checkpoint(const std::string& path, io::FileSystem& fs = io::local_file_system());

// Keeps in `variables` (the current layout, without values) the ones the
// checkpoint has and checks them against it without reading a value: dtype
// and shape, a table's dtype, dim and optimizer slots (InvalidArgument when
// they differ; a variable and a table of one name differ). A variable the
// checkpoint lacks (created since it was saved) is, as in TF, left out (so
// it keeps its value) and named in `not_in_checkpoint`; with `strict`,
// NotFound naming every such variable instead. The parameter servers then
// read the values themselves (PsVariables::restore_from), re-sharding rows
// and table keys as they are placed now.
Status match_checkpoint(const checkpoint::Manifest& manifest, std::vector<VariableState>* variables, bool strict,
                        std::vector<std::string>* not_in_checkpoint);

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_CHECKPOINTING_H_
