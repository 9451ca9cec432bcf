// Closures for the parameter-server training tests, loaded by worker-server
// with --module (as users' modules are).
#include <capstan/closure.h>
#include <capstan/data/dataset.h>
#include <capstan/functions.h>
#include <capstan/mirrored.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <thread>
#include <vector>

using capstan::ClosureContext;
using capstan::Element;
using capstan::Result;
using capstan::Status;
using capstan::Tensor;

namespace {

// Synchronous steps of a linear regression y = 3 x0 - 2 x1 + 1 over a
// deterministic stream of examples: example i is x = (sin i, cos 3i). A
// step of global batch B covers examples [step * B, (step + 1) * B); replica
// r of n takes its n-th part (equal parts), so n replicas of batch B / n see
// exactly the examples one replica of batch B sees. The gradient is of the
// replica's mean squared error; apply_gradients averages the replicas'.
// Mirrored variables: "w" float32[2], "b" float32[1].
// Returns [this replica's loss, replica id, replicas in sync, the
// variables' step before].
Result<Element> linear_step(ClosureContext& ctx, int64_t step, int64_t global_batch) {
  capstan::MirroredVariables* vars = ctx.mirrored();
  if (vars == nullptr) return Status::FailedPrecondition("linear_step runs as a synchronous step");
  const int64_t n = ctx.num_replicas_in_sync();
  if (global_batch % n != 0) return Status::InvalidArgument("global batch must divide by the replicas");
  const int64_t local = global_batch / n;
  const int64_t first = step * global_batch + ctx.replica_id() * local;
  CAPSTAN_ASSIGN_OR_RETURN(Tensor w, vars->value("w"));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor b, vars->value("b"));
  const float w0 = w.flat<float>()[0], w1 = w.flat<float>()[1], b0 = b.flat<float>()[0];
  double gw0 = 0, gw1 = 0, gb = 0, loss = 0;
  for (int64_t i = first; i < first + local; ++i) {
    const double x0 = std::sin(static_cast<double>(i)), x1 = std::cos(3.0 * static_cast<double>(i));
    const double y = 3 * x0 - 2 * x1 + 1;
    const double err = w0 * x0 + w1 * x1 + b0 - y;
    loss += err * err;
    gw0 += 2 * err * x0;
    gw1 += 2 * err * x1;
    gb += 2 * err;
  }
  const double k = static_cast<double>(local);
  const int64_t before = vars->step();
  CAPSTAN_RETURN_IF_ERROR(vars->apply_gradients(
      {Tensor::from_vector<float>({static_cast<float>(gw0 / k), static_cast<float>(gw1 / k)}, {2}).value(),
       Tensor::from_vector<float>({static_cast<float>(gb / k)}, {1}).value()}));
  return Element{{Tensor::scalar<float>(static_cast<float>(loss / k)), Tensor::scalar<int64_t>(ctx.replica_id()),
                  Tensor::scalar<int64_t>(n), Tensor::scalar<int64_t>(before)},
                 {}};
}

// The same regression over a strategy's step input of example ids (a
// dataset of int64 scalars): the step's batch is this replica's share of
// the ids (ctx.iterator). Pauses `pause_ms` before the update (a replica
// lost then fails the step before anyone applied it). Returns [this
// replica's loss, the ids it trained on, the variables' step before].
Result<Element> input_linear_step(ClosureContext& ctx, const Tensor& input, int64_t pause_ms) {
  capstan::MirroredVariables* vars = ctx.mirrored();
  if (vars == nullptr) return Status::FailedPrecondition("input_linear_step runs as a synchronous step");
  CAPSTAN_ASSIGN_OR_RETURN(capstan::data::Iterator * it, ctx.iterator(input));
  CAPSTAN_ASSIGN_OR_RETURN(std::optional<Element> batch, it->get_next());
  if (!batch.has_value()) return Status::OutOfRange("the step input gave no batch");
  const Tensor ids = batch->components.at(0);
  CAPSTAN_ASSIGN_OR_RETURN(Tensor w, vars->value("w"));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor b, vars->value("b"));
  const float w0 = w.flat<float>()[0], w1 = w.flat<float>()[1], b0 = b.flat<float>()[0];
  double gw0 = 0, gw1 = 0, gb = 0, loss = 0;
  for (int64_t id : ids.flat<int64_t>()) {
    const double x0 = std::sin(static_cast<double>(id)), x1 = std::cos(3.0 * static_cast<double>(id));
    const double err = w0 * x0 + w1 * x1 + b0 - (3 * x0 - 2 * x1 + 1);
    loss += err * err;
    gw0 += 2 * err * x0;
    gw1 += 2 * err * x1;
    gb += 2 * err;
  }
  if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  const auto k = static_cast<double>(ids.num_elements());
  const int64_t before = vars->step();
  CAPSTAN_RETURN_IF_ERROR(vars->apply_gradients(
      {Tensor::from_vector<float>({static_cast<float>(gw0 / k), static_cast<float>(gw1 / k)}, {2}).value(),
       Tensor::from_vector<float>({static_cast<float>(gb / k)}, {1}).value()}));
  return Element{{Tensor::scalar<float>(static_cast<float>(loss / k)), ids, Tensor::scalar<int64_t>(before)}, {}};
}

}  // namespace

CAPSTAN_MODULE(registry) {
  // A synchronous step that reads nothing (an evaluation): the variables'
  // step.
  registry.register_closure("mirrored_step", [](ClosureContext& ctx, const Element&) -> Result<Element> {
    if (ctx.mirrored() == nullptr) return Status::FailedPrecondition("mirrored_step runs as a synchronous step");
    return Element{{Tensor::scalar<int64_t>(ctx.mirrored()->step())}, {}};
  });
  // Synchronous step over a step input: args [the input's arg(), pause ms].
  registry.register_closure("input_linear_step", [](ClosureContext& ctx, const Element& args) -> Result<Element> {
    const int64_t pause = args.components.size() > 1 ? args.components[1].flat<int64_t>()[0] : 0;
    return input_linear_step(ctx, args.components.at(0), pause);
  });
  // Synchronous step: args [step, global batch] (int64 scalars).
  registry.register_closure("linear_step", [](ClosureContext& ctx, const Element& args) -> Result<Element> {
    return linear_step(ctx, args.components.at(0).flat<int64_t>()[0], args.components.at(1).flat<int64_t>()[0]);
  });
  // A linear step, then a pause of args[2] ms, then an all-reduce of the
  // replica ids (so that a replica lost in the pause is missed).
  registry.register_closure("slow_linear_step", [](ClosureContext& ctx, const Element& args) -> Result<Element> {
    CAPSTAN_ASSIGN_OR_RETURN(Element out, linear_step(ctx, args.components.at(0).flat<int64_t>()[0],
                                                      args.components.at(1).flat<int64_t>()[0]));
    std::this_thread::sleep_for(std::chrono::milliseconds(args.components.at(2).flat<int64_t>()[0]));
    CAPSTAN_RETURN_IF_ERROR(
        ctx.all_reduce(Tensor::scalar<float>(static_cast<float>(ctx.replica_id())), capstan::ReduceOp::kSum).status());
    return out;
  });
  // Replica args[0] fails before its collectives; the others step.
  registry.register_closure("fail_on_replica", [](ClosureContext& ctx, const Element& args) -> Result<Element> {
    if (ctx.replica_id() == args.components.at(0).flat<int64_t>()[0]) {
      return Status::InvalidArgument("replica " + std::to_string(ctx.replica_id()) + " refuses its batch");
    }
    return linear_step(ctx, 0, 2 * ctx.num_replicas_in_sync());
  });

  // counter += 1; returns the worker index.
  registry.register_closure("add_one", [](ClosureContext& ctx, const Element&) -> Result<Element> {
    CAPSTAN_RETURN_IF_ERROR(ctx.assign_add("counter", Tensor::scalar<float>(1.0f)));
    return Element{{Tensor::scalar<int64_t>(ctx.worker_index())}, {}};
  });
  // Rows args[0] of "emb".
  registry.register_closure("gather_rows", [](ClosureContext& ctx, const Element& args) -> Result<Element> {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor rows, ctx.gather("emb", args.components.at(0)));
    return Element{{rows}, {}};
  });
  // Adds args[0] (rows for ids args[1]) as a sparse SGD gradient to "emb".
  registry.register_closure("sparse_step", [](ClosureContext& ctx, const Element& args) -> Result<Element> {
    CAPSTAN_RETURN_IF_ERROR(ctx.apply_sparse_gradients("emb", args.components.at(1), args.components.at(0)));
    return Element{};
  });
  // Fails, after sleeping args[0] milliseconds when given.
  registry.register_closure("fail", [](ClosureContext&, const Element& args) -> Result<Element> {
    if (!args.components.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(args.components[0].flat<int64_t>()[0]));
    }
    return Status::InvalidArgument("this closure always fails");
  });
  // Sleeps args[0] milliseconds, then adds 1 to "counter" and returns args[1]
  // (a unique tag). Cancellable: a cancelled run stops sleeping and returns
  // without touching the counter.
  registry.register_closure("sleep_then_tag", [](ClosureContext& ctx, const Element& args) -> Result<Element> {
    auto until = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(args.components.at(0).flat<int64_t>()[0]);
    while (std::chrono::steady_clock::now() < until) {
      if (ctx.cancelled()) return Status::Cancelled("stopped early");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    CAPSTAN_RETURN_IF_ERROR(ctx.assign_add("counter", Tensor::scalar<float>(1.0f)));
    return Element{{args.components.at(1)}, {}};
  });
  // As sleep_then_tag (args[0] ms, then counter += 1, returns args[1]), and
  // also adds 1 to element args[2] of the float vector "runs" (64 long), so a
  // test counts the runs of each closure.
  registry.register_closure("sleep_then_count", [](ClosureContext& ctx, const Element& args) -> Result<Element> {
    auto until = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(args.components.at(0).flat<int64_t>()[0]);
    while (std::chrono::steady_clock::now() < until) {
      if (ctx.cancelled()) return Status::Cancelled("stopped early");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const int64_t slot = args.components.at(2).flat<int64_t>()[0];
    if (slot < 0 || slot >= 64) return Status::InvalidArgument("slot " + std::to_string(slot) + " is not in 0..63");
    std::vector<float> one_hot(64, 0.0f);
    one_hot[static_cast<size_t>(slot)] = 1.0f;
    CAPSTAN_ASSIGN_OR_RETURN(Tensor delta, Tensor::from_vector<float>(one_hot, {64}));
    CAPSTAN_RETURN_IF_ERROR(ctx.assign_add("runs", delta));
    CAPSTAN_RETURN_IF_ERROR(ctx.assign_add("counter", Tensor::scalar<float>(1.0f)));
    return Element{{args.components.at(1)}, {}};
  });
  // [the next element of this worker's per-worker iterator (-1 at the end),
  //  this worker's index].
  registry.register_closure("next_element", [](ClosureContext& ctx, const Element& args) -> Result<Element> {
    CAPSTAN_ASSIGN_OR_RETURN(capstan::data::Iterator * it, ctx.iterator(args.components.at(0)));
    CAPSTAN_ASSIGN_OR_RETURN(auto next, it->get_next());
    Tensor value = next ? next->components.at(0) : Tensor::scalar<int64_t>(-1);
    return Element{{value, Tensor::scalar<int64_t>(ctx.worker_index())}, {}};
  });
  // TF's per-worker dataset function: shard by the input context.
  registry.register_dataset_function("sharded_range", [](const capstan::InputContext& ctx) {
    return capstan::data::Dataset::range(20).shard(ctx.num_input_pipelines, ctx.input_pipeline_id);
  });
  registry.register_closure("noop", [](ClosureContext&, const Element&) -> Result<Element> {
    return Element{};
  });
  // Adds 1 to "started", sleeps args[0] milliseconds, then returns
  // [attempt, num_workers, worker_index] as int64 scalars.
  registry.register_closure("context_after_sleep", [](ClosureContext& ctx, const Element& args) -> Result<Element> {
    CAPSTAN_RETURN_IF_ERROR(ctx.assign_add("started", Tensor::scalar<float>(1.0f)));
    std::this_thread::sleep_for(std::chrono::milliseconds(args.components.at(0).flat<int64_t>()[0]));
    return Element{{Tensor::scalar<int64_t>(ctx.attempt()), Tensor::scalar<int64_t>(ctx.num_workers()),
                    Tensor::scalar<int64_t>(ctx.worker_index())},
                   {}};
  });
}
