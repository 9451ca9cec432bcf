// Reading a Capstan checkpoint from its files, without a cluster: what a
// serving program, a conversion script or an evaluation job needs
// (TF: tf.train.load_checkpoint and its CheckpointReader).
//
//   auto reader = capstan::CheckpointReader::open("/ckpt").value();  // the newest checkpoint in /ckpt
//   for (const auto& variable : reader->variables()) {
//     capstan::Tensor value = reader->read_variable(variable.name).value();  // whole, shards joined
//   }
//
// A checkpoint is a directory ckpt-<step>/ holding a manifest.json and one
// safetensors file per parameter server (ClusterCoordinator::save_checkpoint
// writes it). A variable left whole is the tensor of its own name in one of
// the files; a partitioned one is split by rows into tensors
// "<name>/part_0", "<name>/part_1", ... (TF's names), possibly in different
// files, which the manifest lists in row order. read_variable() joins them,
// so a reader never needs to know how a variable was partitioned. Python's
// `safetensors` package reads the same files (each shard as a tensor).
//
// Thread-safety: after open(), every method may be called from many
// threads at once.
#ifndef CAPSTAN_CHECKPOINT_H_
#define CAPSTAN_CHECKPOINT_H_

#include "capstan/export.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan CAPSTAN_API {

// What a checkpoint holds about one variable.
struct CheckpointVariable {
  std::string name;
  DType dtype = DType::kInvalid;
  Shape shape;  // the whole variable's
  int64_t shards = 1;  // how many row ranges it was saved in
  // A dynamic embedding table (create_embedding_table): rows keyed by id,
  // which read_variable() refuses (ClusterCoordinator::export_embedding_table
  // writes them out with their keys).
  bool embedding_table = false;
};

// The checkpoint directory `path` names: `path` itself when it holds a
// manifest.json (a ckpt-<step> directory), else the newest committed
// checkpoint in the directory `path` (a checkpoint root, as
// ClusterCoordinator::restore_checkpoint accepts). NotFound naming `path`
// when it is neither.
Result<std::string> find_checkpoint(const std::string& path);

class CheckpointReader {
 public:
  // Opens the checkpoint find_checkpoint(path) names and checks every file
  // against the manifest (size and CRC32C), so a damaged file is found here,
  // not halfway through loading a model. Errors: NotFound (no checkpoint at
  // `path`); DataLoss "checkpoint <dir> is damaged: ..." naming the file (a
  // missing, truncated or corrupted file, a damaged manifest).
  static Result<std::unique_ptr<CheckpointReader>> open(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  // The checkpoint's directory ("/ckpt/ckpt-1200") and its step.
  const std::string& path() const;
  int64_t step() const;
  // Every variable, in the manifest's order. Optimizer slots are not
  // variables (a serving program has no use for them).
  const std::vector<CheckpointVariable>& variables() const;
  // nullptr when the checkpoint has no variable `name`.
  const CheckpointVariable* find_variable(const std::string& name) const;
  // The whole variable, its shards joined in row order. NotFound naming the
  // variable when there is none; FailedPrecondition for an embedding table;
  // DataLoss naming the file when a file does not hold what the manifest
  // says.
  Result<Tensor> read_variable(const std::string& name) const;

 private:
  struct CAPSTAN_HIDDEN Impl;
  explicit CheckpointReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace capstan

#endif  // CAPSTAN_CHECKPOINT_H_
