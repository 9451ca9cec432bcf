// Linear regression on a parameter-server cluster: the example of
// TensorFlow's ParameterServerStrategy documentation, in C++.
//
//   scripts/local-cluster.sh up --module build/lib/liblinear_regression_module.so
//   . .run/cluster/cluster.env
//   build/bin/linear_regression --coordinator $COORDINATOR
//
// One dense layer (kernel [2, 1], bias [1]) learns y = x kernel + bias from
// three examples with Adagrad(0.05) on the parameter servers. Each epoch
// schedules 10 `train_step` closures (module.cc) onto the workers, joins, and
// prints the loss of the epoch's last step, as TF's example does:
//
//   with strategy.scope():
//     model = tf.keras.models.Sequential([tf.keras.layers.Dense(1)])
//     optimizer = tf.keras.optimizers.Adagrad(learning_rate=0.05)
//   per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
//   for epoch in range(5):
//     for _ in range(10):
//       loss = coordinator.schedule(worker_fn, args=(per_worker_iterator,))
//     coordinator.join()
//     print("epoch", epoch, "loss", loss.fetch())
//
// Options: --coordinator ADDR (default 127.0.0.1:7000), --epochs N (5),
// --steps-per-epoch N (10), --min-workers N (1: wait for that many workers),
// --seed N (the kernel's initializer seed), --logdir DIR (TensorBoard event
// files: train/loss after each epoch, then final/loss, final/kernel_0,
// final/kernel_1 and final/bias, by step; `tensorboard --logdir DIR`).
// CAPSTAN_TOKEN / CAPSTAN_TOKEN_FILE give the cluster token.
#include <capstan/data/dataset.h>
#include <capstan/summary.h>
#include <capstan/training.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "common/example_util.h"

namespace {

using capstan::DType;
using capstan::Element;
using capstan::Status;
using capstan::Tensor;

struct Flags {
  std::string coordinator = "127.0.0.1:7000";
  int epochs = 5;
  int steps_per_epoch = 10;
  int min_workers = 1;
  uint64_t seed = 2;
  std::string logdir;  // empty: no TensorBoard events
};

Flags parse_flags(int argc, char** argv) {
  Flags flags;
  capstan::examples::FlagParser args(
      argc, argv,
      "[--coordinator HOST:PORT] [--epochs N] [--steps-per-epoch N] [--min-workers N] [--seed N] [--logdir DIR]");
  while (args.next()) {
    if (args.flag("--coordinator", &flags.coordinator) || args.flag("--epochs", &flags.epochs) ||
        args.flag("--steps-per-epoch", &flags.steps_per_epoch) || args.flag("--min-workers", &flags.min_workers) ||
        args.flag("--seed", &flags.seed) || args.flag("--logdir", &flags.logdir)) {
      continue;
    }
    args.unknown();
  }
  if (flags.steps_per_epoch < 1) args.usage("--steps-per-epoch must be at least 1");
  return flags;
}

int fail(const std::string& what, const Status& status) {
  std::cerr << "linear_regression: " << what << ": " << status.to_string() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags = parse_flags(argc, argv);

  capstan::ClientOptions options;
  options.client_name = "linear_regression";
  auto connected = capstan::examples::connect_cluster(flags.coordinator, flags.min_workers, options, fail);
  if (connected == nullptr) return 1;
  capstan::ClusterCoordinator& cluster = *connected;

  // The data: y = 0.2 x0 + 0.1 (both features carry it; x1 = x0 + 0.5).
  Tensor features = *Tensor::from_vector<float>({1, 1.5, 2, 2.5, 3, 3.5}, {3, 2});
  Tensor labels = *Tensor::from_vector<float>({0.3f, 0.5f, 0.7f}, {3, 1});

  Tensor kernel = *capstan::random_normal_initializer(DType::kFloat32, {2, 1}, 0.0, 1.0, flags.seed);
  Tensor bias = *capstan::zeros_initializer(DType::kFloat32, {1});
  for (const capstan::VariableSpec& spec : {capstan::VariableSpec{"kernel", kernel, capstan::Optimizer::adagrad(0.05)},
                                            capstan::VariableSpec{"bias", bias, capstan::Optimizer::adagrad(0.05)}}) {
    auto created = cluster.create_variable(spec);
    if (!created.ok()) return fail("creating variable '" + spec.name + "'", created.status());
    // The variables outlive this program (they live on the parameter
    // servers): a second run against the same cluster finds the trained
    // ones. Start from the initial weights again; the optimizer's
    // accumulators stay, so only a fresh cluster repeats the first run.
    Status assigned = cluster.assign_variable(spec.name, spec.initial);
    if (!assigned.ok()) return fail("initializing variable '" + spec.name + "'", assigned);
  }

  // dataset_fn: every worker iterates over the three examples forever, in
  // batches of three.
  auto dataset = capstan::data::Dataset::from_tensor_slices(Element{{features, labels}, {}}).repeat().batch(3);
  auto per_worker = cluster.create_per_worker_dataset(dataset);
  if (!per_worker.ok()) return fail("creating the per-worker dataset", per_worker.status());

  auto summaries = capstan::examples::open_summaries(flags.logdir, "linear_regression");
  if (!summaries.ok()) return fail("writing TensorBoard events", summaries.status());
  std::cout << "training: " << flags.epochs << " epochs x " << flags.steps_per_epoch << " steps on "
            << cluster.num_workers() << " worker(s)\n";
  for (int epoch = 1; epoch <= flags.epochs; ++epoch) {
    capstan::RemoteValue last;
    for (int step = 0; step < flags.steps_per_epoch; ++step) {
      auto scheduled = cluster.schedule("train_step", Element{{per_worker->arg()}, {}});
      if (!scheduled.ok()) return fail("scheduling train_step", scheduled.status());
      last = *scheduled;
    }
    Status joined = cluster.join();
    if (!joined.ok()) return fail("epoch " + std::to_string(epoch), joined);
    auto loss = cluster.fetch(last);
    if (!loss.ok()) return fail("fetching the loss of epoch " + std::to_string(epoch), loss.status());
    const float epoch_loss = loss->components.at(0).flat<float>()[0];
    std::printf("epoch %d: loss %.6f\n", epoch, epoch_loss);
    std::fflush(stdout);
    Status written = capstan::examples::write_scalars(summaries->get(), int64_t{epoch} * flags.steps_per_epoch,
                                                      {{"train/loss", epoch_loss}});
    if (!written.ok()) return fail("writing TensorBoard events", written);
  }

  auto scheduled_loss = cluster.schedule("loss", Element{{features, labels}, {}});
  if (!scheduled_loss.ok()) return fail("scheduling loss", scheduled_loss.status());
  auto final_loss = cluster.fetch(*scheduled_loss);
  if (!final_loss.ok()) return fail("computing the final loss", final_loss.status());
  auto trained_kernel = cluster.read_variable("kernel");
  auto trained_bias = cluster.read_variable("bias");
  if (!trained_kernel.ok()) return fail("reading the kernel", trained_kernel.status());
  if (!trained_bias.ok()) return fail("reading the bias", trained_bias.status());
  std::printf("final loss on the 3 examples: %.6f; kernel [%.4f, %.4f], bias %.4f\n",
              final_loss->components.at(0).flat<float>()[0], trained_kernel->flat<float>()[0],
              trained_kernel->flat<float>()[1], trained_bias->flat<float>()[0]);
  Status written = capstan::examples::write_scalars(summaries->get(), int64_t{flags.epochs} * flags.steps_per_epoch,
                                                    {{"final/loss", final_loss->components.at(0).flat<float>()[0]},
                                                     {"final/kernel_0", trained_kernel->flat<float>()[0]},
                                                     {"final/kernel_1", trained_kernel->flat<float>()[1]},
                                                     {"final/bias", trained_bias->flat<float>()[0]}});
  if (written.ok() && *summaries != nullptr) written = (*summaries)->close();
  if (!written.ok()) return fail("writing TensorBoard events", written);
  return 0;
}
