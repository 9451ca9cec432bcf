// PsModule against an in-memory closure context whose variables take plain
// SGD updates (what a parameter server does with Optimizer::sgd): a step
// through it must equal a step of plain LibTorch with torch::optim::SGD.
#include "capstan/torch.h"
// LibTorch includes glog, whose CHECK would stand for Catch's.
#undef CHECK
#include <catch2/catch.hpp>

#include <map>

#include "torch/tests/torch_test_models.h"

namespace capstan::torch {
namespace {

constexpr double kLearningRate = 0.1;

class SgdContext : public ClosureContext {
 public:
  std::map<std::string, ::torch::Tensor> variables;
  int pushes = 0;
  // The ids of each variable's last sparse push.
  std::map<std::string, ::torch::Tensor> sparse_ids;

  int worker_index() const override { return 0; }
  int num_workers() const override { return 1; }
  int attempt() const override { return 1; }

  Result<Tensor> read(const std::string& name) override {
    auto it = variables.find(name);
    if (it == variables.end()) return Status::NotFound("no variable '" + name + "'");
    return from_torch(it->second.clone());
  }
  Result<Tensor> gather(const std::string& name, const Tensor& ids) override {
    auto it = variables.find(name);
    if (it == variables.end()) return Status::NotFound("no variable '" + name + "'");
    return from_torch(it->second.index_select(0, to_torch(ids).value()).contiguous());
  }
  Status assign(const std::string&, const Tensor&) override { return Status::Unimplemented("assign"); }
  Status assign_add(const std::string&, const Tensor&) override { return Status::Unimplemented("assign_add"); }
  // SGD at kLearningRate, or at the update's override.
  Status apply_gradients(const std::string& name, const Tensor& gradient, const ApplyOptions& options = {}) override {
    ++pushes;
    ::torch::Tensor& value = variables.at(name);
    value.sub_(to_torch(gradient).value() * options.learning_rate.value_or(kLearningRate));
    return Status::Ok();
  }
  Status apply_sparse_gradients(const std::string& name, const Tensor& ids, const Tensor& rows,
                                const ApplyOptions& options = {}) override {
    ++pushes;
    sparse_ids[name] = to_torch(ids).value().clone();
    ::torch::Tensor& value = variables.at(name);
    value.index_add_(0, to_torch(ids).value(), to_torch(rows).value() * -options.learning_rate.value_or(kLearningRate));
    return Status::Ok();
  }
  Result<data::Iterator*> iterator(const Tensor&) override { return Status::Unimplemented("iterator"); }

  // The variables create_variables would make for `module`.
  void create_from(::torch::nn::Module& module) {
    for (const auto& item : module.named_parameters()) variables[item.key()] = item.value().detach().clone();
    for (const auto& item : module.named_modules("", false)) {
      if (auto embedding = std::dynamic_pointer_cast<EmbeddingImpl>(item.value())) {
        variables[item.key() + ".weight"] = to_torch(embedding->initial_value().value()).value().clone();
      }
    }
  }
};

using testing::Mlp;
using testing::Tower;

TEST_CASE("A module's steps through PsModule equal plain LibTorch SGD, step by step") {
  ::torch::manual_seed(1);
  auto remote = std::make_shared<Mlp>();
  auto local = std::make_shared<Mlp>();
  {
    ::torch::NoGradGuard no_grad;
    for (auto& item : local->named_parameters()) item.value().copy_(remote->named_parameters()[item.key()]);
  }
  SgdContext ctx;
  ctx.create_from(*remote);
  PsModule ps(*remote);
  ::torch::optim::SGD sgd(local->parameters(), ::torch::optim::SGDOptions(kLearningRate));

  for (int step = 0; step < 5; ++step) {
    ::torch::Tensor x = ::torch::randn({16, 4});
    ::torch::Tensor y = x.sum(1, true);
    auto loss = ps.train_step(ctx, [&] { return ::torch::mse_loss(remote->forward(x), y); });
    REQUIRE(loss.ok());

    sgd.zero_grad();
    ::torch::Tensor expected = ::torch::mse_loss(local->forward(x), y);
    expected.backward();
    sgd.step();
    CHECK(loss->item<float>() == Approx(expected.item<float>()).epsilon(1e-5));
    for (const auto& item : local->named_parameters()) {
      INFO("step " << step << ", " << item.key());
      CHECK(::torch::allclose(ctx.variables.at(item.key()), item.value(), 1e-5, 1e-6));
    }
  }
  CHECK(ctx.pushes == 5 * 4);  // every step pushed each of the four parameters once
}

TEST_CASE("A step's learning rate goes with every push, dense and sparse: rate 0 changes nothing") {
  auto remote = std::make_shared<Tower>(true);
  SgdContext ctx;
  ctx.create_from(*remote);
  std::map<std::string, ::torch::Tensor> before;
  for (const auto& [name, value] : ctx.variables) before[name] = value.clone();
  ::torch::Tensor ids = ::torch::tensor({3, 7}, ::torch::kLong).reshape({1, 2});
  ::torch::Tensor target = ::torch::tensor({1.0f}).reshape({1, 1});
  PsModule ps(*remote);
  REQUIRE(ps.train_step(ctx, [&] { return ::torch::mse_loss(remote->forward(ids), target); },
                        {.learning_rate = 0.0})
              .ok());
  CHECK(ctx.pushes == 3);  // the head's two parameters, the embedding's rows
  for (const auto& [name, value] : ctx.variables) {
    INFO(name);
    CHECK(::torch::equal(value, before.at(name)));
  }
}

TEST_CASE("An Embedding's sparse gradient equals torch::nn::Embedding's dense one on the rows it touched") {
  auto remote = std::make_shared<Tower>(true);
  auto local = std::make_shared<Tower>(false);
  SgdContext ctx;
  ctx.create_from(*remote);
  {
    ::torch::NoGradGuard no_grad;
    local->dense_embedding->weight.copy_(ctx.variables.at("embedding.weight"));
    local->head->weight.copy_(remote->head->weight);
    local->head->bias.copy_(remote->head->bias);
  }
  const ::torch::Tensor before = ctx.variables.at("embedding.weight").clone();
  // Id 3 appears three times, across rows: its gradient is the sum.
  ::torch::Tensor ids = ::torch::tensor({3, 7, 3, 11, 3, 0}, ::torch::kLong).reshape({2, 3});
  ::torch::Tensor target = ::torch::tensor({1.0f, -1.0f}).reshape({2, 1});

  PsModule ps(*remote);
  REQUIRE(ps.train_step(ctx, [&] { return ::torch::mse_loss(remote->forward(ids), target); }).ok());
  ::torch::optim::SGD sgd(local->parameters(), ::torch::optim::SGDOptions(kLearningRate));
  ::torch::mse_loss(local->forward(ids), target).backward();
  sgd.step();

  const ::torch::Tensor& after = ctx.variables.at("embedding.weight");
  CHECK(::torch::allclose(after, local->dense_embedding->weight, 1e-5, 1e-6));
  for (int64_t row : {0, 3, 7, 11}) CHECK_FALSE(::torch::equal(after[row], before[row]));
  for (int64_t row : {1, 2, 19}) CHECK(::torch::equal(after[row], before[row]));
  // One sparse push of the 4 distinct rows, and the head's two parameters.
  CHECK(ctx.pushes == 3);
}

TEST_CASE("An Embedding outside a step says where its rows are") {
  Embedding embedding(EmbeddingOptions{.num_embeddings = 4, .dim = 2});
  try {
    embedding(::torch::tensor({1}, ::torch::kLong));
    FAIL("no error");
  } catch (const c10::Error& e) {
    CHECK_THAT(e.what_without_backtrace(), Catch::Contains("parameter servers") && Catch::Contains("train_step"));
  }
}

TEST_CASE("pull refuses a module whose parameter no longer matches its variable, naming it") {
  auto model = std::make_shared<Mlp>();
  SgdContext ctx;
  ctx.create_from(*model);
  ctx.variables["second.weight"] = ::torch::zeros({1, 9});
  PsModule ps(*model);
  Status status = ps.pull(ctx);
  CHECK(status.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(status.message(), Catch::Contains("second.weight") && Catch::Contains("[1, 9]") &&
                                   Catch::Contains("[1, 8]"));
}

TEST_CASE("train_step: a failing or non-scalar loss is an error and pushes nothing") {
  auto model = std::make_shared<Mlp>();
  SgdContext ctx;
  ctx.create_from(*model);
  PsModule ps(*model);
  ::torch::Tensor x = ::torch::randn({2, 4});

  Status vector_loss = ps.train_step(ctx, [&] { return model->forward(x); }).status();
  CHECK(vector_loss.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(vector_loss.message(), Catch::Contains("[2, 1]") && Catch::Contains(".mean()"));

  Status thrown = ps.train_step(ctx, [&] { return model->forward(::torch::randn({2, 5})).mean(); }).status();
  CHECK(thrown.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(thrown.message(), Catch::Contains("train_step"));
  CHECK(ctx.pushes == 0);
  // And the module is usable again afterwards.
  CHECK(ps.train_step(ctx, [&] { return model->forward(x).pow(2).mean(); }).ok());
  CHECK(ctx.pushes == 4);
}

TEST_CASE("eval_step reads the variables and pushes nothing") {
  auto model = std::make_shared<Mlp>();
  SgdContext ctx;
  ctx.create_from(*model);
  {
    ::torch::NoGradGuard no_grad;
    for (auto& item : ctx.variables) item.second.fill_(0.5);
  }
  PsModule ps(*model);
  ::torch::Tensor x = ::torch::ones({1, 4});
  ::torch::Tensor out = ps.eval_step(ctx, [&] { return model->forward(x); }).value();
  // relu(4 * 0.5 + 0.5) = 2.5 in each of 8 units; 8 * 2.5 * 0.5 + 0.5 = 10.5.
  CHECK(out.item<float>() == Approx(10.5));
  CHECK(ctx.pushes == 0);
}

TEST_CASE("embeddings_only: PsModule reads and pushes only the embeddings' rows, the head is someone else's") {
  auto model = std::make_shared<Tower>(true);
  SgdContext ctx;
  ctx.create_from(*model);
  // The head is not on the parameter servers (a MirroredModule's, in hybrid).
  ctx.variables.erase("head.weight");
  ctx.variables.erase("head.bias");
  const ::torch::Tensor head = model->head->weight.detach().clone();
  const ::torch::Tensor before = ctx.variables.at("embedding.weight").clone();
  ::torch::Tensor ids = ::torch::tensor({3, 7, 3, 11, 3, 0}, ::torch::kLong).reshape({2, 3});
  ::torch::Tensor target = ::torch::tensor({1.0f, -1.0f}).reshape({2, 1});

  PsModule ps(*model, {.embeddings_only = true});
  REQUIRE(ps.train_step(ctx, [&] { return ::torch::mse_loss(model->forward(ids), target); }).ok());
  CHECK(ctx.pushes == 1);  // the rows' sparse update alone
  CHECK_FALSE(::torch::equal(ctx.variables.at("embedding.weight")[3], before[3]));
  CHECK(::torch::equal(ctx.variables.at("embedding.weight")[1], before[1]));
  CHECK(::torch::equal(model->head->weight.detach(), head));  // not read, not pushed
  CHECK(model->head->weight.grad().defined() == false);         // cleared as a step ends
}

TEST_CASE("ps_parameters lists dense parameters, then embeddings, with their shapes") {
  auto model = std::make_shared<Tower>(true);
  auto parameters = ps_parameters(*model).value();
  REQUIRE(parameters.size() == 3);
  CHECK(parameters[0].name == "head.weight");
  CHECK(parameters[0].shape == Shape{1, 3});
  CHECK(parameters[1].name == "head.bias");
  CHECK(parameters[2].name == "embedding.weight");
  CHECK(parameters[2].shape == Shape{20, 3});
  CHECK(parameters[2].embedding);
}


// LibTorch's own embedding with sparse=true: PsModule reads its weight whole,
// and its gradient is a sparse COO tensor.
struct SparseTower : ::torch::nn::Module {
  explicit SparseTower(bool sparse) {
    embedding =
        register_module("embedding", ::torch::nn::Embedding(::torch::nn::EmbeddingOptions(20, 3).sparse(sparse)));
    head = register_module("head", ::torch::nn::Linear(3, 1));
  }
  ::torch::Tensor forward(const ::torch::Tensor& ids) { return head(embedding(ids).sum(1)); }
  ::torch::nn::Embedding embedding{nullptr};
  ::torch::nn::Linear head{nullptr};
};

TEST_CASE("torch::nn::Embedding with sparse gradients pushes only its touched rows, updated as the dense one is") {
  ::torch::manual_seed(2);
  auto remote = std::make_shared<SparseTower>(true);
  auto local = std::make_shared<SparseTower>(false);
  {
    ::torch::NoGradGuard no_grad;
    for (auto& item : local->named_parameters()) item.value().copy_(remote->named_parameters()[item.key()]);
  }
  SgdContext ctx;
  ctx.create_from(*remote);
  const ::torch::Tensor before = ctx.variables.at("embedding.weight").clone();
  // Id 3 three times, across examples: its rows' gradients are summed.
  ::torch::Tensor ids = ::torch::tensor({3, 7, 3, 11, 3, 0}, ::torch::kLong).reshape({2, 3});
  ::torch::Tensor target = ::torch::tensor({1.0f, -1.0f}).reshape({2, 1});

  PsModule ps(*remote);
  auto loss = ps.train_step(ctx, [&] { return ::torch::mse_loss(remote->forward(ids), target); });
  REQUIRE(loss.ok());
  ::torch::optim::SGD sgd(local->parameters(), ::torch::optim::SGDOptions(kLearningRate));
  ::torch::Tensor expected = ::torch::mse_loss(local->forward(ids), target);
  expected.backward();
  sgd.step();

  CHECK(loss->item<float>() == Approx(expected.item<float>()).epsilon(1e-6));
  const ::torch::Tensor& after = ctx.variables.at("embedding.weight");
  CHECK(::torch::allclose(after, local->embedding->weight, 1e-5, 1e-6));
  for (int64_t row : {0, 3, 7, 11}) CHECK_FALSE(::torch::equal(after[row], before[row]));
  for (int64_t row : {1, 2, 19}) CHECK(::torch::equal(after[row], before[row]));
  // The embedding was pushed as its 4 distinct rows, once each, and the
  // head's two parameters densely.
  REQUIRE(ctx.sparse_ids.count("embedding.weight") == 1);
  CHECK(::torch::equal(ctx.sparse_ids.at("embedding.weight"), ::torch::tensor({0, 3, 7, 11}, ::torch::kLong)));
  CHECK(ctx.pushes == 3);
  for (const auto& item : local->named_parameters()) {
    INFO(item.key());
    CHECK(::torch::allclose(ctx.variables.at(item.key()), item.value(), 1e-5, 1e-6));
  }
}

TEST_CASE("push: a gradient the parameter servers cannot take is an error naming its parameter, and nothing is pushed") {
  auto model = std::make_shared<Mlp>();
  SgdContext ctx;
  ctx.create_from(*model);
  PsModule ps(*model);
  ::torch::Tensor x = ::torch::randn({2, 4});

  SECTION("sparse in two dimensions") {
    REQUIRE(ps.pull(ctx).ok());
    model->second->bias.mutable_grad() = ::torch::ones({1});
    model->first->weight.mutable_grad() = ::torch::ones({8, 4}).to_sparse();
    Status status = ps.push(ctx);
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Contains("'first.weight'") && Catch::Contains("2 dimensions"));
  }
  SECTION("a layout torch cannot make contiguous (sparse CSR), a torch error") {
    REQUIRE(ps.pull(ctx).ok());
    model->second->bias.mutable_grad() = ::torch::ones({1});
    model->first->weight.mutable_grad() = ::torch::ones({8, 4}).to_sparse_csr();
    Status status = ps.push(ctx);
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Contains("'first.weight'"));
  }
  CHECK(ctx.pushes == 0);
  CHECK_FALSE(model->first->weight.grad().defined());  // cleared: the next step starts afresh
  CHECK(ps.train_step(ctx, [&] { return model->forward(x).pow(2).mean(); }).ok());
  CHECK(ctx.pushes == 4);
}

}  // namespace
}  // namespace capstan::torch
