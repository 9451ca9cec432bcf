// evaluator: TF's side-car evaluator. Watches a checkpoint directory; each
// new checkpoint is loaded into this process's memory (no parameter server
// involved) and an evaluation closure of the modules runs against it; the
// metrics go to the log (stdout) and, as JSON lines, to --metrics-file.
//
//   evaluator --checkpoint-dir /ckpt --module build/lib/libcensus_module.so
//             --closure census_evaluate --arg string:examples/census/data/adult.test.gz
//             --arg int64:1 --arg int64:0
//
// See tools/evaluator/evaluator.h for what the closure sees and which
// metrics its results give. SIGTERM/SIGINT end it (exit 0) between
// evaluations.
#include <signal.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "tools/evaluator/evaluator.h"

namespace po = boost::program_options;
using capstan::Element;
using capstan::Result;
using capstan::Status;
using capstan::Tensor;

namespace {

std::atomic<bool> stopping{false};

void on_signal(int) { stopping.store(true); }

// "TYPE:VALUE" -> a scalar: string, int64, int32, float32, float64.
Result<Tensor> parse_arg(const std::string& arg) {
  auto colon = arg.find(':');
  if (colon == std::string::npos) {
    return Status::InvalidArgument("--arg '" + arg + "' must be TYPE:VALUE (string, int64, int32, float32, float64)");
  }
  std::string type = arg.substr(0, colon), value = arg.substr(colon + 1);
  try {
    size_t used = 0;
    if (type == "string") return Tensor::from_strings({value}, {});
    if (type == "int64") {
      int64_t v = std::stoll(value, &used);
      if (used == value.size()) return Tensor::scalar<int64_t>(v);
    } else if (type == "int32") {
      int v = std::stoi(value, &used);
      if (used == value.size()) return Tensor::scalar<int32_t>(v);
    } else if (type == "float32") {
      float v = std::stof(value, &used);
      if (used == value.size()) return Tensor::scalar<float>(v);
    } else if (type == "float64") {
      double v = std::stod(value, &used);
      if (used == value.size()) return Tensor::scalar<double>(v);
    } else {
      return Status::InvalidArgument("--arg '" + arg + "': unknown type '" + type +
                                     "' (string, int64, int32, float32, float64)");
    }
  } catch (const std::exception&) {
  }
  return Status::InvalidArgument("--arg '" + arg + "': '" + value + "' is not a " + type);
}

void print(const capstan::evaluator::Metrics& metrics) {
  std::printf("evaluator: %s (step %lld, %lld call(s)):", metrics.checkpoint.c_str(),
              static_cast<long long>(metrics.step), static_cast<long long>(metrics.calls));
  for (const auto& [name, value] : metrics.values) std::printf(" %s=%.6g", name.c_str(), value);
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, closure, dataset_function, metrics_file;
  std::vector<std::string> modules, args;
  int64_t steps = 1, poll_ms = 2000;
  po::options_description options(
      "evaluator: evaluates each new checkpoint of a directory with a closure of the modules, in this process's "
      "memory (TF's side-car evaluator)\n\nOptions");
  options.add_options()("help,h", "this help")
      ("checkpoint-dir", po::value(&dir), "the checkpoint directory to watch (required)")
      ("module", po::value(&modules), "a module (shared library) with the closure; repeat for several (required)")
      ("closure", po::value(&closure), "the evaluation closure (required)")
      ("arg", po::value(&args), "an argument of the closure, TYPE:VALUE (string, int64, int32, float32, float64); "
                                "repeat in order")
      ("dataset-function", po::value(&dataset_function),
       "a dataset function of the modules; the closure reaches its iterator with ctx.iterator() and is called "
       "until it returns OutOfRange (at most --steps when that is positive)")
      ("steps", po::value(&steps)->default_value(1), "calls of the closure per checkpoint (0 with a dataset: to its end)")
      ("metrics-file", po::value(&metrics_file), "append each evaluation's metrics here as a line of JSON")
      ("poll-ms", po::value(&poll_ms)->default_value(2000), "how often the directory is looked at")
      ("once", "evaluate the newest checkpoint and exit (1 when there is none)");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, options), vm);
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << "evaluator: " << e.what() << "\nRun 'evaluator --help' for usage.\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << options << "\n";
    return 0;
  }
  for (const auto& [name, value] : {std::pair<const char*, bool>{"--checkpoint-dir", dir.empty()},
                                    {"--module", modules.empty()},
                                    {"--closure", closure.empty()}}) {
    if (value) {
      std::cerr << "evaluator: " << name << " is required\nRun 'evaluator --help' for usage.\n";
      return 2;
    }
  }
  if (poll_ms < 10 || steps < 0) {
    std::cerr << "evaluator: --poll-ms must be at least 10 and --steps not negative\n";
    return 2;
  }
  capstan::FunctionRegistry functions;
  for (const auto& module : modules) {
    Status loaded = functions.load_module(module);
    if (!loaded.ok()) {
      std::cerr << "evaluator: --module " << module << ": " << loaded.to_string() << "\n";
      return 2;
    }
  }
  capstan::evaluator::EvaluatorOptions evaluation;
  evaluation.closure = closure;
  evaluation.dataset_function = dataset_function;
  evaluation.steps = steps;
  for (const auto& arg : args) {
    auto tensor = parse_arg(arg);
    if (!tensor.ok()) {
      std::cerr << "evaluator: " << tensor.status().message() << "\n";
      return 2;
    }
    evaluation.args.components.push_back(*tensor);
    evaluation.args.names.emplace_back();
  }
  if (functions.find_closure(closure) == nullptr) {
    std::cerr << "evaluator: no closure named '" << closure << "' in the modules\n";
    return 2;
  }
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  const bool once = vm.count("once") > 0;
  std::printf("evaluator: watching %s every %lld ms; closure %s\n", dir.c_str(), static_cast<long long>(poll_ms),
              closure.c_str());
  std::fflush(stdout);
  std::string last;
  int failures = 0;
  while (!stopping.load()) {
    auto newest = capstan::checkpoint::latest_checkpoint(dir);
    if (newest.ok() && *newest != last) {
      last = *newest;
      auto metrics = capstan::evaluator::evaluate_checkpoint(functions, *newest, evaluation);
      if (!metrics.ok()) {
        // A checkpoint deleted by retention meanwhile, a damaged one, a
        // closure error: said, and the next checkpoint is tried.
        ++failures;
        std::fprintf(stderr, "evaluator: %s: %s\n", newest->c_str(), metrics.status().to_string().c_str());
      } else {
        print(*metrics);
        if (!metrics_file.empty()) {
          std::ofstream out(metrics_file, std::ios::app);
          out << capstan::evaluator::metrics_json(*metrics) << "\n";
          if (!out) {
            std::fprintf(stderr, "evaluator: cannot append to --metrics-file %s\n", metrics_file.c_str());
            return 1;
          }
        }
      }
      if (once) return metrics.ok() ? 0 : 1;
    } else if (once) {
      std::fprintf(stderr, "evaluator: no checkpoint in %s: %s\n", dir.c_str(),
                   newest.ok() ? "none new" : newest.status().to_string().c_str());
      return 1;
    }
    for (int64_t waited = 0; waited < poll_ms && !stopping.load(); waited += 10) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  std::printf("evaluator: stopping (%d failed evaluation(s))\n", failures);
  return 0;
}
