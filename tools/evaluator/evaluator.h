// The evaluator sidecar's core (TF's side-car evaluation): a closure of the
// loaded modules run against a checkpoint held in this process's memory, no
// parameter server needed, and the metrics of its results.
//
// The closure sees a ClosureContext whose read/gather answer from the
// checkpoint (variables loaded on first use; updates are FailedPrecondition:
// evaluation never trains) and, when a dataset function is given, whose
// iterator() is that dataset's (InputContext 1 pipeline, index 0) whatever
// the argument. It is called `steps` times, or with a dataset until it
// returns OutOfRange. Metrics from its results, summed over the calls:
//   - components named "probabilities" and "labels" (a binary classifier's
//     predictions): accuracy (threshold 0.5), auc (ROC, ties averaged),
//     log_loss and examples;
//   - every other numeric scalar component: its sum, under its name (or
//     "value_<i>" when unnamed).
//
// Example:
//   EvaluatorOptions options;
//   options.closure = "census_evaluate";
//   options.args = Element{{Tensor::string_scalar("adult.test.gz"), ...}, {}};
//   auto metrics = evaluate_checkpoint(functions, "/ckpt/ckpt-1000", options);
//
// Thread-safety: evaluate_checkpoint may run on any thread; the registry is
// only read.
#ifndef CAPSTAN_TOOLS_EVALUATOR_EVALUATOR_H_
#define CAPSTAN_TOOLS_EVALUATOR_EVALUATOR_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "capstan/functions.h"
#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan::evaluator {

struct EvaluatorOptions {
  std::string closure;           // an evaluation closure of the modules
  Element args;                  // its arguments, the same for each call
  std::string dataset_function;  // "": no dataset
  int64_t steps = 1;             // calls; with a dataset, at most this many (0: until the end)
};

struct Metrics {
  std::string checkpoint;  // the path evaluated
  int64_t step = 0;        // the checkpoint's step
  std::vector<std::pair<std::string, double>> values;  // in a stable order
  int64_t calls = 0;
};

Result<Metrics> evaluate_checkpoint(const FunctionRegistry& functions, const std::string& checkpoint_path,
                                    const EvaluatorOptions& options);

// One line of JSON: {"checkpoint":..., "step":..., "<metric>":...}.
std::string metrics_json(const Metrics& metrics);

}  // namespace capstan::evaluator

#endif  // CAPSTAN_TOOLS_EVALUATOR_EVALUATOR_H_
