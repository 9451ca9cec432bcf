// TensorFlow's wide-and-deep census example on a Capstan cluster: predict
// whether a person earns more than $50K a year from the UCI Adult (Census
// Income) data, with a linear model over sparse and crossed columns (wide)
// and an MLP over embeddings and numeric columns (deep); features.h and
// model.h say exactly what it computes.
//
//   scripts/local-cluster.sh up --ps 2 --workers 2 --data-workers 2
//       --module build/lib/libcensus_module.so --module build/lib/libcensus_torch_module.so
//   . .run/cluster/cluster.env
//   build/bin/census --coordinator $COORDINATOR --dispatcher $DISPATCHER
//
// --mode ps (the default) is parameter-server (asynchronous) training: the wide table and
// the embeddings are partitioned across the parameter servers and updated
// with sparse gradients (Adagrad and Adam), the MLP is one dense variable
// (Adam), and every worker runs steps on its own batches. With --dispatcher
// the data workers read and parse adult.data (TextLine GZIP -> decode_csv ->
// census_features -> shuffle -> batch) and the training workers read the
// batches from the data service; without it each worker runs the pipeline
// itself on its shard. After each epoch the model is evaluated on all of
// adult.test, read through the same pipeline by `census_evaluate` closures:
// accuracy, ROC AUC and log-loss. The program exits 1 when the final
// accuracy or AUC is below its target. In ps mode the model is the LibTorch
// module of torch_model.h (--model torch, the default when this build has
// LibTorch; its closures are in libcensus_torch_module.so): autograd
// computes its gradients, capstan::torch::PsModule pulls and pushes them;
// --model eigen trains model.h's hand-written one (census_train_step).
//
// --mode sync is synchronous training (MultiWorkerMirroredStrategy, in its
// multi-client form): the program starts --replicas processes of itself
// (torchrun-style; or start each with --rank and --group yourself), which
// form a collective group through the coordinator; every replica holds all
// the variables as mirrored variables and all of adult.data
// (capstan::MirroredInput: each step's global batch of --batch-size split
// among the ranks at the group's input position, rank 0 counting every
// epoch's examples by id; with --dispatcher, batches from the data service),
// and each step all-reduces the gradients and applies the same optimizers,
// so the replicas stay identical. A rank that dies fails the step; the
// others re-form the group (join_group under --group again), waiting for
// the process to be started again with the same --rank and --group, which
// rejoins with their variables and input position: no example lost or
// repeated. --mode hybrid keeps the wide table and the
// embeddings on the parameter servers (sparse, asynchronous) while the MLP is
// mirrored and all-reduced: the recommender layout. Rank 0 evaluates. With
// --model torch (the default when the LibTorch part loads) each replica
// builds torch_model.h's module and trains it with
// capstan::torch::MirroredModule (the plugin's TorchReplica): in sync mode
// every parameter is mirrored, the tables as torch::nn::Embeddings (dense:
// census's are small); in hybrid mode the tables are capstan::torch::
// Embeddings on the parameter servers, pulled and pushed by a PsModule
// around the same one backward that all-reduces the MLP's gradients.
//
// --mode strategy is the same synchronous training driven from this one
// program (MirroredStrategy, capstan/strategy.h): the worker-servers are the
// replicas, each step runs a closure on all of them at once, each reading
// its shard (a per-worker dataset, or the data service with --dispatcher)
// with its own copy of the variables; evaluation runs as a step too (each
// replica a shard of adult.test). A worker that dies fails that step; the
// program goes on with the others, and a worker that comes back joins at
// the next step. --mode strategy-hybrid keeps the tables on the parameter
// servers and mirrors the MLP. --min-workers replicas are awaited; each
// reads --batch-size / --min-workers examples a step. With --model torch
// (the default when the LibTorch part loads) the strategy's variables are
// torch_model.h's parameters (the plugin makes their specs) and each worker
// trains the module in census_torch_sync_step (libcensus_torch_module.so:
// capstan::torch::MirroredModule attached to the worker's replicas; hybrid:
// the tables are capstan::torch::Embeddings on the parameter servers);
// --model eigen runs model.h's census_sync_step.
//
// Options:
//   --coordinator HOST:PORT  the coordinator (default 127.0.0.1:7000)
//   --dispatcher HOST:PORT   feed the workers through the tf.data service
//   --data-dir DIR           holds adult.data.gz and adult.test.gz (default:
//                            examples/census/data under the current directory)
//   --mode M                 ps (default), sync, hybrid, strategy or
//                            strategy-hybrid (see above)
//   --model torch|eigen      the model (default torch when its plugin loads)
//   --replicas N             processes in sync and hybrid modes (default 2)
//   --rank R --group NAME    run as rank R of the group NAME (sync, hybrid:
//                            what the launcher passes to the others)
//   --epochs N               passes over adult.data (default 5)
//   --batch-size N           examples per step (default 128)
//   --seed N                 fixes the initial weights and the shuffle order;
//                            with one worker (and one data worker, or none)
//                            two runs give identical metrics
//   --wide-learning-rate X   Adagrad's, for the wide table (default 0.05;
//                            0.2 for the LibTorch model in the strategy
//                            modes, see kStrategyTorchWideLearningRate)
//   --deep-learning-rate X   Adam's, for the embeddings and the MLP (default 0.0005)
//   --min-workers N          wait until that many workers have registered (default 1)
//   --eval-shards N          evaluation closures per evaluation (default 8)
//   --target-accuracy X      exit 1 below this test accuracy (default 0.85)
//   --target-auc X           exit 1 below this test AUC (default 0.90)
//   --log-every N            without a terminal, print progress every N steps (default 100)
//   --checkpoint-dir DIR     after training, save a checkpoint there (every
//                            mode; the parameter servers' format)
//   --trace FILE             --trace-after seconds (default 2) into training
//                            (ps mode: from the first step done), record
//                            --trace-seconds (default 5) of the whole cluster
//                            and this program as a Chrome trace event file
//                            (capstan/cluster_trace.h; open it in Perfetto)
//   --collective-timeout-ms N  strategy modes: the replicas' collective
//                            deadline (default 60000): a replica that stops
//                            answering fails the step after this long
//   --step-log FILE          strategy mode: a line per step run ("<unix ms>
//                            ok|failed <input position> <replicas>")
//   --logdir DIR             write TensorBoard event files there (`tensorboard
//                            --logdir DIR`): train/loss, train/accuracy and
//                            train/examples_per_second (the epoch so far)
//                            with each progress line, test/accuracy, test/auc
//                            and test/log_loss after each epoch, by global
//                            step; in sync and hybrid modes rank 0 writes
// CAPSTAN_TOKEN / CAPSTAN_TOKEN_FILE give the cluster token.
#include <capstan/cluster_trace.h>
#include <capstan/data/dataset.h>
#include <capstan/data/service.h>
#include <capstan/mirrored.h>
#include <capstan/phases.h>
#include <capstan/strategy.h>
#include <capstan/summary.h>
#include <capstan/training.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "census/features.h"
#include "census/functions.h"
#include "census/model.h"
#include "census/pipeline.h"
#include "census/replica.h"
#include "census/torch_program.h"
#include "common/example_util.h"

namespace {

using capstan::DType;
using capstan::Element;
using capstan::Status;
using capstan::Tensor;
namespace data = capstan::data;
using Clock = std::chrono::steady_clock;

// The rows of adult.data and adult.test (TF's example has the same
// constants: an epoch is this many examples).
constexpr int64_t kTrainingExamples = 32561;
constexpr int64_t kTestExamples = 16281;
// Steps scheduled ahead of the one being fetched.
constexpr size_t kInFlight = 32;

struct Flags {
  std::string coordinator = "127.0.0.1:7000";
  std::string dispatcher;
  std::string data_dir = "examples/census/data";
  std::string mode = "ps";
  // "torch" (the LibTorch module, torch_model.h) when its plugin loads (a
  // build with LibTorch, run where LibTorch is installed), else "eigen"
  // (model.h's hand-written passes).
  std::string model;
  int64_t epochs = 5;
  int64_t batch_size = 128;
  std::optional<uint64_t> seed;
  double wide_learning_rate = 0.05;
  bool wide_learning_rate_given = false;  // --wide-learning-rate was passed
  double deep_learning_rate = 0.0005;
  // The deep (Adam) rate over the run, on the parameter servers and on the
  // mirrored replicas of sync and hybrid modes: "cosine" decays it to 0
  // over the run's updates (a Keras CosineDecay), "none" keeps it.
  std::string lr_decay = "cosine";
  int min_workers = 1;
  int64_t eval_shards = 8;
  double target_accuracy = 0.85;
  double target_auc = 0.90;
  int64_t log_every = 100;
  std::string checkpoint_dir;
  std::string step_log;
  std::string logdir;  // empty: no TensorBoard events
  std::string trace;   // empty: no trace
  int64_t collective_timeout_ms = 60000;
  double trace_seconds = 5;
  double trace_after = 2;
  int replicas = 2;
  int rank = -1;  // sync/hybrid: -1 launches the replicas
  std::string group;
};

[[noreturn]] void usage(const char* program, const std::string& error) {
  if (!error.empty()) std::cerr << program << ": " << error << "\n";
  // --help is an answer (stdout, exit 0); a bad flag is an error (stderr, 2).
  (error.empty() ? std::cout : std::cerr) << "usage: " << program
            << " [--coordinator HOST:PORT] [--dispatcher HOST:PORT] [--data-dir DIR]"
               " [--mode ps|sync|hybrid|strategy|strategy-hybrid] [--model torch|eigen]"
               " [--epochs N] [--batch-size N] [--seed N] [--wide-learning-rate X] [--deep-learning-rate X]"
               " [--lr-decay cosine|none]"
               " [--min-workers N] [--eval-shards N] [--target-accuracy X] [--target-auc X] [--log-every N]"
               " [--checkpoint-dir DIR] [--step-log FILE] [--logdir DIR] [--replicas N] [--rank R --group NAME]"
               " [--trace FILE [--trace-seconds N] [--trace-after N]] [--collective-timeout-ms N]\n";
  std::exit(error.empty() ? 0 : 2);
}

Flags parse_flags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    if (name == "-h" || name == "--help") usage(argv[0], "");
    if (i + 1 >= argc) usage(argv[0], "option " + name + " needs a value");
    std::string value = argv[++i];
    auto integer = [&](int64_t min) -> int64_t {
      char* end = nullptr;
      long long n = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < min) {
        usage(argv[0], name + " needs an integer >= " + std::to_string(min) + ", got '" + value + "'");
      }
      return n;
    };
    auto real = [&]() -> double {
      char* end = nullptr;
      double x = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(x >= 0)) usage(argv[0], name + " needs a number >= 0, got '" + value + "'");
      return x;
    };
    if (name == "--coordinator") flags.coordinator = value;
    else if (name == "--dispatcher") flags.dispatcher = value;
    else if (name == "--data-dir") flags.data_dir = value;
    else if (name == "--mode") flags.mode = value;
    else if (name == "--model") flags.model = value;
    else if (name == "--epochs") flags.epochs = integer(1);
    else if (name == "--batch-size") flags.batch_size = integer(1);
    else if (name == "--seed") flags.seed = static_cast<uint64_t>(integer(0));
    else if (name == "--wide-learning-rate") flags.wide_learning_rate = real(), flags.wide_learning_rate_given = true;
    else if (name == "--deep-learning-rate") flags.deep_learning_rate = real();
    else if (name == "--lr-decay") flags.lr_decay = value;
    else if (name == "--min-workers") flags.min_workers = static_cast<int>(integer(1));
    else if (name == "--eval-shards") flags.eval_shards = integer(1);
    else if (name == "--target-accuracy") flags.target_accuracy = real();
    else if (name == "--target-auc") flags.target_auc = real();
    else if (name == "--log-every") flags.log_every = integer(1);
    else if (name == "--checkpoint-dir") flags.checkpoint_dir = value;
    else if (name == "--step-log") flags.step_log = value;
    else if (name == "--logdir") flags.logdir = value;
    else if (name == "--trace") flags.trace = value;
    else if (name == "--collective-timeout-ms") flags.collective_timeout_ms = integer(1);
    else if (name == "--trace-seconds") flags.trace_seconds = real();
    else if (name == "--trace-after") flags.trace_after = real();
    else if (name == "--replicas") flags.replicas = static_cast<int>(integer(1));
    else if (name == "--rank") flags.rank = static_cast<int>(integer(0));
    else if (name == "--group") flags.group = value;
    else usage(argv[0], "unknown option '" + name + "'");
  }
  if (flags.mode != "ps" && flags.mode != "sync" && flags.mode != "hybrid" && flags.mode != "strategy" &&
      flags.mode != "strategy-hybrid") {
    usage(argv[0], "--mode must be ps, sync, hybrid, strategy or strategy-hybrid, got '" + flags.mode + "'");
  }
  if (flags.lr_decay != "cosine" && flags.lr_decay != "none") {
    usage(argv[0], "--lr-decay must be cosine or none, got '" + flags.lr_decay + "'");
  }
  if (flags.model.empty()) flags.model = census::torch_available() ? "torch" : "eigen";
  if (flags.model != "torch" && flags.model != "eigen") {
    usage(argv[0], "--model must be torch or eigen, got '" + flags.model + "'");
  }
  if (flags.model == "torch" && !census::torch_available()) {
    usage(argv[0], "--model torch: the LibTorch model does not load (" + census::torch_unavailable_reason() +
                       "; a build with CAPSTAN_TORCH and LibTorch installed have it); use --model eigen");
  }
  if (flags.rank >= 0 && (flags.group.empty() || flags.rank >= flags.replicas)) {
    usage(argv[0], "--rank needs --group and must be below --replicas");
  }
  return flags;
}

int fail(const std::string& what, const Status& status) {
  std::fprintf(stderr, "\ncensus: %s: %s\n", what.c_str(), status.to_string().c_str());
  return 1;
}

// Keras-fit-like progress: rewritten in place on a terminal, else one line
// every `log_every` steps and at the end of each epoch. With `summaries`
// (--logdir), each line's figures go to TensorBoard too, at the global step.
class Progress {
 public:
  Progress(int64_t epochs, int64_t steps_per_epoch, int64_t log_every, capstan::SummaryWriter* summaries)
      : epochs_(epochs), steps_(steps_per_epoch), log_every_(log_every), tty_(isatty(STDOUT_FILENO) == 1),
        summaries_(summaries) {}

  void start_epoch(int64_t epoch) {
    epoch_ = epoch;
    loss_sum_ = 0;
    correct_ = examples_ = steps_done_ = 0;
    started_ = Clock::now();
  }
  // Counts a step and, when a line is due, prints it and writes its figures
  // (the epoch so far) to TensorBoard: an error is the events' write error.
  Status step_done(double loss, int64_t correct, int64_t examples) {
    ++steps_done_;
    loss_sum_ += loss;
    correct_ += correct;
    examples_ += examples;
    auto now = Clock::now();
    bool show = tty_ ? (now - last_shown_ > std::chrono::milliseconds(200) || steps_done_ == steps_)
                     : (steps_done_ % log_every_ == 0 || steps_done_ == steps_);
    if (!show) return Status::Ok();
    const double examples_per_second = static_cast<double>(examples_) / seconds();
    const double mean_loss = loss_sum_ / static_cast<double>(steps_done_);
    const double accuracy = static_cast<double>(correct_) / static_cast<double>(examples_);
    std::printf("%sepoch %lld/%lld  step %4lld/%lld  %7.0f examples/s  loss %.4f  accuracy %.4f  (%s)%s",
                tty_ ? "\r" : "", static_cast<long long>(epoch_), static_cast<long long>(epochs_),
                static_cast<long long>(steps_done_), static_cast<long long>(steps_), examples_per_second, mean_loss,
                accuracy, phases().c_str(), tty_ ? "   " : "\n");
    std::fflush(stdout);
    last_shown_ = now;
    if (cluster_ != nullptr) {
      // For the coordinator's status page; training does not depend on it.
      (void)cluster_->report_scalar("train/loss", mean_loss, global_step());
      (void)cluster_->report_scalar("train/accuracy", accuracy, global_step());
    }
    return capstan::examples::write_scalars(
        summaries_, global_step(),
        {{"train/loss", mean_loss}, {"train/accuracy", accuracy}, {"train/examples_per_second", examples_per_second}});
  }
  void end_epoch() {
    if (tty_) std::printf("\n");
  }
  // Each line's loss and accuracy also go to the coordinator's status page,
  // and the line shows where the workers' time went (worker_stats()).
  void report_to(capstan::ClusterCoordinator* cluster) { cluster_ = cluster; }
  // A step this process ran itself (multi-client): where its time went.
  void add_phases(const capstan::PhaseTimes& phases) {
    local_phases_ += phases;
    timed_locally_ = true;
  }
  double seconds() const { return std::max(1e-9, std::chrono::duration<double>(Clock::now() - started_).count()); }
  int64_t examples() const { return examples_; }
  // Steps of the earlier epochs and of this one so far.
  int64_t global_step() const { return (epoch_ - 1) * steps_ + steps_done_; }

 private:
  const int64_t epochs_, steps_, log_every_;
  const bool tty_;
  capstan::SummaryWriter* const summaries_;  // null without --logdir
  // Where the steps' time went so far: this process's, else the workers'.
  std::string phases() const {
    if (timed_locally_) return capstan::format_phases(local_phases_);
    if (cluster_ == nullptr) return "no steps timed";
    auto stats = cluster_->worker_stats();
    return stats.ok() ? capstan::format_phases(stats->totals) : "phases unknown: " + stats.status().message();
  }

  capstan::ClusterCoordinator* cluster_ = nullptr;
  capstan::PhaseTimes local_phases_;
  bool timed_locally_ = false;
  int64_t epoch_ = 0, steps_done_ = 0, correct_ = 0, examples_ = 0;
  double loss_sum_ = 0;
  Clock::time_point started_{}, last_shown_{};
};

struct Metrics {
  int64_t count = 0;
  double accuracy = 0, auc = 0, log_loss = 0;
};

Metrics metrics_of(const std::vector<float>& probabilities, const std::vector<float>& labels);

// The whole test file, in `shards` closures that any worker may run.
// `function`: census_evaluate or census_torch_evaluate.
capstan::Result<Metrics> evaluate(capstan::ClusterCoordinator& cluster, const std::string& function,
                                  const std::string& path, int64_t shards) {
  std::vector<capstan::RemoteValue> values;
  for (int64_t i = 0; i < shards; ++i) {
    Element args{{*Tensor::from_strings({path}, {}), Tensor::scalar<int64_t>(shards), Tensor::scalar<int64_t>(i)}, {}};
    CAPSTAN_ASSIGN_OR_RETURN(capstan::RemoteValue value, cluster.schedule(function, args));
    values.push_back(value);
  }
  std::vector<float> probabilities, labels;
  for (const auto& value : values) {
    CAPSTAN_ASSIGN_OR_RETURN(Element shard, cluster.fetch(value));
    auto p = shard.components.at(0).flat<float>();
    auto y = shard.components.at(1).flat<float>();
    probabilities.insert(probabilities.end(), p.begin(), p.end());
    labels.insert(labels.end(), y.begin(), y.end());
  }
  if (labels.empty()) return Status::DataLoss(function + " read no examples from " + path);
  return metrics_of(probabilities, labels);
}

Metrics metrics_of(const std::vector<float>& probabilities, const std::vector<float>& labels) {
  Metrics m;
  m.count = static_cast<int64_t>(labels.size());
  double correct = 0, loss = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    correct += (probabilities[i] > 0.5f) == (labels[i] > 0.5f) ? 1 : 0;
    double p = std::clamp(static_cast<double>(probabilities[i]), 1e-7, 1 - 1e-7);
    loss -= labels[i] > 0.5f ? std::log(p) : std::log(1 - p);
  }
  m.accuracy = correct / static_cast<double>(m.count);
  m.log_loss = loss / static_cast<double>(m.count);
  m.auc = census::roc_auc(probabilities, labels);
  return m;
}

// Prints an epoch's test metrics. With `summaries` (--logdir; else null),
// writes them at `step` too and flushes: the epoch's events reach the file.
Status print_epoch_metrics(int64_t epoch, int64_t epochs, const Metrics& metrics, capstan::SummaryWriter* summaries,
                           int64_t step) {
  std::printf("epoch %lld/%lld  test: accuracy %.4f  AUC %.4f  log-loss %.4f  (%lld examples)\n",
              static_cast<long long>(epoch), static_cast<long long>(epochs), metrics.accuracy, metrics.auc,
              metrics.log_loss, static_cast<long long>(metrics.count));
  std::fflush(stdout);
  CAPSTAN_RETURN_IF_ERROR(capstan::examples::write_scalars(
      summaries, step,
      {{"test/accuracy", metrics.accuracy}, {"test/auc", metrics.auc}, {"test/log_loss", metrics.log_loss}}));
  return summaries != nullptr ? summaries->flush() : Status::Ok();
}

// Prints the final metrics against the targets; true when both are met.
bool report(const Flags& flags, const Metrics& metrics, int64_t trained, double train_seconds) {
  const bool accuracy_ok = metrics.accuracy >= flags.target_accuracy;
  const bool auc_ok = metrics.auc >= flags.target_auc;
  std::printf("census: trained %lld examples in %.1f s (%.0f examples/s)\n", static_cast<long long>(trained),
              train_seconds, static_cast<double>(trained) / std::max(train_seconds, 1e-9));
  std::printf("census: adult.test (%lld examples; majority class: 76.4%%):\n", static_cast<long long>(metrics.count));
  std::printf("  accuracy  %.2f%%   (target: at least %.1f%%) %s\n", 100 * metrics.accuracy,
              100 * flags.target_accuracy, accuracy_ok ? "PASS" : "FAIL");
  std::printf("  AUC       %.4f   (target: at least %.2f) %s\n", metrics.auc, flags.target_auc,
              auc_ok ? "PASS" : "FAIL");
  std::printf("  log-loss  %.4f\n", metrics.log_loss);
  if (metrics.count != kTestExamples) {
    std::printf("census: warning: the test file gave %lld examples, not %lld\n", static_cast<long long>(metrics.count),
                static_cast<long long>(kTestExamples));
  }
  return accuracy_ok && auc_ok;
}

// The training batches through the data service at flags.dispatcher: one
// HINT job named `job` (every reader of this run shares it: the data
// workers' shards), or the pipeline itself without a dispatcher. `say`
// prints where they come from.
capstan::Result<data::Dataset> training_input(const Flags& flags, data::Dataset pipeline,
                                              const capstan::ClientOptions& options, const std::string& job, bool say) {
  if (flags.dispatcher.empty()) return pipeline;
  auto id = data::service::register_dataset(flags.dispatcher, pipeline, options);
  CAPSTAN_RETURN_IF_ERROR(id.status().with_context("registering the input pipeline with " + flags.dispatcher));
  data::service::ReadOptions read;
  read.processing_mode = data::service::ProcessingMode::kHint;
  read.job_name = job;
  read.client = options;
  if (say) {
    std::printf("census: the data service at %s parses adult.data (dataset %s, job '%s')\n", flags.dispatcher.c_str(),
                id->c_str(), job.c_str());
  }
  return data::service::from_dataset_id(flags.dispatcher, *id, read).prefetch(data::kAutotune);
}

// A job name of its own for this run.
std::string run_job_name(const std::string& prefix) {
  return prefix + "-" + std::to_string(getpid()) + "-" +
         std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
}

// The optimizers of the model's parts at the flags' rates: Adagrad on the
// wide part, Adam on the deep part. `updates` is the number of updates each
// variable gets over the run (0: unknown); with --lr-decay cosine and
// updates > 0, Adam's rate decays to 0 over them (Keras' CosineDecay), so
// that the last steps, asynchronous ones above all, move the model less
// and the final accuracy does not wobble with the last batches. Adagrad's
// rate already shrinks as its accumulator grows.
census::Optimizers optimizers(const Flags& flags, int64_t updates) {
  census::Optimizers out{capstan::Optimizer::adagrad(flags.wide_learning_rate),
                         capstan::Optimizer::adam(flags.deep_learning_rate)};
  if (flags.lr_decay == "cosine" && updates > 0) {
    out.deep = out.deep.with_schedule(capstan::LearningRateSchedule::cosine_decay(updates));
  }
  return out;
}

// The model's variables with their initial values and `optimizers`: the
// wide table and the embeddings (partitioned in 2 on the parameter
// servers), then the MLP.
std::vector<capstan::VariableSpec> model_variables(const census::Optimizers& optimizers, uint64_t seed) {
  return {{"census_wide", *capstan::zeros_initializer(DType::kFloat32, {census::wide_rows(), 1}), optimizers.wide,
           capstan::Partitioner::fixed_shards(2)},
          {"census_embeddings",
           *Tensor::from_vector<float>(census::initial_embeddings(seed), {census::embedding_rows(), census::kEmbeddingDim}),
           optimizers.deep, capstan::Partitioner::fixed_shards(2)},
          {"census_dnn", *Tensor::from_vector<float>(census::initial_dnn(seed + 1), {census::dnn_parameters()}),
           optimizers.deep, capstan::Partitioner::none()}};
}

// Creates `specs` on the parameter servers with their initial values. The
// variables outlive this program: a second run against the same cluster
// finds them, so they are assigned their initial values again (their
// optimizer slots stay; use a fresh cluster for comparable runs).
Status create_on_parameter_servers(capstan::ClusterCoordinator& cluster, const std::vector<capstan::VariableSpec>& specs) {
  for (const auto& spec : specs) {
    CAPSTAN_RETURN_IF_ERROR(cluster.create_variable(spec).status().with_context("creating " + spec.name));
    CAPSTAN_RETURN_IF_ERROR(cluster.assign_variable(spec.name, spec.initial).with_context("initializing " + spec.name));
  }
  return Status::Ok();
}

// The synchronous modes' layouts: every variable mirrored, or (hybrid) the
// tables on the parameter servers and the MLP mirrored.
struct Layout {
  std::vector<capstan::VariableSpec> on_parameter_servers;
  std::vector<capstan::MirroredVariableSpec> mirrored;
};

// `tables`: the optimizers of the tables on the parameter servers (hybrid);
// the mirrored variables' optimizers decay over `mirrored_updates` updates
// (one a step; 0: constant rates).
Layout layout(const Flags& flags, uint64_t seed, bool hybrid, const census::Optimizers& tables,
              int64_t mirrored_updates) {
  Layout out;
  for (auto& v : model_variables(optimizers(flags, mirrored_updates), seed)) {
    if (hybrid && v.name != "census_dnn") {
      v.optimizer = v.name == "census_wide" ? tables.wide : tables.deep;
      out.on_parameter_servers.push_back(std::move(v));
    } else {
      out.mirrored.push_back({v.name, v.initial, v.optimizer});
    }
  }
  return out;
}

// ---- Synchronous modes: one process per replica ------------------------------------

using census::StepOutput;

// The hybrid layout's tables through the program's own connection.
census::Tables cluster_tables(capstan::ClusterCoordinator& cluster) {
  return {[&cluster](const std::string& name, const Tensor& ids) { return cluster.gather(name, ids); },
          [&cluster](const std::string& name, const Tensor& ids, const Tensor& rows) {
            return cluster.apply_sparse_gradients(name, ids, rows);
          }};
}

capstan::Result<StepOutput> replica_step(const Element& batch, capstan::MirroredVariables& vars,
                                         capstan::ClusterCoordinator& cluster, bool hybrid, bool train) {
  const census::Tables tables = cluster_tables(cluster);
  return census::replica_step(batch, vars, hybrid ? &tables : nullptr, train);
}

// P(label = 1) for each example of a batch, with this replica's model.
using Predict = std::function<capstan::Result<std::vector<float>>(const Element& batch)>;

// Rank 0's evaluation: all of adult.test through the pipeline, in process.
capstan::Result<Metrics> replica_evaluate(const std::string& path, const capstan::FunctionRegistry& functions,
                                          const Predict& predict) {
  CAPSTAN_ASSIGN_OR_RETURN(auto it, census::examples(path, 1, 0).batch(1024).make_iterator(&functions));
  std::vector<float> probabilities, labels;
  while (true) {
    CAPSTAN_ASSIGN_OR_RETURN(std::optional<Element> batch, it->get_next());
    if (!batch) break;
    CAPSTAN_ASSIGN_OR_RETURN(std::vector<float> p, predict(*batch));
    probabilities.insert(probabilities.end(), p.begin(), p.end());
    auto y = batch->components.at(2).flat<float>();
    labels.insert(labels.end(), y.begin(), y.end());
  }
  if (labels.empty()) return Status::DataLoss("no examples in " + path);
  return metrics_of(probabilities, labels);
}

// The examples each epoch of a step input trained on, by id (the step
// values' "example_ids"): epoch e is positions [e * n, (e + 1) * n), and a
// step's replicas took its positions in replica order.
class ExampleCounts {
 public:
  explicit ExampleCounts(int64_t n) : n_(n) {}
  Status add(const capstan::PerReplica& step, int64_t global_batch) {
    int64_t position = step.input_position - global_batch;
    for (const auto& value : step.values) {
      if (value.components.size() < 4) return Status::DataLoss("a replica's value has no example ids");
      auto ids = value.components[3].flat<int64_t>();
      CAPSTAN_RETURN_IF_ERROR(add_ids(position, ids));
      position += static_cast<int64_t>(ids.size());
    }
    if (position != step.input_position) {
      return Status::DataLoss("the replicas trained on " + std::to_string(position - step.input_position +
                                                                          global_batch) +
                              " examples; the step took " + std::to_string(global_batch));
    }
    return Status::Ok();
  }
  // The examples at positions position, position + 1, ..., those from
  // position `from` on.
  Status add_ids(int64_t position, std::span<const int64_t> ids, int64_t from = 0) {
    for (int64_t id : ids) {
      if (id < 0 || id >= n_) return Status::DataLoss("example id " + std::to_string(id) + " is not in [0, n)");
      if (position < from) {
        ++position;
        continue;
      }
      auto& epoch = times_[position / n_];
      epoch.resize(static_cast<size_t>(n_));
      ++epoch[static_cast<size_t>(id)];
      ++position;
    }
    return Status::Ok();
  }
  // DataLoss naming an example seen other than once in epoch `epoch`.
  Status check_epoch(int64_t epoch) {
    auto& times = times_[epoch];
    times.resize(static_cast<size_t>(n_));
    for (int64_t id = 0; id < n_; ++id) {
      if (times[static_cast<size_t>(id)] != 1) {
        return Status::DataLoss("example " + std::to_string(id) + " was trained on " +
                                std::to_string(times[static_cast<size_t>(id)]) + " times in the epoch");
      }
    }
    times_.erase(epoch);
    return Status::Ok();
  }

 private:
  const int64_t n_;
  std::map<int64_t, std::vector<int32_t>> times_;  // by epoch (from 0), by example id
};

// A multi-client replica's model: LibTorch (the plugin's TorchReplica) or
// model.h's variables, made, moved to a re-formed group and stepped alike.
class ReplicaModel {
 public:
  ReplicaModel(const Flags& flags, capstan::ClusterCoordinator& cluster, uint64_t seed, int64_t steps)
      : flags_(flags), cluster_(cluster), seed_(seed), steps_(steps), hybrid_(flags.mode == "hybrid"),
        torch_(flags.model == "torch") {}

  // Collective on the first group this process is in: a fresh start when no
  // member holds the model yet (rank 0's initial values), else this process
  // was restarted and takes the others' state (MirroredVariables::join).
  Status start(capstan::Communicator& group) {
    auto source = capstan::MirroredVariables::recovery_source(group, nullptr);
    if (!source.ok() && source.status().code() != capstan::StatusCode::kNotFound) return source.status();
    const int join_source = source.ok() ? *source : -1;
    // Hybrid: every replica pushes its own batch's updates to the tables, so
    // a table gets `replicas` updates a step.
    const census::Optimizers tables = optimizers(flags_, flags_.replicas * steps_);
    if (torch_) {
      census::TorchReplicaOptions options{hybrid_, optimizers(flags_, steps_), tables, seed_, join_source};
      CAPSTAN_ASSIGN_OR_RETURN(torch_model_, census::create_torch_replica(group, cluster_, options));
      return Status::Ok();
    }
    Layout variables = layout(flags_, seed_, hybrid_, tables, steps_);
    if (join_source >= 0) {
      CAPSTAN_ASSIGN_OR_RETURN(eigen_variables_, capstan::MirroredVariables::join(group, variables.mirrored, join_source));
      return Status::Ok();
    }
    if (hybrid_) {
      // The tables on the parameter servers: rank 0 creates them.
      if (group.rank() == 0) CAPSTAN_RETURN_IF_ERROR(create_on_parameter_servers(cluster_, variables.on_parameter_servers));
      CAPSTAN_RETURN_IF_ERROR(group.barrier().with_context("waiting for rank 0's tables"));
    }
    CAPSTAN_ASSIGN_OR_RETURN(eigen_variables_, capstan::MirroredVariables::create(group, variables.mirrored));
    return Status::Ok();
  }
  // Collective on a group re-formed after a failure (every member, the
  // restarted ones calling start()): the state of the member with the
  // fewest steps.
  Status move_to(capstan::Communicator& group) {
    CAPSTAN_ASSIGN_OR_RETURN(int source, capstan::MirroredVariables::recovery_source(group, &variables()));
    return torch_ ? torch_model_->set_group(group, source) : eigen_variables_->set_group(group, source);
  }
  capstan::MirroredVariables& variables() { return torch_ ? torch_model_->variables() : *eigen_variables_; }
  // One step on this replica's batch.
  capstan::Result<census::StepFigures> train_step(const Element& batch) {
    if (torch_) return torch_model_->train_step(batch);
    CAPSTAN_ASSIGN_OR_RETURN(StepOutput step, replica_step(batch, *eigen_variables_, cluster_, hybrid_, /*train=*/true));
    return census::StepFigures{step.output.loss_sum / static_cast<double>(step.n), step.output.correct, step.n};
  }
  capstan::Result<std::vector<float>> predict(const Element& batch) {
    if (torch_) return torch_model_->predict(batch);
    CAPSTAN_ASSIGN_OR_RETURN(StepOutput step, replica_step(batch, *eigen_variables_, cluster_, hybrid_, /*train=*/false));
    return std::move(step.output.probabilities);
  }

 private:
  const Flags& flags_;
  capstan::ClusterCoordinator& cluster_;
  const uint64_t seed_;
  const int64_t steps_;  // in the whole run (the learning-rate decay's length)
  const bool hybrid_, torch_;
  std::unique_ptr<census::TorchReplica> torch_model_;
  std::unique_ptr<capstan::MirroredVariables> eigen_variables_;
};

// Rank 0's count of the examples each epoch trained on (exactly-once
// input): the ids of each step's shares, all-gathered before the step and
// kept once the step is applied. The last step stays apart until the next
// one: after a failure the group may take the state of a member that had
// not applied it (recovery_source), and then it did not happen.
class StepIds {
 public:
  explicit StepIds(int64_t n) : n_(n), counts_(n) {}
  // Step `step` (its number once applied) trained on `ids`, from `position`.
  Status applied(int64_t step, int64_t position, Tensor ids) {
    CAPSTAN_RETURN_IF_ERROR(fold());
    last_ = Last{step, position, std::move(ids)};
    return Status::Ok();
  }
  // The group went back to `step` steps applied.
  void rolled_back_to(int64_t step) {
    if (last_ && last_->step > step) last_.reset();
  }
  // DataLoss naming an example not seen exactly once in epoch `epoch`
  // (from 0), once every step before position (epoch + 1) * n applied. The
  // last step's examples of this epoch count; its later ones wait with it.
  Status check_epoch(int64_t epoch) {
    const int64_t end = (epoch + 1) * n_;
    if (last_) {
      const auto all = last_->ids.flat<int64_t>();
      const int64_t before = std::clamp<int64_t>(end - last_->position, 0, static_cast<int64_t>(all.size()));
      CAPSTAN_RETURN_IF_ERROR(counts_.add_ids(last_->position, all.first(static_cast<size_t>(before)), counted_));
    }
    counted_ = end;
    return counts_.check_epoch(epoch);
  }

 private:
  Status fold() {
    if (!last_) return Status::Ok();
    Status added = counts_.add_ids(last_->position, last_->ids.flat<int64_t>(), counted_);
    last_.reset();
    return added;
  }
  struct Last {
    int64_t step = 0, position = 0;
    Tensor ids;
  };
  const int64_t n_;
  ExampleCounts counts_;
  std::optional<Last> last_;
  int64_t counted_ = 0;  // positions before it are in checked epochs
};

int run_replica(const Flags& flags, const std::string& train_path, const std::string& test_path) {
  const bool chief = flags.rank == 0;
  const std::string who = "census rank " + std::to_string(flags.rank);
  auto failed = [&](const std::string& what, const Status& status) {
    std::fprintf(stderr, "\n%s: %s: %s\n", who.c_str(), what.c_str(), status.to_string().c_str());
    return 1;
  };
  capstan::ClientOptions options;
  options.client_name = "census-rank-" + std::to_string(flags.rank);
  auto connected = capstan::examples::connect_cluster(flags.coordinator, 0, options, fail);
  if (connected == nullptr) return 1;
  capstan::ClusterCoordinator& cluster = *connected;
  capstan::CollectiveOptions collective;
  collective.timeout = std::chrono::seconds(60);
  auto joined = cluster.join_group(flags.group, flags.replicas, flags.rank, "127.0.0.1", collective);
  if (!joined.ok()) return failed("joining group '" + flags.group + "'", joined.status());
  std::unique_ptr<capstan::Communicator> group = std::move(*joined);

  // Rank 0's initial values become every replica's (with --seed, all draw the same).
  const uint64_t seed = flags.seed.value_or(std::random_device{}());
  const bool torch = flags.model == "torch";
  const int64_t local_batch = std::max<int64_t>(1, flags.batch_size / flags.replicas);
  const int64_t global_batch = local_batch * flags.replicas;
  const int64_t steps_per_epoch = (kTrainingExamples + global_batch - 1) / global_batch;
  ReplicaModel model(flags, cluster, seed, flags.epochs * steps_per_epoch);
  Status started = model.start(*group);
  if (!started.ok()) return failed(torch ? "building the LibTorch model" : "creating the mirrored variables", started);
  const Predict predict = [&](const Element& batch) { return model.predict(batch); };

  capstan::FunctionRegistry functions;
  census::register_pipeline_functions(functions);
  // Without --dispatcher: exactly-once input. Every process holds
  // adult.data's examples (with their ids); each step's global batch is
  // split among the ranks at the group's input position, which the
  // variables carry, so a failed step's examples are read again by the next
  // one and a restarted process reads on from where the group is. With
  // --dispatcher the replicas read batches from one data-service job
  // (whichever replica asks next gets the next batch).
  const bool exactly_once = flags.dispatcher.empty();
  std::unique_ptr<capstan::MirroredInput> input;
  std::unique_ptr<data::Iterator> served;
  if (exactly_once) {
    capstan::StepInputOptions step_input;
    step_input.global_batch = global_batch;
    step_input.seed = seed;
    auto read = capstan::MirroredInput::read(census::examples(train_path, 1, 0).enumerate(), step_input, &functions);
    if (!read.ok()) return failed("reading the step input", read.status());
    input = std::move(*read);
  } else {
    auto pipeline = training_input(flags, census::training_batches(train_path, local_batch, flags.seed), options,
                                   flags.group, chief);
    if (!pipeline.ok()) return failed("reading through the data service", pipeline.status());
    auto iterator = pipeline->make_iterator(&functions);
    if (!iterator.ok()) return failed("starting the input pipeline", iterator.status());
    served = std::move(*iterator);
  }
  capstan::MirroredVariables& vars = model.variables();
  // Where the run is: the step input's position, or (data service) the
  // examples of the steps applied.
  auto position = [&] { return exactly_once ? vars.input_position() : vars.step() * global_batch; };
  if (chief) {
    std::printf("census: Wide & Deep in %s, %s mode: %d replicas (processes) in collective group '%s' "
                "(generation %lld); %s; %lld epochs of %lld steps of %lld examples (%s)\n",
                torch ? "LibTorch" : "Eigen", flags.mode.c_str(), flags.replicas, flags.group.c_str(),
                static_cast<long long>(group->generation()),
                flags.mode == "hybrid" ? "wide table and embeddings on the parameter servers, the MLP mirrored"
                                       : "every variable mirrored",
                static_cast<long long>(flags.epochs), static_cast<long long>(steps_per_epoch),
                static_cast<long long>(global_batch),
                exactly_once ? "exactly-once step input: each step's examples split among the ranks"
                             : (std::to_string(local_batch) + " per replica through the data service").c_str());
    std::string addresses;
    for (const auto& a : group->addresses()) addresses += (addresses.empty() ? "" : ", ") + a;
    std::printf("census: collective data addresses by rank: %s\n", addresses.c_str());
    std::fflush(stdout);
  }
  if (vars.step() > 0) {
    // Restarted (by hand, systemd, Kubernetes): the group's state, and its input position.
    std::printf("%s: rejoined group '%s' (generation %lld) at step %lld, input position %lld\n", who.c_str(),
                flags.group.c_str(), static_cast<long long>(group->generation()), static_cast<long long>(vars.step()),
                static_cast<long long>(vars.input_position()));
    std::fflush(stdout);
  }
  // Rank 0 writes the TensorBoard events (the others' --logdir is ignored).
  std::unique_ptr<capstan::SummaryWriter> summaries;
  if (chief) {
    auto opened = capstan::examples::open_summaries(flags.logdir, "census");
    if (!opened.ok()) return failed("writing TensorBoard events", opened.status());
    summaries = std::move(*opened);
  }
  Progress progress(flags.epochs, steps_per_epoch, flags.log_every, summaries.get());
  StepIds ids(kTrainingExamples);
  // An epoch rank 0 saw from its start is counted (a restarted rank 0
  // cannot vouch for the epoch it rejoined in).
  const int64_t first_counted_epoch = position() % kTrainingExamples == 0 ? position() / kTrainingExamples
                                                                          : position() / kTrainingExamples + 1;
  // A rank lost (killed, stopped, its host gone): the survivors form the
  // group's next generation with its restarted process (join_group waits
  // for it) and go on from the state of the member with the fewest steps.
  int failed_in_a_row = 0;
  auto recover = [&](const Status& why) -> Status {
    if (why.code() != capstan::StatusCode::kUnavailable && why.code() != capstan::StatusCode::kAborted) return why;
    if (++failed_in_a_row > 10) return why.with_context("10 failed steps in a row");
    std::printf("\n%s: %s; re-forming group '%s'\n", who.c_str(), why.to_string().c_str(), flags.group.c_str());
    std::fflush(stdout);
    CAPSTAN_ASSIGN_OR_RETURN(auto next, cluster.join_group(flags.group, flags.replicas, flags.rank, "127.0.0.1",
                                                           collective));
    CAPSTAN_RETURN_IF_ERROR(model.move_to(*next));
    group = std::move(next);  // the variables moved to it
    ids.rolled_back_to(vars.step());
    std::printf("%s: group '%s' generation %lld: from step %lld, input position %lld\n", who.c_str(),
                flags.group.c_str(), static_cast<long long>(group->generation()), static_cast<long long>(vars.step()),
                static_cast<long long>(vars.input_position()));
    std::fflush(stdout);
    return Status::Ok();
  };
  Metrics metrics;
  double train_seconds = 0;
  int64_t trained = 0;
  for (int64_t epoch = position() / kTrainingExamples + 1; epoch <= flags.epochs; ++epoch) {
    progress.start_epoch(epoch);
    while (position() < epoch * kTrainingExamples) {
      capstan::PhaseRecorder recorder;  // where this step's time goes
      std::optional<Element> batch;
      Tensor step_ids;
      int64_t first = position();
      if (exactly_once) {
        auto share = input->next(*group, vars);
        if (!share.ok()) return failed("reading the step's input", share.status());
        // Rank 0 learns every rank's example ids (the step's, in position order).
        auto all = group->all_gather(share->components.at(0));
        if (!all.ok()) {
          Status recovered = recover(all.status());
          if (!recovered.ok()) return failed("gathering the step's example ids", recovered);
          continue;
        }
        step_ids = std::move(*all);
        share->components.erase(share->components.begin());
        share->names.clear();
        batch = std::move(*share);
      } else {
        auto next = served->get_next();
        if (!next.ok()) return failed("reading a batch", next.status());
        if (!next->has_value()) return failed("reading a batch", Status::OutOfRange("the repeated pipeline ended"));
        batch = std::move(**next);
      }
      auto step = model.train_step(*batch);
      if (!step.ok()) {
        Status recovered = recover(step.status());
        if (!recovered.ok()) return failed("step " + std::to_string(vars.step() + 1), recovered);
        continue;
      }
      failed_in_a_row = 0;
      if (chief && exactly_once) {
        Status kept = ids.applied(vars.step(), first, step_ids);
        if (!kept.ok()) return failed("counting the step's examples", kept);
      }
      // Rank 0 shows its own batches' loss and accuracy, times the replicas.
      if (chief) {
        progress.add_phases(recorder.stop());
        Status shown = progress.step_done(step->loss, step->correct * flags.replicas, step->n * flags.replicas);
        if (!shown.ok()) return failed("writing TensorBoard events", shown);
      }
    }
    progress.end_epoch();
    train_seconds += progress.seconds();
    trained += progress.examples();
    if (chief) {
      if (exactly_once && epoch - 1 >= first_counted_epoch) {
        Status exact = ids.check_epoch(epoch - 1);
        if (!exact.ok()) return failed("epoch " + std::to_string(epoch) + "'s examples", exact);
        std::printf("census: epoch %lld trained on every example exactly once (%lld ids)\n",
                    static_cast<long long>(epoch), static_cast<long long>(kTrainingExamples));
      }
      auto evaluated = replica_evaluate(test_path, functions, predict);
      if (!evaluated.ok()) return failed("evaluating on " + test_path, evaluated.status());
      metrics = *evaluated;
      Status shown = print_epoch_metrics(epoch, flags.epochs, metrics, summaries.get(), epoch * steps_per_epoch);
      if (!shown.ok()) return failed("writing TensorBoard events", shown);
    }
  }
  Status same = vars.verify_replicas();
  if (!same.ok()) return failed("checking the replicas", same);
  std::string saved;
  if (!flags.checkpoint_dir.empty()) {
    // The parameter servers' format: restorable into --mode ps, and back.
    auto path = vars.save_checkpoint(cluster, flags.checkpoint_dir, vars.step(), /*max_to_keep=*/3);
    if (!path.ok()) return failed("saving a checkpoint", path.status());
    saved = *path;
  }
  if (!chief) return 0;
  if (!saved.empty()) {
    std::printf("census: saved checkpoint %s (inspect: capstanctl checkpoint inspect %s)\n", saved.c_str(), saved.c_str());
  }
  std::printf("census: the %d replicas' mirrored variables are identical after %lld steps (checksum %016llx)\n",
              flags.replicas, static_cast<long long>(vars.step()),
              static_cast<unsigned long long>(vars.checksum()));
  return report(flags, metrics, trained, train_seconds) ? 0 : 1;
}

// torchrun-style: starts replicas 1..N-1 as processes of this program (the
// same arguments plus --rank and --group) and runs rank 0 here.
int launch_replicas(int argc, char** argv, Flags flags, const std::string& train_path, const std::string& test_path) {
  flags.group = run_job_name("census-" + flags.mode);
  std::vector<pid_t> children;
  for (int r = 1; r < flags.replicas; ++r) {
    std::vector<std::string> args(argv, argv + argc);
    for (const char* extra : {"--rank", "", "--group", ""}) args.emplace_back(extra);
    args[args.size() - 3] = std::to_string(r);
    args[args.size() - 1] = flags.group;
    std::fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("census: fork");
      return 1;
    }
    if (pid == 0) {
      std::vector<char*> c_args;
      for (auto& a : args) c_args.push_back(a.data());
      c_args.push_back(nullptr);
      execv("/proc/self/exe", c_args.data());
      std::perror("census: exec");
      _exit(127);
    }
    children.push_back(pid);
  }
  flags.rank = 0;
  int status = run_replica(flags, train_path, test_path);
  for (size_t i = 0; i < children.size(); ++i) {
    int child = 0;
    waitpid(children[i], &child, 0);
    if (!WIFEXITED(child) || WEXITSTATUS(child) != 0) {
      std::fprintf(stderr, "census: replica %zu failed (status %d)\n", i + 1, child);
      if (status == 0) status = 1;
    }
  }
  return status;
}

// ---- Strategy modes: the worker-servers are the replicas --------------------------

// The LibTorch model's wide (Adagrad) rate in the strategy modes unless
// --wide-learning-rate says otherwise. Measured with the demo (5 epochs,
// 2 workers, --seed 3, 1 run each; strategy / strategy-hybrid final test
// accuracy, log-loss): 0.02 85.44% 0.3138 / 85.41% 0.3117; 0.05 (the
// other modes' default) 85.47-85.79% 0.311 / 85.49-85.84% 0.307 over
// seeds 1-3; 0.1 85.82% 0.3058 / 86.11% 0.3023; 0.2 86.11% 0.3018 /
// 85.97% 0.3003; 0.4 85.54% 0.3031 / 86.11% 0.3009. At 0.05 the wide part
// is still learning after 5 epochs and the final accuracy straddles
// 85.5%.
constexpr double kStrategyTorchWideLearningRate = 0.2;

int run_strategy(const Flags& flags, const std::string& train_path, const std::string& test_path) {
  const bool hybrid = flags.mode == "strategy-hybrid";
  capstan::ClientOptions options;
  options.client_name = "census";
  auto connected = capstan::examples::connect_cluster(flags.coordinator, flags.min_workers, options, fail);
  if (connected == nullptr) return 1;
  capstan::ClusterCoordinator& cluster = *connected;
  const uint64_t seed = flags.seed.value_or(std::random_device{}());
  const bool torch = flags.model == "torch";
  // --model torch: the module's parameters (the plugin makes their specs,
  // and with strategy-hybrid creates the tables). --model eigen: model.h's.
  std::vector<capstan::MirroredVariableSpec> mirrored;
  // A table's updates come from however many workers each step runs on:
  // constant rates (--lr-decay does not apply).
  if (torch) {
    census::Optimizers rates = optimizers(flags, /*updates=*/0);
    if (!flags.wide_learning_rate_given) rates.wide = capstan::Optimizer::adagrad(kStrategyTorchWideLearningRate);
    census::TorchReplicaOptions torch_options{hybrid, rates, rates, seed};
    auto specs = census::torch_strategy_variables(cluster, torch_options);
    if (!specs.ok()) return fail("creating the LibTorch model's variables", specs.status());
    mirrored = std::move(*specs);
  } else {
    Layout variables = layout(flags, seed, hybrid, optimizers(flags, /*updates=*/0), /*mirrored_updates=*/0);
    Status created = create_on_parameter_servers(cluster, variables.on_parameter_servers);
    if (!created.ok()) return fail("creating the tables", created);
    mirrored = variables.mirrored;
  }
  const std::string step_closure = torch ? "census_torch_sync_step" : "census_sync_step";
  const std::string evaluate_closure = torch ? "census_torch_sync_evaluate" : "census_sync_evaluate";
  capstan::StrategyOptions strategy_options;
  // One name per model: a cluster that ran one keeps its variables.
  strategy_options.name = "census-" + flags.mode + (torch ? "-torch" : "");
  strategy_options.min_replicas = flags.min_workers;
  strategy_options.collective.timeout = std::chrono::milliseconds(flags.collective_timeout_ms);
  auto strategy = capstan::MirroredStrategy::create(cluster, mirrored, strategy_options);
  if (!strategy.ok()) return fail("creating the strategy", strategy.status());

  const int64_t local_batch = std::max<int64_t>(1, flags.batch_size / flags.min_workers);
  const int64_t global_batch = local_batch * flags.min_workers;
  // Without a data service: exactly-once input. Every worker holds the
  // examples (with their ids, counted below); each step splits the next
  // global batch among the live replicas, and a failed step's examples go
  // to the next. With --dispatcher: each worker reads its shard through the
  // data service, a batch per replica a step (TF's distributed dataset).
  const bool exactly_once = flags.dispatcher.empty();
  capstan::Result<capstan::PerWorkerDataset> input = capstan::Status::Unknown("not made");
  capstan::StepInputOptions step_input;
  step_input.global_batch = global_batch;
  step_input.seed = seed;
  if (exactly_once) {
    input = (*strategy)->distribute_step_input(census::examples(train_path, 1, 0).enumerate(), step_input);
    if (!input.ok()) return fail("distributing the step input", input.status());
  } else {
    auto pipeline = training_input(flags, census::training_batches(train_path, local_batch, flags.seed), options,
                                   run_job_name("census-" + flags.mode), /*say=*/true);
    if (!pipeline.ok()) return fail("reading through the data service", pipeline.status());
    input = (*strategy)->distribute_dataset(*pipeline);
    if (!input.ok()) return fail("distributing the input pipeline", input.status());
  }
  const int64_t hybrid_flag = hybrid ? 1 : 0;
  const int64_t steps_per_epoch = (kTrainingExamples + global_batch - 1) / global_batch;
  std::printf("census: Wide & Deep in %s, %s mode: the worker-servers are the replicas (MirroredStrategy '%s', at "
              "least %d); %s; %lld epochs of %lld steps of %lld examples (%s)\n",
              torch ? "LibTorch" : "Eigen", flags.mode.c_str(), strategy_options.name.c_str(), flags.min_workers,
              hybrid ? "wide table and embeddings on the parameter servers, the MLP mirrored"
                     : "every variable mirrored",
              static_cast<long long>(flags.epochs), static_cast<long long>(steps_per_epoch),
              static_cast<long long>(global_batch),
              exactly_once ? "exactly-once step input: the global batch split among the live replicas"
                           : (std::to_string(local_batch) + " per replica").c_str());
  std::fflush(stdout);
  auto summaries = capstan::examples::open_summaries(flags.logdir, "census");
  if (!summaries.ok()) return fail("writing TensorBoard events", summaries.status());

  Progress progress(flags.epochs, steps_per_epoch, flags.log_every, summaries->get());
  progress.report_to(&cluster);
  Element step_args{{input->arg(), Tensor::scalar<int64_t>(hybrid_flag)}, {}};
  Metrics metrics;
  double train_seconds = 0;
  int64_t trained = 0, lost_steps = 0;
  ExampleCounts counts(kTrainingExamples);
  // --step-log: a line per step run, for bench/sync_failure_bench:
  // "<unix ms> ok|failed <input position> <replicas>".
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> step_log(nullptr, &std::fclose);
  if (!flags.step_log.empty()) {
    step_log.reset(std::fopen(flags.step_log.c_str(), "w"));
    if (step_log == nullptr) return fail("opening --step-log " + flags.step_log, Status::Unavailable(std::strerror(errno)));
  }
  auto log_step = [&](bool ok, int64_t at, size_t replicas) {
    if (step_log == nullptr) return;
    const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::system_clock::now().time_since_epoch());
    std::fprintf(step_log.get(), "%lld %s %lld %zu\n", static_cast<long long>(now.count()), ok ? "ok" : "failed",
                 static_cast<long long>(at), replicas);
    std::fflush(step_log.get());
  };
  int64_t position = 0;  // of the step input: epoch e ends at e * kTrainingExamples
  int64_t failed_in_a_row = 0;
  for (int64_t epoch = 1; epoch <= flags.epochs; ++epoch) {
    progress.start_epoch(epoch);
    for (int64_t s = 0; exactly_once ? position < epoch * kTrainingExamples : s < steps_per_epoch; ++s) {
      auto per_replica = (*strategy)->run(step_closure, step_args);
      log_step(per_replica.ok(), per_replica.ok() ? per_replica->input_position : position,
               per_replica.ok() ? per_replica->values.size() : 0);
      // A worker was lost: the next step goes on with the others (with the
      // step input, from the failed step's examples).
      if (per_replica.status().code() == capstan::StatusCode::kUnavailable &&
          (exactly_once ? ++failed_in_a_row <= 10 : ++lost_steps <= 10)) {
        std::printf("\ncensus: %s\n", per_replica.status().to_string().c_str());
        std::fflush(stdout);
        continue;
      }
      if (!per_replica.ok()) return fail("a step of epoch " + std::to_string(epoch), per_replica.status());
      failed_in_a_row = 0;
      if (exactly_once) {
        const int64_t start = per_replica->input_position - global_batch;
        if (start > position) {
          // A step that failed (a worker lost after its all-reduce) had its
          // update kept by the group: its positions are consumed, and its
          // examples were trained on by every replica of that step.
          std::printf("census: the failed step's update was kept (positions [%lld, %lld)): its examples count\n",
                      static_cast<long long>(position), static_cast<long long>(start));
          std::vector<int64_t> kept = capstan::step_input_indices(kTrainingExamples, step_input, position, start - position);
          Status counted = counts.add_ids(position, kept);
          if (!counted.ok()) return fail("counting the failed step's examples", counted);
        }
        position = per_replica->input_position;
        Status counted = counts.add(*per_replica, global_batch);
        if (!counted.ok()) return fail("counting the step's examples", counted);
      }
      double loss = 0;
      int64_t correct = 0, examples = 0;
      for (const auto& v : per_replica->values) {
        loss += v.components.at(0).flat<float>()[0];
        correct += v.components.at(1).flat<int64_t>()[0];
        examples += v.components.at(2).flat<int64_t>()[0];
      }
      Status shown = progress.step_done(loss / static_cast<double>(per_replica->values.size()), correct, examples);
      if (!shown.ok()) return fail("writing TensorBoard events", shown);
    }
    progress.end_epoch();
    train_seconds += progress.seconds();
    trained += progress.examples();
    if (exactly_once) {
      // Every example of this epoch's positions, each exactly once.
      Status exact = counts.check_epoch(epoch - 1);
      if (!exact.ok()) return fail("epoch " + std::to_string(epoch) + "'s examples", exact);
      std::printf("census: epoch %lld trained on every example exactly once (%lld ids)\n",
                  static_cast<long long>(epoch), static_cast<long long>(kTrainingExamples));
    }
    // Each replica evaluates its shard of adult.test with its variables.
    const Element evaluate_args{{*Tensor::from_strings({test_path}, {}), Tensor::scalar<int64_t>(hybrid_flag)}, {}};
    auto evaluated = (*strategy)->run(evaluate_closure, evaluate_args);
    // A worker lost during the evaluation: evaluate again with the others.
    for (int again = 0; again < 10 && evaluated.status().code() == capstan::StatusCode::kUnavailable; ++again) {
      std::printf("\ncensus: %s; evaluating again\n", evaluated.status().to_string().c_str());
      evaluated = (*strategy)->run(evaluate_closure, evaluate_args);
    }
    if (!evaluated.ok()) return fail("evaluating on " + test_path, evaluated.status());
    std::vector<float> probabilities, labels;
    for (const auto& v : evaluated->values) {
      auto p = v.components.at(0).flat<float>();
      auto y = v.components.at(1).flat<float>();
      probabilities.insert(probabilities.end(), p.begin(), p.end());
      labels.insert(labels.end(), y.begin(), y.end());
    }
    if (labels.empty()) return fail("evaluating on " + test_path, Status::DataLoss("no examples"));
    metrics = metrics_of(probabilities, labels);
    Status shown = print_epoch_metrics(epoch, flags.epochs, metrics, summaries->get(), epoch * steps_per_epoch);
    if (!shown.ok()) return fail("writing TensorBoard events", shown);
  }
  Status same = (*strategy)->verify_replicas();
  if (!same.ok()) return fail("checking the replicas", same);
  auto replicas = (*strategy)->replicas();
  if (!replicas.ok()) return fail("reading the replicas", replicas.status());
  std::printf("census: the %zu replicas' mirrored variables are identical after %lld steps (checksum %016llx)\n",
              replicas->size(), static_cast<long long>(replicas->front().step),
              static_cast<unsigned long long>(replicas->front().checksum));
  const bool met = report(flags, metrics, trained, train_seconds);
  if (!flags.checkpoint_dir.empty()) {
    auto saved = (*strategy)->save_checkpoint(flags.checkpoint_dir, replicas->front().step, /*max_to_keep=*/3);
    if (!saved.ok()) return fail("saving a checkpoint", saved.status());
    std::printf("census: saved checkpoint %s (inspect: capstanctl checkpoint inspect %s)\n", saved->c_str(),
                saved->c_str());
  }
  return met ? 0 : 1;
}

}  // namespace

// --trace: records the cluster and this program from `after` seconds past
// start() on, on a thread of its own; the program waits for it before it
// exits. ps mode starts the clock once its first step is done, so the
// window holds closures however long connecting, creating the variables and
// the workers' first input took (seconds in a sanitizer build); the other
// modes start it at once.
class TraceRecording {
 public:
  explicit TraceRecording(const Flags& flags) : flags_(flags) {}
  TraceRecording(const TraceRecording&) = delete;
  TraceRecording& operator=(const TraceRecording&) = delete;

  void start() {
    // The replicas launched in sync and hybrid modes leave it to the launcher.
    if (flags_.trace.empty() || flags_.rank >= 0 || thread_.joinable()) return;
    thread_ = std::thread([flags = flags_]() {
      std::this_thread::sleep_for(std::chrono::duration<double>(flags.trace_after));
      capstan::ClusterTraceOptions options;
      options.seconds = flags.trace_seconds;
      options.this_process = true;
      options.this_process_name = "census";
      options.client.client_name = "census-trace";
      if (!flags.dispatcher.empty()) options.extra_addresses.push_back(flags.dispatcher);
      std::fprintf(stderr, "census: recording a trace of the cluster for %.1f s\n", flags.trace_seconds);
      auto trace = capstan::record_cluster_trace(flags.coordinator, options);
      if (!trace.ok()) {
        std::fprintf(stderr, "census: --trace: %s\n", trace.status().to_string().c_str());
        return;
      }
      if (capstan::Status written = trace->write(flags.trace); !written.ok()) {
        std::fprintf(stderr, "census: --trace: %s\n", written.to_string().c_str());
        return;
      }
      std::fprintf(stderr, "census: trace written to %s: %zu events from %d processes\n", flags.trace.c_str(),
                   trace->events, trace->processes);
      for (const auto& e : trace->errors) std::fprintf(stderr, "census: --trace: no trace from %s\n", e.c_str());
    });
  }
  ~TraceRecording() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  const Flags flags_;
  std::thread thread_;
};

int main(int argc, char** argv) {
  Flags flags = parse_flags(argc, argv);
  if (!flags.trace.empty() && !(flags.trace_seconds > 0 && flags.trace_seconds <= 600)) {
    usage(argv[0], "--trace-seconds must be more than 0 and at most 600");
  }
  TraceRecording trace_recording(flags);
  // Workers and data workers open the files: an absolute path.
  std::error_code error;
  const std::filesystem::path dir = std::filesystem::absolute(flags.data_dir, error);
  const std::string train_path = (dir / "adult.data.gz").string(), test_path = (dir / "adult.test.gz").string();
  for (const auto& path : {train_path, test_path}) {
    if (!std::filesystem::is_regular_file(path)) {
      std::fprintf(stderr, "census: %s is not a file; --data-dir must hold adult.data.gz and adult.test.gz\n",
                   path.c_str());
      return 2;
    }
  }

  if (flags.mode != "ps") trace_recording.start();
  if (flags.mode == "strategy" || flags.mode == "strategy-hybrid") return run_strategy(flags, train_path, test_path);
  if (flags.mode != "ps") {
    return flags.rank < 0 ? launch_replicas(argc, argv, flags, train_path, test_path)
                          : run_replica(flags, train_path, test_path);
  }

  capstan::ClientOptions options;
  options.client_name = "census";
  auto connected = capstan::examples::connect_cluster(flags.coordinator, flags.min_workers, options, fail);
  if (connected == nullptr) return 1;
  capstan::ClusterCoordinator& cluster = *connected;

  const uint64_t seed = flags.seed.value_or(std::random_device{}());
  const bool torch = flags.model == "torch";
  // Each closure updates every variable once.
  const int64_t steps_per_epoch = (kTrainingExamples + flags.batch_size - 1) / flags.batch_size;
  const census::Optimizers ps_optimizers = optimizers(flags, flags.epochs * steps_per_epoch);
  Status created = torch ? census::create_torch_variables(cluster, ps_optimizers, seed)
                         : create_on_parameter_servers(cluster, model_variables(ps_optimizers, seed));
  if (!created.ok()) return fail("creating the variables", created);

  // One job per run: every training worker reads its batches from it.
  auto pipeline = training_input(flags, census::training_batches(train_path, flags.batch_size, flags.seed), options,
                                 run_job_name("census-train"), /*say=*/true);
  if (!pipeline.ok()) return fail("reading through the data service", pipeline.status());
  auto dataset = cluster.create_per_worker_dataset(*pipeline);
  if (!dataset.ok()) return fail("creating the per-worker dataset", dataset.status());

  std::printf("census: Wide & Deep (wide: %lld ids; deep: %d embedded columns x %d + %d numeric -> 100-75-50-25) "
              "in %s, %s mode, %d worker(s), %lld epochs of %lld steps of %lld examples\n",
              static_cast<long long>(census::wide_rows()), census::kDeepFields, census::kEmbeddingDim,
              census::kNumeric, torch ? "LibTorch" : "Eigen", flags.mode.c_str(), cluster.num_workers(), static_cast<long long>(flags.epochs),
              static_cast<long long>(steps_per_epoch), static_cast<long long>(flags.batch_size));
  std::fflush(stdout);
  auto summaries = capstan::examples::open_summaries(flags.logdir, "census");
  if (!summaries.ok()) return fail("writing TensorBoard events", summaries.status());

  Progress progress(flags.epochs, steps_per_epoch, flags.log_every, summaries->get());
  progress.report_to(&cluster);
  Element step_args{{dataset->arg()}, {}};
  Metrics metrics;
  double train_seconds = 0;
  int64_t trained = 0;
  for (int64_t epoch = 1; epoch <= flags.epochs; ++epoch) {
    progress.start_epoch(epoch);
    std::deque<capstan::RemoteValue> in_flight;
    int64_t scheduled = 0, completed = 0;
    while (completed < steps_per_epoch) {
      while (scheduled < steps_per_epoch && in_flight.size() < kInFlight) {
        auto value = cluster.schedule(torch ? "census_torch_train_step" : "census_train_step", step_args);
        if (!value.ok()) return fail("scheduling a step of epoch " + std::to_string(epoch), value.status());
        in_flight.push_back(*value);
        ++scheduled;
      }
      auto result = cluster.fetch(in_flight.front());
      in_flight.pop_front();
      if (!result.ok()) return fail("a step of epoch " + std::to_string(epoch), result.status());
      ++completed;
      trace_recording.start();  // from the first step done (the workers' input is built by then)
      Status shown = progress.step_done(result->components.at(0).flat<float>()[0],
                                        result->components.at(1).flat<int64_t>()[0],
                                        result->components.at(2).flat<int64_t>()[0]);
      if (!shown.ok()) return fail("writing TensorBoard events", shown);
    }
    Status joined = cluster.join();
    progress.end_epoch();
    if (!joined.ok()) return fail("training", joined);
    train_seconds += progress.seconds();
    trained += progress.examples();
    auto evaluated = evaluate(cluster, torch ? "census_torch_evaluate" : "census_evaluate", test_path, flags.eval_shards);
    if (!evaluated.ok()) return fail("evaluating on " + test_path, evaluated.status());
    metrics = *evaluated;
    Status shown = print_epoch_metrics(epoch, flags.epochs, metrics, summaries->get(), epoch * steps_per_epoch);
    if (!shown.ok()) return fail("writing TensorBoard events", shown);
  }

  const bool met = report(flags, metrics, trained, train_seconds);
  if (!flags.checkpoint_dir.empty()) {
    capstan::CheckpointManager manager(cluster, flags.checkpoint_dir, /*max_to_keep=*/3);
    auto saved = manager.save(flags.epochs * steps_per_epoch);
    if (!saved.ok()) return fail("saving a checkpoint", saved.status());
    std::printf("census: saved checkpoint %s (inspect: capstanctl checkpoint inspect %s)\n", saved->c_str(),
                saved->c_str());
  }
  return met ? 0 : 1;
}
