// Closures that train LibTorch models on the parameter servers, loaded by
// worker-server with --module (as users' modules are). The models are the
// ones torch_cluster_test.cc trains locally for comparison.
#include <capstan/functions.h>
#include <capstan/torch.h>

#include <cstdio>

#include "torch/tests/torch_test_models.h"

namespace {

using capstan::ClosureContext;
using capstan::Element;
using capstan::Result;
using capstan::Tensor;

// args: [x float32[n, 4], y float32[n, 1]]; one SGD step of the MLP (its
// variables under "mlp/"); returns the loss.
Result<Element> mlp_step(ClosureContext& ctx, const Element& args) {
  // One model per worker process, reused by every step: its values come
  // from the parameter servers at each step.
  static auto model = std::make_shared<capstan::torch::testing::Mlp>();
  static capstan::torch::PsModule ps(*model, {.prefix = "mlp/"});
  if (args.size() != 2) return capstan::Status::InvalidArgument("mlp_step takes [x, y]");
  CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor x, capstan::torch::to_torch(args.components[0]));
  CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor y, capstan::torch::to_torch(args.components[1]));
  CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor loss,
                           ps.train_step(ctx, [&] { return ::torch::mse_loss(model->forward(x), y); }));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor value, capstan::torch::from_torch(loss));
  return Element{{value}, {}};
}

// args: [ids int64[n, 3], y float32[n, 1]]; one step of the tower (a
// Capstan Embedding under "tower/", or a hash-table one under "table/");
// returns the loss.
Result<Element> tower_step(ClosureContext& ctx, const Element& args, bool hash_table) {
  static auto dense_model = std::make_shared<capstan::torch::testing::Tower>(true);
  static auto table_model = std::make_shared<capstan::torch::testing::Tower>(true, true);
  static capstan::torch::PsModule dense_ps(*dense_model, {.prefix = "tower/"});
  static capstan::torch::PsModule table_ps(*table_model, {.prefix = "table/"});
  auto& model = hash_table ? table_model : dense_model;
  auto& ps = hash_table ? table_ps : dense_ps;
  if (args.size() != 2) return capstan::Status::InvalidArgument("tower_step takes [ids, y]");
  CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor ids, capstan::torch::to_torch(args.components[0]));
  CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor y, capstan::torch::to_torch(args.components[1]));
  CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor loss,
                           ps.train_step(ctx, [&] { return ::torch::mse_loss(model->forward(ids), y); }));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor value, capstan::torch::from_torch(loss));
  return Element{{value}, {}};
}

// args: [x float32[n, 4], y float32[n, 1], grow int64[1]]; one SGD step of
// the MLP under "grow/" -- but once grow is non-zero, its last layer has 2
// outputs instead of 1 first: a module that changed a parameter's shape
// between steps, which the step must refuse (torch_cluster_test.cc).
Result<Element> grow_step(ClosureContext& ctx, const Element& args) {
  static auto model = std::make_shared<capstan::torch::testing::Mlp>();
  static capstan::torch::PsModule ps(*model, {.prefix = "grow/"});
  if (args.size() != 3 || args.components[2].num_elements() != 1) {
    return capstan::Status::InvalidArgument("grow_step takes [x, y, grow (one int64)]");
  }
  CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor x, capstan::torch::to_torch(args.components[0]));
  CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor y, capstan::torch::to_torch(args.components[1]));
  CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor grow, capstan::torch::to_torch(args.components[2]));
  if (grow.item<int64_t>() != 0 && model->second->options.out_features() == 1) {
    model->second = ::torch::nn::Linear(8, 2);
    model->replace_module("second", model->second);
  }
  CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor loss, ps.train_step(ctx, [&] {
    return ::torch::mse_loss(model->forward(x).sum(1, /*keepdim=*/true), y);
  }));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor value, capstan::torch::from_torch(loss));
  return Element{{value}, {}};
}

// fit's models (fit_cluster_test.cc): the MLP as a binary classifier of
// [x float32[n, 4], y float32[n, 1]] batches, with sgd (rate 0.5) under
// "fit/", and with adam (0.01) under "fitadam/"; and the hybrid Tower.
capstan::Status register_fit_models(capstan::FunctionRegistry& registry) {
  for (const bool adam : {false, true}) {
    auto model = std::make_shared<capstan::torch::testing::Mlp>();
    capstan::torch::ModelSpec spec{
        .module = model,
        .forward = [model](const std::vector<::torch::Tensor>& batch) { return model->forward(batch[0]); },
        .loss = [](const ::torch::Tensor& logits, const ::torch::Tensor& y) {
          return ::torch::binary_cross_entropy_with_logits(logits, y);
        },
        .ps = {.prefix = adam ? "fitadam/" : "fit/",
               .optimizer = adam ? capstan::Optimizer::adam(0.01) : capstan::Optimizer::sgd(0.5)}};
    CAPSTAN_RETURN_IF_ERROR(capstan::torch::register_model(registry, adam ? "fit_adam" : "fit_mlp", std::move(spec)));
  }
  // Hybrid: the Tower (a capstan::torch::Embedding of 20 x 3, then a
  // Linear(3, 1)) as a binary classifier of [ids int64[n, 3], y float32[n,
  // 1]] batches under "hyb/": the rows on the parameter servers, the head
  // mirrored by the strategy (fit_cluster_test.cc creates both).
  auto tower = std::make_shared<capstan::torch::testing::Tower>(true);
  capstan::torch::ModelSpec hybrid{
      .module = tower,
      .forward = [tower](const std::vector<::torch::Tensor>& batch) { return tower->forward(batch[0]); },
      .loss = [](const ::torch::Tensor& logits, const ::torch::Tensor& y) {
        return ::torch::binary_cross_entropy_with_logits(logits, y);
      },
      .ps = {.prefix = "hyb/", .optimizer = capstan::Optimizer::sgd(0.5)}};
  return capstan::torch::register_model(registry, "fit_hybrid", std::move(hybrid));
}

}  // namespace

CAPSTAN_MODULE(registry) {
  if (capstan::Status status = register_fit_models(registry); !status.ok()) {
    // A module cannot fail its loading: the tests then find no fit closures.
    std::fprintf(stderr, "torch_test_module: %s\n", status.to_string().c_str());
  }
  registry.register_closure("mlp_step", mlp_step);
  registry.register_closure("grow_step", grow_step);
  registry.register_closure("tower_step", [](ClosureContext& ctx, const Element& args) {
    return tower_step(ctx, args, false);
  });
  registry.register_closure("table_step", [](ClosureContext& ctx, const Element& args) {
    return tower_step(ctx, args, true);
  });
}
