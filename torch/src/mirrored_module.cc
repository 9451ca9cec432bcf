// torch::nn::Modules trained data-parallel on Capstan's collectives: module
// parameters as views of mirrored variables, gradients all-reduced in
// buckets while backward runs.
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <cmath>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_set>

#include "capstan/phases.h"
#include "capstan/torch.h"
#include "capstan/torch/mirrored_module.h"
#include "errors.h"

namespace capstan::torch {
namespace {

using internal::sizes_string;
using internal::torch_error;

// The leaves (parameters, as TensorImpls) whose gradients backward from
// `loss` will compute: the variables of the AccumulateGrad nodes its graph
// reaches.
std::unordered_set<const void*> reached_leaves(const ::torch::Tensor& loss) {
  std::unordered_set<const void*> leaves;
  std::unordered_set<const ::torch::autograd::Node*> seen;
  std::vector<::torch::autograd::Node*> stack;
  if (loss.grad_fn()) stack.push_back(loss.grad_fn().get());
  while (!stack.empty()) {
    ::torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    if (const auto* accumulate = dynamic_cast<const ::torch::autograd::AccumulateGrad*>(node)) {
      leaves.insert(accumulate->variable.unsafeGetTensorImpl());
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  return leaves;
}

const Optimizer& optimizer_for(const std::string& name, const MirroredOptions& options) {
  auto it = options.optimizers.find(name);
  return it != options.optimizers.end() ? it->second : options.optimizer;
}

}  // namespace

struct MirroredModule::Impl {
  struct Parameter {
    std::string name;      // without the prefix
    ::torch::Tensor tensor;  // the module's parameter: a view of its replica
    Shape shape;
    DType dtype = DType::kFloat32;
    bool trained = false;  // requires grad: has a bucket and a hook
    size_t bucket = 0;
    int64_t offset = 0;  // elements into the bucket
    int64_t numel = 0;
    std::optional<unsigned> hook;
    Tensor zeros;  // the "gradient" of a parameter that is not trained
    bool ready = false;  // GUARDED_BY(mutex): this step's gradient is in its bucket
    // A CUDA module: the replica whose values the parameter holds (a copy;
    // a new replica buffer, after set_group or a restore, is copied in).
    // Held, so that its buffer cannot be freed and a new one made at the
    // same address look like it.
    Tensor synced;
  };
  // A buffer of the module (named_buffers()): broadcast from rank 0 each
  // step; `mirrored` ones also view a replica (Optimizer::none()).
  struct Buffer {
    std::string name;        // without the prefix
    ::torch::Tensor tensor;  // the module's buffer
    bool mirrored = false;
    Tensor zeros;            // its "gradient" when mirrored
    Tensor synced;  // as Parameter::synced
  };
  struct Bucket {
    DType dtype = DType::kFloat32;
    std::vector<size_t> parameters;  // in the order their gradients usually come
    Tensor buffer;                   // this rank's gradients, flat (a CUDA module: their mean)
    ::torch::Tensor view;            // of `buffer`; a CUDA module: on its device
    // GUARDED_BY(mutex):
    size_t pending = 0;  // gradients still missing this step
    bool launched = false;
    std::future<Result<Tensor>> reduced;
  };

  // Constant after create or attach (but `group` changes with set_group
  // and train_step(group, ...); `variables` is owned_variables after
  // create, the caller's replicas after attach).
  Communicator* group = nullptr;  // null after attach until a step names one
  ::torch::nn::Module* module = nullptr;
  MirroredOptions options;
  // Where the module's parameters are: nothing for the CPU (they view the
  // replicas), else one CUDA device, where the parameters are copies of
  // the replicas and the buckets are all-reduced through NCCL.
  std::optional<::torch::Device> cuda;
  std::unique_ptr<MirroredVariables> owned_variables;
  MirroredVariables* variables = nullptr;
  std::vector<Parameter> parameters;  // named_parameters() order
  std::vector<Buffer> buffers;        // named_buffers() order
  // For each variable, in the variables' creation order (the order
  // apply_averaged_gradients takes), its parameter's index, or its
  // buffer's.
  struct Source {
    bool buffer = false;
    size_t index = 0;
  };
  std::vector<Source> variable_sources;
  std::vector<Bucket> buckets;

  // Hooks run on autograd's threads (for CPU tensors, the thread calling
  // backward): they and train_step meet under this mutex.
  std::mutex mutex;
  bool in_backward = false;  // GUARDED_BY(mutex): hooks act only then
  // This rank's gradient weight for the step (MirroredVariables::
  // gradient_weight), taken as backward starts.
  double gradient_weight = 1.0;
  size_t next_launch = 0;    // GUARDED_BY(mutex): buckets launch in order
  Status hook_error;         // GUARDED_BY(mutex)
  int64_t launched_this_step = 0;  // GUARDED_BY(mutex)
  MirroredStats stats;

  // A parameter of the module, described (no bucket yet); InvalidArgument
  // for a dtype that cannot be mirrored.
  static Result<Parameter> describe(const std::string& name, const ::torch::Tensor& t) {
    if (!t.device().is_cpu() && !t.device().is_cuda()) {
      return Status::InvalidArgument("MirroredModule: parameter '" + name + "' is on " + t.device().str() +
                                     "; a MirroredModule trains a module on the CPU or on one CUDA device");
    }
    auto dtype = capstan_dtype(t.scalar_type());
    if (!dtype.ok()) return dtype.status().with_context("MirroredModule: parameter '" + name + "'");
    if (*dtype != DType::kFloat32 && *dtype != DType::kFloat64) {
      return Status::InvalidArgument("MirroredModule: parameter '" + name + "' is " +
                                     std::string(dtype_name(*dtype)) + "; mirrored parameters are float32 or float64");
    }
    Parameter p;
    p.name = name;
    p.tensor = t;
    p.shape = Shape(t.sizes().begin(), t.sizes().end());
    p.dtype = *dtype;
    p.trained = t.requires_grad();
    p.numel = t.numel();
    if (!p.trained) {
      CAPSTAN_ASSIGN_OR_RETURN(p.zeros, Tensor::zeros(p.dtype, p.shape));
    }
    return p;
  }

  // A buffer of the module; mirrorable when float32 or float64.
  static Buffer describe_buffer(const std::string& name, const ::torch::Tensor& t) {
    Buffer b;
    b.name = name;
    b.tensor = t;
    if (!t.defined() || (!t.device().is_cpu() && !t.device().is_cuda())) return b;
    auto dtype = capstan_dtype(t.scalar_type());
    b.mirrored = dtype.ok() && (*dtype == DType::kFloat32 || *dtype == DType::kFloat64);
    return b;
  }
  Status make_zeros(Buffer& b) {
    CAPSTAN_ASSIGN_OR_RETURN(DType dtype, capstan_dtype(b.tensor.scalar_type()));
    CAPSTAN_ASSIGN_OR_RETURN(b.zeros, Tensor::zeros(dtype, Shape(b.tensor.sizes().begin(), b.tensor.sizes().end())));
    return Status::Ok();
  }

  // The device of the module's parameters and mirrored buffers: the CPU
  // or one CUDA device (`cuda`), else InvalidArgument naming two that
  // differ.
  Status find_device() {
    std::optional<std::pair<std::string, ::torch::Device>> first;
    auto check = [&](const std::string& what, const ::torch::Tensor& t) -> Status {
      if (!t.defined()) return Status::Ok();
      if (!first) {
        first.emplace(what, t.device());
        return Status::Ok();
      }
      if (t.device() == first->second) return Status::Ok();
      return Status::InvalidArgument("MirroredModule: " + what + " is on " + t.device().str() + " and " +
                                     first->first + " on " + first->second.str() +
                                     "; a MirroredModule trains a module on the CPU or on one CUDA device (call "
                                     "module->to(device) first)");
    };
    for (const Parameter& p : parameters) CAPSTAN_RETURN_IF_ERROR(check("parameter '" + p.name + "'", p.tensor));
    for (const Buffer& b : buffers) {
      if (b.mirrored) CAPSTAN_RETURN_IF_ERROR(check("buffer '" + b.name + "'", b.tensor));
    }
    if (first && first->second.is_cuda()) cuda = first->second;
    return Status::Ok();
  }

  // After a step's update: every buffer takes rank 0's value (DDP's
  // broadcast_buffers), in named_buffers() order on every rank (NCCL for a
  // CUDA module). A mirrored buffer views its replica, so the replica takes
  // it too; a CUDA module's is copied to it.
  Status broadcast_buffers() {
    ::torch::NoGradGuard no_grad;
    if (cuda) ::torch::cuda::synchronize(cuda->index());  // forward wrote the buffers on its stream
    if (options.broadcast_buffers && group->size() > 1) {
      for (Buffer& b : buffers) {
        if (!b.tensor.defined()) continue;
        ::torch::Tensor t = b.tensor.contiguous();  // the same tensor where it already is
        Status sent = broadcast(*group, t, 0);
        if (!sent.ok()) return sent.with_context("train_step: broadcasting buffer '" + b.name + "'");
        if (!t.is_same(b.tensor)) b.tensor.copy_(t);
      }
    }
    if (!cuda) return Status::Ok();
    for (Buffer& b : buffers) {
      if (!b.mirrored) continue;
      CAPSTAN_ASSIGN_OR_RETURN(Tensor replica, variables->value(options.prefix + b.name));
      CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor view, to_torch(replica));
      view.copy_(b.tensor);
      b.synced = replica;
    }
    return Status::Ok();
  }

  // A CUDA module after a step's update: each parameter takes its
  // replica's new value.
  Status copy_replicas_in() {
    for (Parameter& p : parameters) p.synced = Tensor();  // a failure midway: the next step copies the rest
    for (Parameter& p : parameters) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor replica, variables->value(options.prefix + p.name));
      CAPSTAN_RETURN_IF_ERROR(take(p.tensor, p.synced, replica));
    }
    return Status::Ok();
  }

  // A CUDA module after backward: each bucket's mean through NCCL, in
  // bucket order on every rank, then into its host buffer for the
  // optimizer (which runs on the replicas). `reduced` gets the buffers.
  Status reduce_on_device(std::vector<Tensor>* reduced) {
    PhaseScope phase(Phase::kCollective);
    ::torch::NoGradGuard no_grad;
    // The hooks filled the buckets on autograd's streams, which need not
    // be the default stream NCCL is queued on here: wait for the device.
    ::torch::cuda::synchronize(cuda->index());
    for (Bucket& b : buckets) {
      Status s = all_reduce(*group, b.view, ReduceOp::kMean);
      if (!s.ok()) return s.with_context("train_step: all-reducing the gradients on " + cuda->str());
      count_launch(b);
      CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor host, to_torch(b.buffer));
      host.copy_(b.view);
      reduced->push_back(b.buffer);
    }
    stats.launched_after_backward = launched_this_step - stats.launched_in_backward;
    return Status::Ok();
  }

  // Packs the trained parameters into buckets (the same on every rank
  // that has the same parameters and options).
  Status make_buckets();

  // Launches the complete buckets from next_launch on, in order.
  void launch_ready() {
    if (cuda) return;  // reduced after backward (reduce_on_device)
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      Bucket& b = buckets[next_launch++];
      b.launched = true;
      b.reduced = group->all_reduce_async(b.buffer, ReduceOp::kMean);
      count_launch(b);
    }
  }

  // A bucket's all-reduce, in this step's count and the stats.
  void count_launch(const Bucket& b) {
    ++launched_this_step;
    ++stats.all_reduces;
    stats.all_reduce_bytes += static_cast<int64_t>(b.buffer.byte_size());
  }

  // The hook of parameters[index]: its gradient into its bucket.
  void on_gradient(size_t index, const ::torch::Tensor& gradient) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!in_backward) return;  // a backward of the program's own, outside train_step
    Parameter& p = parameters[index];
    Bucket& b = buckets[p.bucket];
    ::torch::NoGradGuard no_grad;
    ::torch::Tensor slot = b.view.narrow(0, p.offset, p.numel).view(gradient.sizes());
    if (p.ready) {
      // A second gradient for one parameter in one backward (the loss
      // function ran backward itself, or a graph reached the leaf twice).
      if (b.launched) {
        if (hook_error.ok()) {
          hook_error = Status::FailedPrecondition("train_step: parameter '" + p.name +
                                                  "' got a second gradient after its bucket was all-reduced");
        }
        return;
      }
      slot.add_(gradient, gradient_weight);
      return;
    }
    slot.copy_(gradient);
    if (gradient_weight != 1.0) slot.mul_(gradient_weight);
    p.ready = true;
    --b.pending;
    launch_ready();
  }

  // Whether `t` (a parameter or mirrored buffer; `synced` its record)
  // holds `replica`'s current values: on the CPU it views the replica's
  // buffer, on CUDA it was last copied from that buffer.
  bool holds(const ::torch::Tensor& t, const Tensor& synced, const Tensor& replica) const {
    if (cuda) return synced.valid() && synced.data() == replica.data();
    return t.data_ptr() == static_cast<const void*>(replica.data());
  }
  // Makes `t` hold `replica`: a view of it on the CPU, a copy on CUDA.
  Status take(::torch::Tensor& t, Tensor& synced, const Tensor& replica) {
    CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor view, to_torch(replica));
    ::torch::NoGradGuard no_grad;
    if (cuda) {
      t.copy_(view);
      synced = replica;
    } else {
      t.set_data(view);
    }
    return Status::Ok();
  }

  // Before a step: the module still has the parameters create saw, of the
  // same shapes, and each views its replica (set_group and
  // restore_checkpoint put new buffers in the variables).
  Status bind() {
    auto named = module->named_parameters(/*recurse=*/true);
    if (named.size() != parameters.size()) {
      return Status::FailedPrecondition("train_step: the module has " + std::to_string(named.size()) +
                                        " parameters, " + std::to_string(parameters.size()) +
                                        " when MirroredModule::create mirrored it (parameters were added or removed)");
    }
    size_t i = 0;
    for (const auto& item : named) {
      Parameter& p = parameters[i++];
      const ::torch::Tensor& t = item.value();
      if (item.key() != p.name || !t.is_same(p.tensor)) {
        return Status::FailedPrecondition("train_step: parameter '" + item.key() + "' is not the one named '" +
                                          p.name + "' that MirroredModule::create mirrored (a submodule was "
                                          "replaced?)");
      }
      if (Shape(t.sizes().begin(), t.sizes().end()) != p.shape || t.scalar_type() != *torch_dtype(p.dtype)) {
        std::ostringstream type;
        type << t.scalar_type();
        return Status::FailedPrecondition("train_step: parameter '" + p.name + "' is " + type.str() +
                                          sizes_string(t.sizes()) + "; its mirrored variable '" +
                                          options.prefix + p.name + "' is " + std::string(dtype_name(p.dtype)) +
                                          shape_string(p.shape) + " (the module changed since create)");
      }
    }
    auto named_buffers = module->named_buffers(/*recurse=*/true);
    if (named_buffers.size() != buffers.size()) {
      return Status::FailedPrecondition("train_step: the module has " + std::to_string(named_buffers.size()) +
                                        " buffers, " + std::to_string(buffers.size()) +
                                        " when MirroredModule bound it (buffers were added or removed)");
    }
    i = 0;
    for (const auto& item : named_buffers) {
      Buffer& b = buffers[i++];
      if (item.key() != b.name || !item.value().is_same(b.tensor)) {
        return Status::FailedPrecondition("train_step: buffer '" + item.key() + "' is not the one named '" + b.name +
                                          "' that MirroredModule bound (a buffer or submodule was replaced?)");
      }
    }
    for (Buffer& b : buffers) {
      if (!b.mirrored) continue;
      CAPSTAN_ASSIGN_OR_RETURN(Tensor replica, variables->value(options.prefix + b.name));
      if (holds(b.tensor, b.synced, replica)) continue;
      if (Shape(b.tensor.sizes().begin(), b.tensor.sizes().end()) != replica.shape()) {
        return Status::FailedPrecondition("train_step: buffer '" + b.name + "' is " +
                                          sizes_string(b.tensor.sizes()) + "; its mirrored variable '" +
                                          options.prefix + b.name + "' is " + shape_string(replica.shape()) +
                                          " (the module changed since it was bound)");
      }
      CAPSTAN_RETURN_IF_ERROR(take(b.tensor, b.synced, replica));
    }
    for (Parameter& p : parameters) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor replica, variables->value(options.prefix + p.name));
      if (!holds(p.tensor, p.synced, replica)) CAPSTAN_RETURN_IF_ERROR(take(p.tensor, p.synced, replica));
    }
    return Status::Ok();
  }

  // Parameters that got no gradient: zeros in their buckets, which then
  // launch as they complete. `except`: leaves whose gradients are still to
  // come (nullptr: none are).
  void zero_unused(const std::unordered_set<const void*>* except) {
    ::torch::NoGradGuard no_grad;
    for (size_t b = next_launch; b < buckets.size(); ++b) {
      Bucket& bucket = buckets[b];
      for (size_t i : bucket.parameters) {
        Parameter& p = parameters[i];
        if (p.ready || (except != nullptr && except->count(p.tensor.unsafeGetTensorImpl()) > 0)) continue;
        bucket.view.narrow(0, p.offset, p.numel).zero_();
        p.ready = true;
        --bucket.pending;
      }
    }
    launch_ready();
  }

  // Ready for the next step: no gradient in any bucket, none in .grad.
  void reset_step() {
    std::lock_guard<std::mutex> lock(mutex);
    in_backward = false;
    next_launch = 0;
    launched_this_step = 0;
    hook_error = Status::Ok();
    for (Bucket& b : buckets) {
      b.pending = b.parameters.size();
      b.launched = false;
    }
    for (Parameter& p : parameters) {
      p.ready = false;
      if (p.tensor.grad().defined()) p.tensor.mutable_grad().reset();
    }
  }

  // Waits for every launched bucket; the first failure. `reduced` gets
  // each bucket's mean (an invalid tensor where none came).
  // Waiting counts as the all-reduce phase (capstan/phases.h): what the
  // buckets overlapped with backward is not.
  Status wait_launched(std::vector<Tensor>* reduced) {
    PhaseScope phase(Phase::kCollective);
    Status first;
    for (Bucket& b : buckets) {
      Tensor mean;
      if (b.reduced.valid()) {
        Result<Tensor> r = b.reduced.get();
        if (r.ok()) {
          mean = std::move(*r);
        } else if (first.ok()) {
          first = r.status().with_context("train_step: all-reducing the gradients");
        }
      }
      if (reduced != nullptr) reduced->push_back(std::move(mean));
    }
    return first;
  }

  // A failure after buckets were launched: the ranks' collectives no
  // longer line up, so the group cannot go on.
  Status fail_launched(Status status) {
    group->abort(status);
    (void)wait_launched(nullptr);
    reset_step();
    return status;
  }

  // The bucket layout, in a few numbers every rank must agree on.
  uint64_t bucket_digest() const {
    uint64_t h = 14695981039346656037ull;
    auto mix = [&h](int64_t x) {
      for (int i = 0; i < 8; ++i) {
        h ^= static_cast<uint64_t>(x >> (8 * i)) & 0xff;
        h *= 1099511628211ull;
      }
    };
    for (const Bucket& b : buckets) {
      mix(static_cast<int64_t>(b.dtype));
      mix(static_cast<int64_t>(b.buffer.num_elements()));
      mix(static_cast<int64_t>(b.parameters.size()));
    }
    return h;
  }
};

MirroredModule::MirroredModule(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MirroredModule::~MirroredModule() {
  for (auto& p : impl_->parameters) {
    if (p.hook) p.tensor.remove_hook(*p.hook);
  }
}

Result<std::unique_ptr<MirroredModule>> MirroredModule::create(Communicator& group, ::torch::nn::Module& module,
                                                               MirroredOptions options) {
  if (options.bucket_bytes <= 0 || options.first_bucket_bytes <= 0) {
    return Status::InvalidArgument("MirroredModule: bucket_bytes (" + std::to_string(options.bucket_bytes) +
                                   ") and first_bucket_bytes (" + std::to_string(options.first_bucket_bytes) +
                                   ") must be positive");
  }
  auto impl = std::make_unique<Impl>();
  impl->group = &group;
  impl->module = &module;
  impl->options = options;
  std::vector<MirroredVariableSpec> specs;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const ::torch::Tensor& t = item.value();
    CAPSTAN_ASSIGN_OR_RETURN(Impl::Parameter p, Impl::describe(item.key(), t));
    // The initial value, copied (a parameter may be a non-contiguous view).
    CAPSTAN_ASSIGN_OR_RETURN(Tensor initial, Tensor::uninitialized(p.dtype, p.shape));
    CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor into, to_torch(initial));
    {
      ::torch::NoGradGuard no_grad;
      into.copy_(t);
    }
    Optimizer optimizer = p.trained ? optimizer_for(p.name, options) : Optimizer::none();
    specs.push_back({options.prefix + p.name, std::move(initial), optimizer});
    impl->parameters.push_back(std::move(p));
  }
  // Float buffers become mirrored variables that take no gradient (their
  // initial values: rank 0's, as the parameters').
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    Impl::Buffer b = Impl::describe_buffer(item.key(), item.value());
    if (b.mirrored) {
      CAPSTAN_RETURN_IF_ERROR(impl->make_zeros(b));
      CAPSTAN_ASSIGN_OR_RETURN(Tensor initial, Tensor::uninitialized(b.zeros.dtype(), b.zeros.shape()));
      CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor into, to_torch(initial));
      {
        ::torch::NoGradGuard no_grad;
        into.copy_(b.tensor);
      }
      specs.push_back({options.prefix + b.name, std::move(initial), Optimizer::none()});
    }
    impl->buffers.push_back(std::move(b));
  }
  CAPSTAN_RETURN_IF_ERROR(impl->find_device());
  for (const auto& [name, optimizer] : options.optimizers) {
    bool found = false;
    for (const auto& p : impl->parameters) found = found || p.name == name;
    if (!found) {
      return Status::InvalidArgument("MirroredModule: options.optimizers names '" + name +
                                     "', which is not a parameter of the module");
    }
  }
  CAPSTAN_ASSIGN_OR_RETURN(impl->owned_variables, MirroredVariables::create(group, std::move(specs)));
  impl->variables = impl->owned_variables.get();
  for (size_t i = 0; i < impl->parameters.size(); ++i) impl->variable_sources.push_back({false, i});
  for (size_t i = 0; i < impl->buffers.size(); ++i) {
    if (impl->buffers[i].mirrored) impl->variable_sources.push_back({true, i});
  }
  CAPSTAN_RETURN_IF_ERROR(impl->make_buckets());
  // Same buckets everywhere, or the all-reduces would not line up.
  const uint64_t digest = impl->bucket_digest();
  CAPSTAN_ASSIGN_OR_RETURN(Tensor digests,
                           group.all_gather(*Tensor::from_vector<int64_t>({static_cast<int64_t>(digest)}, {1})));
  for (size_t r = 0; r < static_cast<size_t>(group.size()); ++r) {
    if (static_cast<uint64_t>(digests.flat<int64_t>()[r]) != digest) {
      return Status::InvalidArgument("MirroredModule: rank " + std::to_string(r) +
                                     " packs the gradients into other buckets than rank " +
                                     std::to_string(group.rank()) +
                                     " (every rank must pass the same bucket_bytes and first_bucket_bytes)");
    }
  }
  return finish(std::move(impl));
}

Status MirroredModule::Impl::make_buckets() {
  // Trained parameters in reverse order of registration.
  int64_t bucket_used = 0;
  for (size_t i = parameters.size(); i-- > 0;) {
    Parameter& p = parameters[i];
    if (!p.trained) continue;
    const int64_t bytes = p.numel * static_cast<int64_t>(dtype_size(p.dtype));
    const int64_t cap = buckets.size() <= 1 ? options.first_bucket_bytes : options.bucket_bytes;
    if (buckets.empty() || buckets.back().dtype != p.dtype || (bucket_used > 0 && bucket_used + bytes > cap)) {
      Bucket b;
      b.dtype = p.dtype;
      buckets.push_back(std::move(b));
      bucket_used = 0;
    }
    Bucket& b = buckets.back();
    p.bucket = buckets.size() - 1;
    p.offset = bucket_used / static_cast<int64_t>(dtype_size(p.dtype));
    b.parameters.push_back(i);
    bucket_used += bytes;
  }
  for (Bucket& b : buckets) {
    int64_t elements = 0;
    for (size_t i : b.parameters) elements += parameters[i].numel;
    CAPSTAN_ASSIGN_OR_RETURN(b.buffer, Tensor::zeros(b.dtype, {elements}));
    CAPSTAN_ASSIGN_OR_RETURN(b.view, to_torch(b.buffer));
    if (cuda) b.view = b.view.to(*cuda);
    b.pending = b.parameters.size();
  }
  stats.buckets = static_cast<int64_t>(buckets.size());
  return Status::Ok();
}

Result<std::unique_ptr<MirroredModule>> MirroredModule::attach(MirroredVariables& replicas,
                                                               ::torch::nn::Module& module, MirroredOptions options) {
  if (options.bucket_bytes <= 0 || options.first_bucket_bytes <= 0) {
    return Status::InvalidArgument("MirroredModule: bucket_bytes (" + std::to_string(options.bucket_bytes) +
                                   ") and first_bucket_bytes (" + std::to_string(options.first_bucket_bytes) +
                                   ") must be positive");
  }
  auto impl = std::make_unique<Impl>();
  impl->module = &module;
  impl->options = options;
  impl->variables = &replicas;
  std::map<std::string, size_t> by_variable;  // prefix + parameter name -> parameter
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    CAPSTAN_ASSIGN_OR_RETURN(Impl::Parameter p, Impl::describe(item.key(), item.value()));
    by_variable[options.prefix + p.name] = impl->parameters.size();
    impl->parameters.push_back(std::move(p));
  }
  // Buffers with a replica of their name are mirrored (it must match them);
  // the others are only broadcast.
  const std::vector<std::string> replica_names = replicas.names();
  std::map<std::string, size_t> by_buffer;  // prefix + buffer name -> buffer
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    Impl::Buffer b = Impl::describe_buffer(item.key(), item.value());
    const std::string name = options.prefix + b.name;
    auto replica = replicas.value(name);
    b.mirrored = replica.ok();
    if (b.mirrored) {
      auto dtype = capstan_dtype(b.tensor.scalar_type());
      const Shape shape(b.tensor.sizes().begin(), b.tensor.sizes().end());
      if (!dtype.ok() || *dtype != replica->dtype() || shape != replica->shape()) {
        return Status::InvalidArgument("MirroredModule::attach: buffer '" + b.name + "' is " +
                                       (dtype.ok() ? std::string(dtype_name(*dtype)) : std::string("?")) +
                                       shape_string(shape) + "; its mirrored variable '" + name + "' is " +
                                       std::string(dtype_name(replica->dtype())) + shape_string(replica->shape()));
      }
      CAPSTAN_RETURN_IF_ERROR(impl->make_zeros(b));
      by_buffer[name] = impl->buffers.size();
    }
    impl->buffers.push_back(std::move(b));
  }
  // Every parameter has its replica, of its dtype and shape...
  for (const Impl::Parameter& p : impl->parameters) {
    const std::string name = options.prefix + p.name;
    auto replica = replicas.value(name);
    if (!replica.ok()) {
      return Status::InvalidArgument("MirroredModule::attach: parameter '" + p.name + "' (" +
                                     std::string(dtype_name(p.dtype)) + shape_string(p.shape) +
                                     ") has no mirrored variable '" + name + "' among the replicas");
    }
    if (replica->dtype() != p.dtype || replica->shape() != p.shape) {
      return Status::InvalidArgument("MirroredModule::attach: parameter '" + p.name + "' is " +
                                     std::string(dtype_name(p.dtype)) + shape_string(p.shape) +
                                     "; its mirrored variable '" + name + "' is " +
                                     std::string(dtype_name(replica->dtype())) + shape_string(replica->shape()));
    }
  }
  // ...and every replica is a parameter or a buffer: a step applies a
  // gradient to each.
  for (const std::string& name : replica_names) {
    if (auto buffer = by_buffer.find(name); buffer != by_buffer.end()) {
      impl->variable_sources.push_back({true, buffer->second});
      continue;
    }
    auto it = by_variable.find(name);
    if (it == by_variable.end()) {
      return Status::InvalidArgument("MirroredModule::attach: mirrored variable '" + name +
                                     "' is no parameter or buffer of the module (prefix '" + options.prefix +
                                     "'); every replica must be one");
    }
    impl->variable_sources.push_back({false, it->second});
  }
  CAPSTAN_RETURN_IF_ERROR(impl->find_device());
  CAPSTAN_RETURN_IF_ERROR(impl->make_buckets());
  return finish(std::move(impl));
}

Result<std::unique_ptr<MirroredModule>> MirroredModule::finish(std::unique_ptr<Impl> impl) {
  // The module's parameters become views of the replicas (rank 0's values).
  CAPSTAN_RETURN_IF_ERROR(impl->bind());
  Impl* raw = impl.get();
  for (size_t i = 0; i < raw->parameters.size(); ++i) {
    Impl::Parameter& p = raw->parameters[i];
    if (!p.trained) continue;
    p.hook = p.tensor.register_hook([raw, i](const ::torch::Tensor& gradient) { raw->on_gradient(i, gradient); });
  }
  return std::unique_ptr<MirroredModule>(new MirroredModule(std::move(impl)));
}

Result<::torch::Tensor> MirroredModule::train_step(Communicator& group,
                                                   const std::function<::torch::Tensor()>& loss,
                                                   const ApplyOptions& options) {
  impl_->group = &group;
  return train_step(loss, options);
}

Result<::torch::Tensor> MirroredModule::train_step(const std::function<::torch::Tensor()>& loss,
                                                   const ApplyOptions& options) {
  Impl& impl = *impl_;
  if (impl.group == nullptr) {
    return Status::FailedPrecondition(
        "train_step: this MirroredModule was attached to replicas without a group; pass the step's group "
        "(train_step(group, loss))");
  }
  if (options.learning_rate && !(std::isfinite(*options.learning_rate) && *options.learning_rate >= 0)) {
    std::ostringstream rate;
    rate << *options.learning_rate;
    return Status::InvalidArgument("train_step: learning_rate override must be finite and >= 0, got " + rate.str());
  }
  CAPSTAN_RETURN_IF_ERROR(impl.bind());
  impl.reset_step();
  ::torch::Tensor computed;
  try {
    computed = loss();
  } catch (const std::exception& e) {
    impl.reset_step();
    return Status::InvalidArgument("train_step: the loss function threw: " + torch_error(e));
  }
  if (!computed.defined() || computed.numel() != 1) {
    impl.reset_step();
    return Status::InvalidArgument("train_step: the loss has shape " +
                                   (computed.defined() ? sizes_string(computed.sizes()) : std::string("(undefined)")) +
                                   "; it must be one value (reduce it, e.g. with .mean())");
  }
  if (!computed.requires_grad()) {
    impl.reset_step();
    return Status::InvalidArgument("train_step: the loss does not depend on any trained parameter (no gradient)");
  }

  {
    std::lock_guard<std::mutex> lock(impl.mutex);
    impl.in_backward = true;
    impl.gradient_weight = impl.variables != nullptr ? impl.variables->gradient_weight() : 1.0;
    // Parameters this backward will not reach go now, so that their
    // buckets do not hold back the others until backward returns.
    if (impl.options.find_unused_parameters) {
      const std::unordered_set<const void*> reached = reached_leaves(computed);
      impl.zero_unused(&reached);
    }
  }
  try {
    computed.backward();
  } catch (const std::exception& e) {
    Status failed = Status::InvalidArgument("train_step: backward threw: " + torch_error(e));
    bool launched;
    {
      std::lock_guard<std::mutex> lock(impl.mutex);
      impl.in_backward = false;
      launched = impl.launched_this_step > 0;
    }
    if (launched) return impl.fail_launched(failed);
    impl.reset_step();
    return failed;
  }
  Status hook_error;
  {
    std::lock_guard<std::mutex> lock(impl.mutex);
    impl.in_backward = false;
    impl.stats.launched_in_backward = impl.launched_this_step;
    hook_error = impl.hook_error;
    // Parameters that got no gradient after all: zeros, and every
    // remaining bucket goes.
    if (hook_error.ok()) impl.zero_unused(nullptr);
    impl.stats.launched_after_backward = impl.launched_this_step - impl.stats.launched_in_backward;
  }
  if (!hook_error.ok()) return impl.fail_launched(hook_error);

  std::vector<Tensor> reduced;
  if (Status waited = impl.cuda ? impl.reduce_on_device(&reduced) : impl.wait_launched(&reduced); !waited.ok()) {
    impl.reset_step();
    return waited;  // the communicator aborted the group
  }
  // Each parameter's mean gradient: a view into its bucket's result.
  std::vector<Tensor> by_parameter;
  by_parameter.reserve(impl.parameters.size());
  for (const Impl::Parameter& p : impl.parameters) {
    if (!p.trained) {
      by_parameter.push_back(p.zeros);
      continue;
    }
    auto owner = std::make_shared<Tensor>(reduced[p.bucket]);
    const size_t element = dtype_size(p.dtype);
    std::byte* data = owner->mutable_data() + static_cast<size_t>(p.offset) * element;
    CAPSTAN_ASSIGN_OR_RETURN(Tensor g, Tensor::from_buffer(p.dtype, p.shape, std::move(owner), data,
                                                           static_cast<size_t>(p.numel) * element));
    by_parameter.push_back(std::move(g));
  }
  std::vector<Tensor> gradients;  // in the variables' order
  gradients.reserve(impl.variable_sources.size());
  for (const Impl::Source& source : impl.variable_sources) {
    gradients.push_back(source.buffer ? impl.buffers[source.index].zeros : by_parameter[source.index]);
  }
  Status applied = impl.variables->apply_averaged_gradients(gradients, options);
  impl.reset_step();
  if (!applied.ok()) return applied;
  if (impl.cuda) CAPSTAN_RETURN_IF_ERROR(impl.copy_replicas_in());
  // A failure here is a collective's: the group is gone, as after any.
  CAPSTAN_RETURN_IF_ERROR(impl.broadcast_buffers());
  ++impl.stats.steps;
  return computed.detach();
}

Result<Tensor> MirroredModule::value(const std::string& parameter) const {
  return impl_->variables->value(impl_->options.prefix + parameter);
}

uint64_t MirroredModule::checksum() const { return impl_->variables->checksum(); }

Status MirroredModule::verify_replicas() { return impl_->variables->verify_replicas(); }

Status MirroredModule::set_group(Communicator& group, int source) {
  CAPSTAN_RETURN_IF_ERROR(impl_->variables->set_group(group, source));
  impl_->group = &group;
  return impl_->bind();
}

MirroredVariables& MirroredModule::variables() { return *impl_->variables; }

const MirroredStats& MirroredModule::stats() const { return impl_->stats; }

}  // namespace capstan::torch
