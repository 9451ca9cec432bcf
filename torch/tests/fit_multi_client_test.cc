// fit under MultiWorkerMirroredFitStrategy (multi-client): two ranks, each a
// thread with its own Communicator over loopback and its own connection to
// a real coordinator and parameter server (where rank 0 writes the
// checkpoints), each running the same fit on its own shard of the input.
// Unlike fit_cluster_test.cc this file includes LibTorch: a multi-client
// program holds the module itself.
#include "capstan/torch.h"
#include "torch/tests/torch_test_models.h"
// LibTorch includes glog, whose CHECK would stand for Catch's.
#undef CHECK
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan/fit.h"
#include "lib/collectives/test_group.h"
#include "tests/integration/training_cluster.h"
#include "torch/tests/fit_test_util.h"
#include "tests/build_path.h"

namespace capstan::torch {
namespace {

using capstan::testing::Group;
using capstan::testing::make_group;
using capstan::testing::on_all;
using capstan::testing::Training;
using testing::examples;
using testing::temp_dir;

// The classifier every rank builds (its own module; rank 0's initial
// values become every replica's).
ModelSpec mlp_spec() {
  auto model = std::make_shared<testing::Mlp>();
  return ModelSpec{.module = model,
                   .forward = [model](const std::vector<::torch::Tensor>& batch) { return model->forward(batch[0]); },
                   .loss = [](const ::torch::Tensor& logits, const ::torch::Tensor& y) {
                     return ::torch::binary_cross_entropy_with_logits(logits, y);
                   },
                   .ps = {.prefix = "mc/", .optimizer = Optimizer::sgd(0.5)}};
}

// What one rank saw (Catch's assertions are checked on the main thread).
struct RankOutcome {
  Status status;
  History history;
  std::optional<int> stopped_epoch;
  std::vector<std::string> saved;
  double trained_loss = 0, zeroed_accuracy = 0, restored_loss = 0;
  int64_t restored_step = 0;
  Status replicas;
  std::string printed;  // ProgressLogger's lines
};

TEST_CASE("MultiWorkerMirroredFitStrategy: two ranks' fits see the same History, and rank 0's checkpoint "
          "restores on both") {
  Training t(/*num_ps=*/1, /*num_workers=*/0, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
  CollectiveOptions collective;
  collective.timeout = std::chrono::seconds(60);
  Group group = make_group(2, collective);
  const std::string directory = temp_dir("multi-client");

  std::vector<RankOutcome> outcomes = on_all<RankOutcome>(2, [&](int rank) {
    RankOutcome out;
    out.status = [&]() -> Status {
      // Each process connects on its own (only rank 0's connection writes).
      CAPSTAN_ASSIGN_OR_RETURN(std::unique_ptr<ClusterCoordinator> cluster,
                               ClusterCoordinator::connect(t.coordinator->address()));
      const ModelSpec spec = mlp_spec();
      CAPSTAN_ASSIGN_OR_RETURN(auto strategy, MultiWorkerMirroredFitStrategy::create(
                                                  *group[static_cast<size_t>(rank)], "mc_mlp", spec,
                                                  {.cluster = cluster.get()}));
      // Each rank every other batch of the same shuffled pipeline.
      const data::Dataset shuffled = examples(4096, 1).shuffle(1024, 2).repeat().batch(32, true);
      CAPSTAN_ASSIGN_OR_RETURN(PerWorkerDataset train, strategy->distribute_dataset(shuffled));
      CAPSTAN_ASSIGN_OR_RETURN(PerWorkerDataset validation,
                               strategy->distribute_dataset(examples(1024, 3).repeat().batch(64, true)));
      ModelCheckpoint checkpoints({.directory = directory, .max_to_keep = 2});
      EarlyStopping stop({.monitor = "val_loss", .min_delta = 1e-3, .patience = 1});
      std::ostringstream lines;
      ProgressLogger progress(&lines);
      CAPSTAN_ASSIGN_OR_RETURN(out.history, fit(*strategy, "mc_mlp",
                                                {.epochs = 6,
                                                 .steps_per_epoch = 25,
                                                 .train = train,
                                                 .validation = validation,
                                                 .validation_steps = 4,
                                                 .learning_rate = 0.5,
                                                 .callbacks = {&checkpoints, &stop, &progress}}));
      out.printed = lines.str();
      out.stopped_epoch = stop.stopped_epoch();
      out.saved = checkpoints.saved();
      out.replicas = strategy->verify_replicas();

      // The same held-out batches, evaluated three times: trained, with
      // every parameter zeroed (on every rank alike: the replicas), and
      // after restoring the newest checkpoint (the last epoch's).
      auto held_out = [&]() { return strategy->create_per_worker_dataset(examples(512, 9).batch(64)); };
      CAPSTAN_ASSIGN_OR_RETURN(PerWorkerDataset first, held_out());
      CAPSTAN_ASSIGN_OR_RETURN(MetricState trained, strategy->evaluate("mc_mlp", first, 4));
      out.trained_loss = trained.logs().at("loss");
      {
        ::torch::NoGradGuard no_grad;
        for (auto& p : spec.module->parameters()) p.zero_();
      }
      CAPSTAN_ASSIGN_OR_RETURN(PerWorkerDataset second, held_out());
      CAPSTAN_ASSIGN_OR_RETURN(MetricState zeroed, strategy->evaluate("mc_mlp", second, 4));
      out.zeroed_accuracy = zeroed.logs().at("accuracy");
      CAPSTAN_ASSIGN_OR_RETURN(out.restored_step, strategy->restore_checkpoint(directory));
      CAPSTAN_ASSIGN_OR_RETURN(PerWorkerDataset third, held_out());
      CAPSTAN_ASSIGN_OR_RETURN(MetricState restored, strategy->evaluate("mc_mlp", third, 4));
      out.restored_loss = restored.logs().at("loss");
      return Status::Ok();
    }();
    return out;
  });

  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    REQUIRE(outcomes[static_cast<size_t>(rank)].status.ok());
  }
  const RankOutcome& chief = outcomes[0];
  const auto& h = chief.history.history;
  INFO("val_loss " << h.at("val_loss").front() << " -> " << h.at("val_loss").back() << ", val_accuracy "
                   << h.at("val_accuracy").back());
  CHECK(h.at("loss").back() < h.at("loss").front());
  CHECK(h.at("val_accuracy").back() > 0.9);
  // Each epoch's line says where this rank's steps' time went: its batches
  // (input), the gradients' all-reduce, the rest.
  INFO(chief.printed);
  CHECK_THAT(chief.printed, Catch::Contains(" - time: input ") && Catch::Contains("compute ") &&
                                Catch::Contains("all-reduce "));
  // The same logs on both ranks, to the bit: the same epochs, the same
  // early stop, the same checkpoints (rank 0's paths).
  CHECK(outcomes[1].history.epoch == chief.history.epoch);
  CHECK(outcomes[1].history.history == chief.history.history);
  CHECK(outcomes[1].stopped_epoch == chief.stopped_epoch);
  CHECK(outcomes[1].saved == chief.saved);
  CHECK(chief.saved.size() == chief.history.epoch.size());
  for (const RankOutcome& o : outcomes) {
    CHECK(o.replicas.ok());
    // Zeroed, the model says 0.5 for everything (about the negatives'
    // share right); restored, it is the trained model again, on both ranks.
    CHECK(o.zeroed_accuracy < 0.7);
    CHECK(o.restored_step == static_cast<int64_t>(chief.history.epoch.back()) + 1);
    CHECK(o.restored_loss == Approx(chief.trained_loss).epsilon(1e-6));
    CHECK(o.trained_loss == chief.trained_loss);
  }
  std::filesystem::remove_all(directory);
}

// The error paths need no daemons: thread ranks alone.

TEST_CASE("MultiWorkerMirroredFitStrategy refuses a module with capstan::torch::Embeddings, naming the fix") {
  Group group = make_group(1);
  auto tower = std::make_shared<testing::Tower>(true);
  ModelSpec spec{.module = tower,
                 .forward = [tower](const std::vector<::torch::Tensor>& batch) { return tower->forward(batch[0]); },
                 .loss = [](const ::torch::Tensor& logits, const ::torch::Tensor& y) {
                   return ::torch::binary_cross_entropy_with_logits(logits, y);
                 }};
  Status status = MultiWorkerMirroredFitStrategy::create(*group[0], "tower", spec).status();
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(status.message(), Catch::Contains("Embedding") && Catch::Contains("MirroredFitStrategy"));
}

TEST_CASE("MultiWorkerMirroredFitStrategy without a cluster refuses checkpoints, on every rank") {
  Group group = make_group(1);
  auto strategy = MultiWorkerMirroredFitStrategy::create(*group[0], "mc_mlp", mlp_spec()).value();
  PerWorkerDataset train = strategy->distribute_dataset(examples(256, 1).repeat().batch(32, true)).value();
  ModelCheckpoint checkpoints({.directory = temp_dir("no-cluster")});
  Status status =
      fit(*strategy, "mc_mlp", {.epochs = 1, .steps_per_epoch = 2, .train = train, .callbacks = {&checkpoints}})
          .status();
  CHECK(status.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(status.message(), Catch::Contains("MultiWorkerMirroredFitOptions::cluster"));
  // fit names the model the strategy trains, or is refused.
  CHECK(fit(*strategy, "other", {.epochs = 1, .steps_per_epoch = 1, .train = train}).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("A rank whose dataset ends fails fit on every rank at once, not at the collective timeout") {
  CollectiveOptions collective;
  collective.timeout = std::chrono::seconds(120);
  Group group = make_group(2, collective);
  const auto start = std::chrono::steady_clock::now();
  std::vector<Status> statuses = on_all<Status>(2, [&](int rank) -> Status {
    CAPSTAN_ASSIGN_OR_RETURN(auto strategy, MultiWorkerMirroredFitStrategy::create(
                                                *group[static_cast<size_t>(rank)], "mc_mlp", mlp_spec()));
    // Rank 1's input holds 2 batches, not repeated; an epoch is 5 steps.
    data::Dataset input = rank == 0 ? examples(256, 1).repeat().batch(32, true) : examples(64, 2).batch(32, true);
    CAPSTAN_ASSIGN_OR_RETURN(PerWorkerDataset train, strategy->create_per_worker_dataset(input));
    return fit(*strategy, "mc_mlp", {.epochs = 1, .steps_per_epoch = 5, .train = train}).status();
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(statuses[1].code() == StatusCode::kOutOfRange);
  CHECK_THAT(statuses[1].message(), Catch::Contains("rank 1") && Catch::Contains("repeat"));
  CHECK_FALSE(statuses[0].ok());  // its step's collective was aborted by rank 1
  CHECK(seconds < 60);
}

}  // namespace
}  // namespace capstan::torch
