// LibTorch models on Capstan: tensors shared both ways without a copy, and
// a torch::nn::Module whose parameters live on the parameter servers.
//
// A library of its own (libcapstan_torch.so; CMake: find_package(Capstan
// COMPONENTS torch), target Capstan::torch): libcapstan.so never links
// LibTorch, and a program that does not use torch does not load it.
//
// Parameter-server training with a module (TF: a Keras model created under
// ParameterServerStrategy's scope, trained with GradientTape in a closure):
//
//   // the training program, once:
//   auto model = std::make_shared<WideDeep>();
//   capstan::torch::create_variables(*cluster, *model, {.optimizer = capstan::Optimizer::adam(1e-3)}).value();
//
//   // the module's closure, on every worker (each worker keeps its own copy
//   // of the module; the parameter servers hold the truth):
//   auto model = std::make_shared<WideDeep>();
//   capstan::torch::PsModule ps(*model);
//   registry.register_closure("train_step", [=](capstan::ClosureContext& ctx, const capstan::Element& args)
//       -> capstan::Result<capstan::Element> {
//     auto batch = ...;                                    // the worker's iterator
//     CAPSTAN_ASSIGN_OR_RETURN(auto loss, ps.train_step(ctx, [&] { return loss_fn(model->forward(x), y); }));
//     return capstan::Element{{capstan::torch::from_torch(loss).value()}, {}};
//   });
//
// A parameter is the variable prefix + its name in named_parameters()
// ("deep.0.weight"), so a checkpoint names it as the module does. An
// embedding that should gather only a batch's rows is a capstan::torch::
// Embedding (not torch::nn::Embedding, whose weight would be read whole):
// its rows live on the parameter servers, a step reads the rows its ids
// name and pushes their gradient as a sparse update (IndexedSlices). A
// torch::nn::Embedding with sparse=true is read whole but pushed as the
// rows its batch touched.
//
// Thread-safety: a PsModule, like the module it wraps, is used by one
// closure at a time.
#ifndef CAPSTAN_TORCH_H_
#define CAPSTAN_TORCH_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/closure.h"
#include "capstan/collectives.h"
#include "capstan/functions.h"
#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan/training.h"

namespace capstan::torch {

// ---- Tensors ------------------------------------------------------------------

// The torch scalar type of a Capstan dtype (every numeric dtype has one;
// kString and kInvalid do not: InvalidArgument).
Result<c10::ScalarType> torch_dtype(DType dtype);
// The Capstan dtype of a torch scalar type; InvalidArgument for those
// Capstan lacks (complex, quantized, uint16+...), naming it.
Result<DType> capstan_dtype(c10::ScalarType type);

// A torch tensor over `tensor`'s buffer: no copy. The torch tensor keeps the
// buffer alive; writing through it writes the buffer that every copy of
// `tensor` shares (as numpy's frombuffer does). InvalidArgument for a string
// or invalid tensor.
Result<::torch::Tensor> to_torch(const Tensor& tensor);
// A Capstan tensor over `tensor`'s memory: no copy; it keeps the torch
// storage alive. Refused (InvalidArgument, naming `what` and the fix): a
// tensor that is not contiguous (call .contiguous()), not on the CPU (call
// .cpu()), or of a dtype Capstan lacks. A tensor that requires grad is
// viewed as its data (as .detach() would).
Result<Tensor> from_torch(const ::torch::Tensor& tensor, std::string_view what = "tensor");

// ---- Collectives on torch tensors ----------------------------------------------

// A group's collectives on torch tensors, called by every rank in the same
// order (as Communicator's own). A CPU tensor takes the group's host path
// (shared memory or TCP; the tensor is viewed, not copied, and the result
// written back into it); a CUDA tensor takes NCCL on its own device
// (Communicator::all_reduce_device and the others), queued on `cuda_stream`
// (a cudaStream_t; nullptr: the device's default stream, where torch works
// unless the program chose another stream) after the work already there,
// and finished when the call returns (all_gather's result is allocated on
// torch's current stream: pass that stream, or synchronize). A CUDA tensor
// of a dtype NCCL lacks (bool, int8, uint8, int16) is copied to the host
// and back. NCCL's in-place writes count as in-place modifications for
// autograd (its version counter), as copy_ does. Refused
// (InvalidArgument, naming the tensor and the fix): undefined, sparse, not
// contiguous, a dtype Capstan lacks, or a device other than the CPU and
// CUDA. A CUDA tensor where Capstan was built without CUDA, or NCCL cannot
// load, fails as Communicator::device_collectives() says.

// `tensor` becomes the reduction of every rank's `tensor` (same dtype and
// shape everywhere).
Status all_reduce(Communicator& group, ::torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum,
                  void* cuda_stream = nullptr);
// `tensor` becomes rank `root`'s on every rank.
Status broadcast(Communicator& group, ::torch::Tensor& tensor, int root, void* cuda_stream = nullptr);
// The ranks' tensors concatenated along dimension 0, in rank order, on
// `tensor`'s device. On CUDA every rank's tensor has the same shape (NCCL's
// all-gather; checked first over the host: every rank refuses, naming the
// ranks' sizes); on the CPU first dimensions may differ (as
// Communicator::all_gather). A scalar counts as one row.
Result<::torch::Tensor> all_gather(Communicator& group, const ::torch::Tensor& tensor, void* cuda_stream = nullptr);

// ---- Embeddings on the parameter servers ---------------------------------------

struct EmbeddingOptions {
  int64_t num_embeddings = 0;  // rows; 0 with `hash_table`
  int64_t dim = 0;
  // Rows drawn from N(mean, stddev) with `seed` (Keras' RandomNormal);
  // stddev 0: every element is `mean` (0: Keras' Zeros, for a linear model).
  double mean = 0.0, stddev = 0.05;
  uint64_t seed = 0;
  // A dynamic hash table (create_embedding_table): ids are any int64, rows
  // are inserted on first lookup, nothing is partitioned by row number.
  bool hash_table = false;
};

// An embedding whose rows live on the parameter servers. Inside a step
// (PsModule), forward(ids) gathers the distinct rows `ids` names, once each,
// and backward's gradient for them is pushed as a sparse update. Outside a
// step it reads its local rows, where load_checkpoint (or set_local_rows)
// gave it some, as torch::nn::Embedding does (serving); without them there
// are no rows to read (thrown as a c10::Error like any torch error). ids:
// int32/int64, any shape; the output is ids.shape() + [dim], float32.
class EmbeddingImpl : public ::torch::nn::Module {
 public:
  explicit EmbeddingImpl(EmbeddingOptions options);
  ::torch::Tensor forward(const ::torch::Tensor& ids);

  const EmbeddingOptions& options() const { return options_; }
  // The whole initial table [num_embeddings, dim] (what create_variables
  // writes); a plain torch::nn::Embedding given these rows trains the same.
  Result<Tensor> initial_value() const;

  // Rows held in this process, which forward() reads outside a step (a
  // serving program; load_checkpoint sets them): float32 [num_embeddings,
  // dim], kept as given (no copy). InvalidArgument for another dtype or
  // shape, or a hash-table embedding (its rows are keyed by id, not row
  // number). An undefined tensor drops them. They are not a parameter:
  // create_variables and PsModule never see them.
  Status set_local_rows(::torch::Tensor rows);
  const ::torch::Tensor& local_rows() const { return local_rows_; }

 private:
  friend class PsModule;
  struct Step {
    ClosureContext* context = nullptr;
    std::string variable;
    bool training = true;
    // What this step gathered: distinct ids and their rows (a leaf that
    // collects the gradient).
    std::vector<::torch::Tensor> ids;
    std::vector<::torch::Tensor> rows;
  };
  EmbeddingOptions options_;
  Step step_;
  ::torch::Tensor local_rows_;  // undefined unless set_local_rows
};
// TORCH_MODULE(Embedding), spelled out: the macro names torch:: unqualified,
// which inside capstan:: means this namespace.
class Embedding : public ::torch::nn::ModuleHolder<EmbeddingImpl> {
 public:
  using ::torch::nn::ModuleHolder<EmbeddingImpl>::ModuleHolder;
  using Impl = EmbeddingImpl;
};

// ---- Modules on the parameter servers ------------------------------------------

struct PsOptions {
  // Variable name = prefix + parameter name ("wide." + "weight").
  std::string prefix{};
  // The optimizer the parameter servers apply, for every parameter not in
  // `optimizers` (keyed by parameter name, without the prefix).
  Optimizer optimizer = Optimizer::sgd(0.01);
  std::map<std::string, Optimizer> optimizers{};
  // Partitioning, for parameters not in `partitioners`: a parameter of
  // `partition_min_bytes` or more, with two or more rows, is split by rows
  // into shards of at least partition_min_bytes / 4 bytes, at most
  // `max_shards` of them (TF's MinSizePartitioner); smaller ones stay whole.
  std::map<std::string, Partitioner> partitioners{};
  int64_t partition_min_bytes = 1 << 20;
  int64_t max_shards = 8;
  // Only the capstan::torch::Embeddings' rows are on the parameter servers;
  // the dense parameters are someone else's (strategy-hybrid: a
  // MirroredModule mirrors them on the replicas). create_variables creates
  // only the embeddings' variables; PsModule's pull reads no dense
  // parameter and push pushes none.
  bool embeddings_only = false;
};

// The parameters a module puts on the parameter servers, in a stable order:
// every named parameter (dense), then every capstan::torch::Embedding's rows
// (named "<its path>.weight"). `name` is without the prefix.
struct PsParameter {
  std::string name;
  Shape shape;  // an embedding hash table's: [0, dim]
  DType dtype = DType::kFloat32;
  bool embedding = false;
  bool hash_table = false;
};
Result<std::vector<PsParameter>> ps_parameters(::torch::nn::Module& module);

// Creates a variable (or an embedding table) on the parameter servers for
// each parameter of `module`, holding the module's current values, with the
// optimizer and partitioner `options` choose. A variable that already exists
// with the same dtype and shape is kept as it is (a restarted program
// carries on from the parameter servers' values). Everything is checked
// before anything is created: a parameter whose name exists with another
// shape or dtype, or a dtype the parameter servers do not hold, fails the
// call naming the parameter, and nothing is written.
Result<std::vector<VariableInfo>> create_variables(ClusterCoordinator& cluster, ::torch::nn::Module& module,
                                                   const PsOptions& options = {});

// A module bound to its variables while closures run on a worker.
class PsModule {
 public:
  // `module` must outlive this object.
  explicit PsModule(::torch::nn::Module& module, PsOptions options = {});

  // Reads every dense parameter from the parameter servers into the module
  // and binds its embeddings to `ctx` for the step. training = false:
  // embedding hash tables are read without inserting (evaluation).
  // FailedPrecondition when a parameter's shape differs from its variable's
  // (the module changed shape), naming it.
  Status pull(ClosureContext& ctx, bool training = true);
  // Pushes the gradients of the last backward(): dense ones with
  // apply_gradients, an embedding's rows with apply_sparse_gradients of the
  // rows its forward gathered, and a parameter's sparse (COO) gradient --
  // torch::nn::Embedding(sparse=true) -- coalesced, with
  // apply_sparse_gradients of the rows it names; then clears them and
  // unbinds the embeddings. A parameter without a gradient is not pushed.
  // Every gradient is converted before any is pushed: one the parameter
  // servers cannot take (another sparse layout, a torch error) is
  // InvalidArgument naming its parameter, and nothing is pushed. `options`
  // go with every update: options.learning_rate is the rate the parameter
  // servers' optimizers apply to them instead of their own (fit's
  // LearningRateScheduler), for every optimizer.
  Status push(ClosureContext& ctx, const ApplyOptions& options = {});
  // One training step: pull, `loss` (the user's forward and loss, a scalar),
  // backward, push(ctx, options). The loss's value (detached). A torch
  // error thrown by `loss` becomes InvalidArgument with its message;
  // nothing is pushed then.
  Result<::torch::Tensor> train_step(ClosureContext& ctx, const std::function<::torch::Tensor()>& loss,
                                     const ApplyOptions& options = {});
  // pull(ctx, false), then `fn` without gradients; nothing is pushed.
  Result<::torch::Tensor> eval_step(ClosureContext& ctx, const std::function<::torch::Tensor()>& fn);
  // Ends a step without pushing (a step that failed between pull and
  // push): unbinds the embeddings from the context and clears the
  // gradients.
  Status unbind();

 private:
  ::torch::nn::Module& module_;
  PsOptions options_;
};

// ---- Loading a checkpoint into a module, without a cluster ----------------------

struct LoadCheckpointOptions {
  // Variable name = prefix + parameter name: the prefix create_variables
  // was given (PsOptions::prefix).
  std::string prefix{};
  // True: every parameter must be in the checkpoint (NotFound naming the
  // first missing one); false: missing ones keep their values.
  bool strict = true;
  // Parameters (without the prefix) that may be missing even when strict.
  std::vector<std::string> allow_missing{};
};

struct LoadedCheckpoint {
  std::string path;  // the ckpt-<step> directory read
  int64_t step = 0;
  std::vector<std::string> loaded;   // parameter names, in ps_parameters order
  std::vector<std::string> missing;  // parameters the checkpoint lacks (kept as they were)
  // Variables under the prefix that no parameter or buffer names (PyTorch's
  // unexpected_keys); not an error: a checkpoint holds the whole job.
  std::vector<std::string> unexpected;
  // Buffers (named_buffers() names) loaded, and those the checkpoint lacks
  // (kept as they were), in named_buffers() order.
  std::vector<std::string> buffers;
  std::vector<std::string> missing_buffers;
};

// Loads a Capstan checkpoint into a plain module for serving or evaluation:
// reads the files alone (no cluster; capstan::CheckpointReader), joins
// partitioned variables, and copies variable prefix + name into each of
// ps_parameters(module): every named parameter (wherever it lives: CPU or
// CUDA) and every capstan::torch::Embedding's rows ("<path>.weight", into
// set_local_rows). A plain torch::nn::Embedding registered under the same
// path as the training module's capstan::torch::Embedding loads its rows
// as well, so a serving module may use LibTorch's own Embedding.
//
// `path`: a ckpt-<step> directory, or a checkpoint root (its newest), as
// ClusterCoordinator::restore_checkpoint accepts. Every file is checked
// against the manifest (CRC32C), and every parameter against its variable,
// before anything is copied: on an error the module is unchanged. Errors
// name the parameter and the fix: NotFound for a missing variable (strict),
// InvalidArgument for a dtype or shape that differs from the parameter's,
// FailedPrecondition for a dynamic embedding table (not loadable into a
// module yet: allow_missing it), DataLoss naming the file for a damaged
// checkpoint.
//
// Buffers (named_buffers(): BatchNorm's running statistics) load from the
// variables of their names (prefix + name), which a MirroredModule's
// checkpoint holds (see capstan/torch/mirrored_module.h), checked like the
// parameters (InvalidArgument for another dtype or shape). A buffer the
// checkpoint lacks keeps its value whatever `strict` says (a module trained
// on the parameter servers checkpoints no buffers): missing_buffers lists
// it.
Result<LoadedCheckpoint> load_checkpoint(::torch::nn::Module& module, const std::string& path,
                                         const LoadCheckpointOptions& options = {});

// ---- Models for fit (capstan/fit.h) -----------------------------------------------

// A model as fit trains it: the user's module and loss. Metrics are binary
// classification's: `probabilities` turns outputs into P(label = 1).
struct ModelSpec {
  // The module whose parameters are the variables (PsOptions' prefix); one
  // per worker process, its values pulled at every step. Required.
  std::shared_ptr<::torch::nn::Module> module;
  // The module's forward pass on a batch's components (the dataset
  // element's tensors as torch tensors, in order). Required.
  std::function<::torch::Tensor(const std::vector<::torch::Tensor>& batch)> forward;
  // The loss (a scalar: the batch's mean) of the outputs against the
  // labels. Required.
  std::function<::torch::Tensor(const ::torch::Tensor& outputs, const ::torch::Tensor& labels)> loss;
  // The component holding the labels (0/1); negative counts from the end.
  int label_component = -1;
  // Outputs -> probabilities (default: the sigmoid of logits).
  std::function<::torch::Tensor(const ::torch::Tensor& outputs)> probabilities{};
  // The variables' prefix and optimizers, as create_variables was given
  // them.
  PsOptions ps{};
  int auc_thresholds = 200;  // Keras' AUC num_thresholds (>= 3)
};

// Registers the closures fit schedules (ParameterServerFitStrategy):
//   "<name>/train_step" (dataset arg, learning rate float64: [] a rate,
//       [0] none): one step on the worker's next batch: pull, forward,
//       loss, backward, push; a rate goes with every update
//       (ApplyOptions::learning_rate: the optimizers apply it instead of
//       their own rate and schedule, whatever their kind);
//   "<name>/eval_step" (dataset arg): the same without gradients or push.
// Both return the batch's metric state ("loss_sum", "examples", "correct",
// "confusion": see MetricState in capstan/fit.h). Steps of one model on a
// worker run one at a time (the module is shared). Run as a synchronous
// step (MirroredStrategy::run, as MirroredFitStrategy does), a closure
// trains the module with a MirroredModule attached to the worker's
// replicas (ctx.mirrored(), variables named ps.prefix + parameter name) on
// the step's group instead of pulling and pushing; a module with
// capstan::torch::Embeddings is hybrid there: their rows are still
// gathered from and pushed to the parameter servers (a PsModule with
// embeddings_only), in the same step. An invalid spec is InvalidArgument
// naming the field, and nothing is registered. The same spec trains in a
// program's own process, multi-client: MultiWorkerMirroredFitStrategy
// (capstan/fit.h).
Status register_model(FunctionRegistry& registry, const std::string& name, ModelSpec spec);

}  // namespace capstan::torch

#endif  // CAPSTAN_TORCH_H_
