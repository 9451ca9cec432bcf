// FunctionRegistry: the named functions a module provides.
//
// User code that pipelines and closures run is compiled into a *module*, a
// shared library built against the SDK, which registers its functions by name:
//
//   #include <capstan/functions.h>
//   CAPSTAN_MODULE(registry) {
//     registry.register_map("parse_row", [](capstan::Element e) -> capstan::Result<capstan::Element> {
//       ...
//     });
//     registry.register_filter("non_empty", ...);
//   }
//
// Daemons load modules with --module libmodel.so; a program can load one with
// load_module() or register functions directly. The registry is owned and
// passed explicitly; it is the only table of functions in a process.
//
// Thread-safety: register_* and load_module before use; lookups and calls
// may then happen from many threads (functions must be thread-safe).
#ifndef CAPSTAN_FUNCTIONS_H_
#define CAPSTAN_FUNCTIONS_H_

#include "capstan/export.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "capstan/closure.h"
#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan CAPSTAN_API {

namespace data {
class Dataset;
}

using MapFunction = std::function<Result<Element>(Element)>;
using FilterFunction = std::function<Result<bool>(const Element&)>;
// For interleave: one input element -> the dataset to draw from.
using InterleaveFunction = std::function<Result<data::Dataset>(const Element&)>;

// tf.distribute.InputContext: which input pipeline a per-worker dataset
// function builds.
struct InputContext {
  int num_input_pipelines = 1;  // the number of workers
  int input_pipeline_id = 0;    // this worker's index
};
// For ClusterCoordinator::create_per_worker_dataset: the worker's pipeline.
using DatasetFunction = std::function<Result<data::Dataset>(const InputContext&)>;

class FunctionRegistry {
 public:
  FunctionRegistry();
  ~FunctionRegistry();
  FunctionRegistry(const FunctionRegistry&) = delete;
  FunctionRegistry& operator=(const FunctionRegistry&) = delete;

  // Registering a name twice replaces the earlier function.
  void register_map(const std::string& name, MapFunction fn);
  void register_filter(const std::string& name, FilterFunction fn);
  void register_interleave(const std::string& name, InterleaveFunction fn);
  // A closure the coordinator schedules onto workers.
  void register_closure(const std::string& name, ClosureFunction fn);
  // A per-worker dataset function (create_per_worker_dataset by name).
  void register_dataset_function(const std::string& name, DatasetFunction fn);

  // dlopen()s `path` and calls its CAPSTAN_MODULE entry point. The library
  // stays loaded for the registry's lifetime. Errors name the path.
  Status load_module(const std::string& path);

  const MapFunction* find_map(const std::string& name) const;
  const FilterFunction* find_filter(const std::string& name) const;
  const InterleaveFunction* find_interleave(const std::string& name) const;
  const ClosureFunction* find_closure(const std::string& name) const;
  const DatasetFunction* find_dataset_function(const std::string& name) const;
  // Names of the registered closures, sorted.
  std::vector<std::string> closure_names() const;
  // Every registered name, sorted ("closure:train_step", "map:parse_row", ...).
  std::vector<std::string> names() const;

 private:
  std::map<std::string, MapFunction> maps_;
  std::map<std::string, FilterFunction> filters_;
  std::map<std::string, InterleaveFunction> interleaves_;
  std::map<std::string, ClosureFunction> closures_;
  std::map<std::string, DatasetFunction> dataset_functions_;
  std::vector<std::shared_ptr<void>> libraries_;  // dlclose()d last
};

}  // namespace capstan

// Defines a module's entry point; see FunctionRegistry.
#define CAPSTAN_MODULE(registry_name)                                                  \
  extern "C" CAPSTAN_API void capstan_module_register(::capstan::FunctionRegistry& registry_name); \
  extern "C" CAPSTAN_API void capstan_module_register(::capstan::FunctionRegistry& registry_name)

#endif  // CAPSTAN_FUNCTIONS_H_
