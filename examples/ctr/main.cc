// Click-through-rate prediction on a parameter-server cluster: logistic
// regression over hashed categorical features, with the weight table
// partitioned across two parameter servers, sparse updates, and asynchronous
// training by every worker.
//
//   scripts/local-cluster.sh up --module build/lib/libctr_module.so
//   . .run/cluster/cluster.env
//   build/bin/ctr --coordinator $COORDINATOR
//
// The data come from a planted logistic model (planted_model.h) and are
// generated on the workers by a per-worker input pipeline:
//
//   Dataset::range(0, kHeldOutBegin).shard(SHARD_HINT, SHARD_HINT)
//       .map(make_example).batch(256, drop_remainder).prefetch(AUTOTUNE)
//
// After training, `eval` closures score held-out examples with the trained
// model and with the planted one. The planted model is the best any model
// can do, so the gap between the two log-losses says how close training got;
// the program exits 1 when it is above --max-gap percent (default 2).
//
// Options:
//   --coordinator HOST:PORT  the coordinator (default 127.0.0.1:7000)
//   --steps N                training steps of 256 examples (default 20000)
//   --eval-steps N           held-out batches of 256 examples (default 200)
//   --learning-rate X        Adagrad's learning rate (default 0.2)
//   --min-workers N          wait until that many workers have registered (default 1)
//   --log-every N            without a terminal, print progress every N steps (default 1000)
//   --max-gap PERCENT        exit 1 above this gap (default 2)
//   --checkpoint-dir DIR     after evaluating, save a checkpoint there (CheckpointManager)
//   --logdir DIR             write TensorBoard event files there (`tensorboard
//                            --logdir DIR`): train/loss and train/steps_per_second
//                            with each progress line, then test/log_loss,
//                            test/planted_log_loss and test/gap_percent (the
//                            held-out figures) at the last step
//   --dynamic                keep the weights in a dynamic embedding table
//                            ("ctr_table", create_embedding_table) keyed by raw
//                            ids from a 2^40 space (ctr::raw_id) instead of the
//                            fixed [40001, 1] variable: rows are inserted as ids
//                            first appear; the same planted-model target
//   --min-count N            with --dynamic: an id enters the table at its N-th
//                            lookup (admission; default 1)
//   --dispatcher HOST:PORT   feed the workers through the tf.data service: the
//                            pipeline is registered with this dispatcher, its data
//                            workers (HINT sharding) generate and batch the
//                            examples, and each worker's per-worker dataset reads
//                            the shared job "ctr-train" from the service
// CAPSTAN_TOKEN / CAPSTAN_TOKEN_FILE give the cluster token.
#include <capstan/data/dataset.h>
#include <capstan/data/service.h>
#include <capstan/summary.h>
#include <capstan/training.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <string>

#include "common/example_util.h"
#include "planted_model.h"

namespace {

using capstan::DType;
using capstan::Element;
using capstan::Status;
using capstan::Tensor;
namespace data = capstan::data;
using Clock = std::chrono::steady_clock;

constexpr const char* kWeights = "ctr_weights";
// Closures scheduled ahead of the one being fetched: enough to keep every
// worker busy, few enough that the queue stays short.
constexpr size_t kInFlight = 64;

struct Flags {
  std::string coordinator = "127.0.0.1:7000";
  int64_t steps = 20000;
  int64_t eval_steps = 200;
  double learning_rate = 0.2;
  int min_workers = 1;
  int64_t log_every = 1000;
  double max_gap_percent = 2.0;
  std::string checkpoint_dir;  // empty: no checkpoint
  std::string logdir;          // empty: no TensorBoard events
  std::string dispatcher;      // empty: workers generate their input themselves
  bool dynamic = false;        // the weights in a dynamic embedding table
  int64_t min_count = 1;
  bool count_updates = false;  // "ctr_updates": one counter element per parameter server
};

Flags parse_flags(int argc, char** argv) {
  Flags flags;
  capstan::examples::FlagParser args(argc, argv,
                                     "[--coordinator HOST:PORT] [--steps N] [--eval-steps N] [--learning-rate X]"
                                     " [--min-workers N] [--log-every N] [--max-gap PERCENT] [--checkpoint-dir DIR]"
                                     " [--dispatcher HOST:PORT] [--logdir DIR] [--dynamic] [--min-count N]"
                                     " [--count-updates]");
  while (args.next()) {
    if (args.flag("--coordinator", &flags.coordinator) || args.flag("--checkpoint-dir", &flags.checkpoint_dir) ||
        args.flag("--logdir", &flags.logdir) || args.flag("--dispatcher", &flags.dispatcher) ||
        args.flag("--steps", &flags.steps) || args.flag("--eval-steps", &flags.eval_steps) ||
        args.flag("--learning-rate", &flags.learning_rate) || args.flag("--min-workers", &flags.min_workers) ||
        args.flag("--log-every", &flags.log_every) || args.flag("--max-gap", &flags.max_gap_percent) ||
        args.flag("--min-count", &flags.min_count) || args.flag("--dynamic", &flags.dynamic) ||
        args.flag("--count-updates", &flags.count_updates)) {
      continue;
    }
    args.unknown();
  }
  if (flags.eval_steps < 1) args.usage("--eval-steps must be at least 1");
  if (flags.log_every < 1) args.usage("--log-every must be at least 1");
  return flags;
}

int fail(const std::string& what, const Status& status) {
  std::fprintf(stderr, "\nctr: %s: %s\n", what.c_str(), status.to_string().c_str());
  return 1;
}

// The live progress line: rewritten in place on a terminal, else one line
// every `log_every` steps. With `summaries` (--logdir), each line's figures
// go to TensorBoard too.
class Progress {
 public:
  Progress(int64_t total, int64_t log_every, capstan::SummaryWriter* summaries)
      : total_(total), log_every_(log_every), tty_(isatty(STDOUT_FILENO) == 1), summaries_(summaries),
        start_(Clock::now()) {}

  // Counts a step and, when a line is due, prints it and writes its figures
  // to TensorBoard: an error is the events' write error.
  Status step_done(int64_t step, float loss) {
    loss_sum_ += loss;
    ++losses_;
    auto now = Clock::now();
    bool show = tty_ ? (now - last_shown_ > std::chrono::milliseconds(200) || step == total_)
                     : (step % log_every_ == 0 || step == total_);
    if (!show) return Status::Ok();
    double seconds = std::chrono::duration<double>(now - start_).count();
    const double steps_per_second = seconds > 0 ? static_cast<double>(step) / seconds : 0.0;
    const double mean_loss = loss_sum_ / static_cast<double>(losses_);
    std::printf("%sstep %6lld/%lld  %7.1f steps/s  loss %.4f%s", tty_ ? "\r" : "", static_cast<long long>(step),
                static_cast<long long>(total_), steps_per_second, mean_loss, tty_ ? "   " : "\n");
    std::fflush(stdout);
    loss_sum_ = 0;
    losses_ = 0;
    last_shown_ = now;
    return capstan::examples::write_scalars(summaries_, step,
                                            {{"train/loss", mean_loss}, {"train/steps_per_second", steps_per_second}});
  }
  void finish() {
    if (tty_) std::printf("\n");
  }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  const int64_t total_;
  const int64_t log_every_;
  const bool tty_;
  capstan::SummaryWriter* const summaries_;  // null without --logdir
  const Clock::time_point start_;
  Clock::time_point last_shown_{};
  double loss_sum_ = 0;  // training losses since the last line (their mean is shown)
  int64_t losses_ = 0;
};

double entropy(double p) {
  if (p <= 0 || p >= 1) return 0;
  return -(p * std::log(p) + (1 - p) * std::log(1 - p));
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags = parse_flags(argc, argv);

  capstan::ClientOptions options;
  options.client_name = "ctr";
  auto connected = capstan::examples::connect_cluster(flags.coordinator, flags.min_workers, options, fail);
  if (connected == nullptr) return 1;
  capstan::ClusterCoordinator& cluster = *connected;

  // The weights start at zero. A variable lives on the parameter servers
  // beyond this program: a second run against the same cluster finds it, so
  // reset it (its Adagrad accumulators stay; use a fresh cluster for
  // comparable runs).
  capstan::Result<capstan::VariableInfo> info = Status::Unknown("not created");
  if (flags.dynamic) {
    // Rows appear as ids do; a new id starts at zero, as the fixed table's
    // rows do. A second run against the same cluster goes on from the rows
    // there (use a fresh cluster for comparable runs).
    capstan::EmbeddingTableOptions table_options;
    table_options.min_count = flags.min_count;
    info = cluster.create_embedding_table("ctr_table", 1, DType::kFloat32, capstan::EmbeddingInitializer::zeros(),
                                          capstan::Optimizer::adagrad(flags.learning_rate), table_options);
    if (!info.ok()) return fail("creating the embedding table", info.status());
  } else {
    auto zeros = capstan::zeros_initializer(DType::kFloat32, {ctr::kVocabularySize, 1});
    if (!zeros.ok()) return fail("initializing the weights", zeros.status());
    info = cluster.create_variable({kWeights, *zeros, capstan::Optimizer::adagrad(flags.learning_rate),
                                    capstan::Partitioner::fixed_shards(2)});
    if (!info.ok()) return fail("creating the weights", info.status());
    Status reset = cluster.assign_variable(kWeights, *zeros);
    if (!reset.ok()) return fail("resetting the weights", reset);
  }
  std::string train_step = flags.dynamic ? "train_step_dynamic" : "train_step";
  if (flags.count_updates) {
    // Each step adds 1 to both elements, one on each parameter server: what
    // a server lost in a recovery shows as steps - its element.
    auto zeros = Tensor::zeros(DType::kFloat32, {2});
    auto counter = cluster.create_variable(
        {"ctr_updates", *zeros, capstan::Optimizer::sgd(1.0), capstan::Partitioner::fixed_shards(2)});
    if (!counter.ok()) return fail("creating ctr_updates", counter.status());
    Status reset = cluster.assign_variable("ctr_updates", *zeros);
    if (!reset.ok()) return fail("resetting ctr_updates", reset);
    train_step += "_counted";
  }
  const std::string eval_step = flags.dynamic ? "eval_dynamic" : "eval";

  auto pipeline = data::Dataset::range(0, ctr::kHeldOutBegin)
                      .shard(data::kShardHint, data::kShardHint)
                      .map(data::Fn::named("make_example"))
                      .batch(ctr::kBatchSize, /*drop_remainder=*/true)
                      .prefetch(data::kAutotune);
  if (!flags.dispatcher.empty()) {
    // Input processing moves to the data workers; the training workers only
    // read finished batches from the service.
    auto id = data::service::register_dataset(flags.dispatcher, pipeline, options);
    if (!id.ok()) return fail("registering the input pipeline with " + flags.dispatcher, id.status());
    data::service::ReadOptions read;
    read.processing_mode = data::service::ProcessingMode::kHint;
    read.job_name = "ctr-train";
    read.client = options;
    pipeline = data::service::from_dataset_id(flags.dispatcher, *id, read).prefetch(data::kAutotune);
    std::printf("ctr: input pipeline registered with the data service at %s as dataset %s (job 'ctr-train')\n",
                flags.dispatcher.c_str(), id->c_str());
  }
  auto dataset = cluster.create_per_worker_dataset(pipeline);
  if (!dataset.ok()) return fail("creating the per-worker dataset", dataset.status());

  if (flags.dynamic) {
    std::printf("ctr: logistic regression over %d fields of raw %d-bit ids, dynamic embedding table in %zu shards:",
                ctr::kFields, ctr::kRawIdBits, info->shards.size());
  } else {
    std::printf("ctr: logistic regression over %d hashed fields (%lld ids), %lld-row table in %zu shards:",
                ctr::kFields, static_cast<long long>(ctr::kNumFeatureIds),
                static_cast<long long>(ctr::kVocabularySize), info->shards.size());
  }
  for (const auto& shard : info->shards) std::printf(" %s on ps%d", shard.name.c_str(), shard.ps_task);
  std::printf("\nctr: training %lld steps of %lld examples on %d worker(s), asynchronously\n",
              static_cast<long long>(flags.steps), static_cast<long long>(ctr::kBatchSize), cluster.num_workers());
  std::fflush(stdout);
  auto summaries = capstan::examples::open_summaries(flags.logdir, "ctr");
  if (!summaries.ok()) return fail("writing TensorBoard events", summaries.status());

  // Keep kInFlight steps queued; fetch each step's loss as it completes.
  Progress progress(flags.steps, flags.log_every, summaries->get());
  std::deque<capstan::RemoteValue> in_flight;
  int64_t scheduled = 0, completed = 0;
  Element step_args{{dataset->arg()}, {}};
  while (completed < flags.steps) {
    while (scheduled < flags.steps && in_flight.size() < kInFlight) {
      auto value = cluster.schedule(train_step, step_args);
      if (!value.ok()) return fail("scheduling step " + std::to_string(scheduled + 1), value.status());
      in_flight.push_back(*value);
      ++scheduled;
    }
    auto result = cluster.fetch(in_flight.front());
    in_flight.pop_front();
    if (!result.ok()) return fail("step " + std::to_string(completed + 1), result.status());
    ++completed;
    Status shown = progress.step_done(completed, result->components.at(0).flat<float>()[0]);
    if (!shown.ok()) return fail("writing TensorBoard events", shown);
  }
  Status joined = cluster.join();
  progress.finish();
  if (!joined.ok()) return fail("training", joined);
  double train_seconds = progress.seconds();
  std::printf("ctr: trained %lld steps (%lld examples) in %.1f s: %.0f steps/s\n",
              static_cast<long long>(flags.steps), static_cast<long long>(flags.steps * ctr::kBatchSize),
              train_seconds, train_seconds > 0 ? static_cast<double>(flags.steps) / train_seconds : 0.0);

  if (flags.count_updates) {
    auto counted = cluster.read_variable("ctr_updates");
    if (!counted.ok()) return fail("reading ctr_updates", counted.status());
    auto n = counted->flat<float>();
    std::printf("ctr: updates counted: %.0f and %.0f (element 0 and 1, one per parameter server) of %lld steps\n",
                static_cast<double>(n[0]), static_cast<double>(n[1]), static_cast<long long>(flags.steps));
  }

  // Held-out evaluation: batch i covers examples kHeldOutBegin + 256 i ...,
  // whichever worker runs it.
  std::vector<capstan::RemoteValue> evals;
  for (int64_t i = 0; i < flags.eval_steps; ++i) {
    Element args{{Tensor::scalar<int64_t>(ctr::kHeldOutBegin + i * ctr::kBatchSize),
                  Tensor::scalar<int64_t>(ctr::kBatchSize)},
                 {}};
    auto value = cluster.schedule(eval_step, args);
    if (!value.ok()) return fail("scheduling eval", value.status());
    evals.push_back(*value);
  }
  double model_loss = 0, planted_loss = 0, clicks = 0, count = 0;
  for (const auto& value : evals) {
    auto sums = cluster.fetch(value);
    if (!sums.ok()) return fail("eval", sums.status());
    model_loss += sums->components.at(0).flat<double>()[0];
    planted_loss += sums->components.at(1).flat<double>()[0];
    clicks += sums->components.at(2).flat<double>()[0];
    count += sums->components.at(3).flat<double>()[0];
  }
  model_loss /= count;
  planted_loss /= count;
  double constant_loss = entropy(clicks / count);
  double gap = 100.0 * (model_loss - planted_loss) / planted_loss;
  std::printf("ctr: held-out log-loss over %.0f examples (click rate %.3f):\n", count, clicks / count);
  std::printf("  model            %.5f\n", model_loss);
  std::printf("  planted model    %.5f   (the data's true model: the best achievable)\n", planted_loss);
  std::printf("  constant rate    %.5f   (predicting the click rate for everyone: %+.1f%%)\n", constant_loss,
              100.0 * (constant_loss - planted_loss) / planted_loss);
  std::printf("  gap              %+.2f%%    (target: at most %.1f%%) %s\n", gap, flags.max_gap_percent,
              gap <= flags.max_gap_percent ? "PASS" : "FAIL");
  Status written = capstan::examples::write_scalars(
      summaries->get(), flags.steps,
      {{"test/log_loss", model_loss}, {"test/planted_log_loss", planted_loss}, {"test/gap_percent", gap}});
  if (written.ok() && *summaries != nullptr) written = (*summaries)->close();
  if (!written.ok()) return fail("writing TensorBoard events", written);
  if (!flags.checkpoint_dir.empty()) {
    capstan::CheckpointManager manager(cluster, flags.checkpoint_dir, /*max_to_keep=*/3);
    auto saved = manager.save(flags.steps);
    if (!saved.ok()) return fail("saving a checkpoint", saved.status());
    std::printf("ctr: saved checkpoint %s (inspect: capstanctl checkpoint inspect %s)\n", saved->c_str(),
                saved->c_str());
  }
  return gap <= flags.max_gap_percent ? 0 : 1;
}
