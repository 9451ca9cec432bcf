// Closures for the parameter-server training tests, loaded by worker-server
// with --module (as users' modules are).
#include <capstan/closure.h>
#include <capstan/data/dataset.h>
#include <capstan/functions.h>

#include <chrono>
#include <thread>

using capstan::ClosureContext;
using capstan::Element;
using capstan::Result;
using capstan::Status;
using capstan::Tensor;

CAPSTAN_MODULE(registry) {
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
