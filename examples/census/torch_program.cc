// The census program's LibTorch part, loaded at run time: the program links
// only libcapstan.so and dlopen()s libcensus_torch_program.so (this file's
// plugin, beside the example modules) when it trains the LibTorch model, so
// it still runs where LibTorch is not installed (the container image), with
// the Eigen model.
#include "census/torch_program.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <string>

namespace census {
namespace {

using CreateVariables = int (*)(capstan::ClusterCoordinator*, const Optimizers*, uint64_t, std::string*);
// Returns a new replica (the caller owns it), or null with `error` set.
using CreateReplica = TorchReplica* (*)(capstan::Communicator*, capstan::ClusterCoordinator*,
                                        const TorchReplicaOptions*, capstan::Status*);

struct Plugin {
  CreateVariables create = nullptr;
  CreateReplica create_replica = nullptr;
  std::string error;  // why it did not load
};

// <dir of this executable>/../lib/libcensus_torch_program.so: build/bin ->
// build/lib, and /opt/capstan/bin -> /opt/capstan/lib once installed.
std::string plugin_path() {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "libcensus_torch_program.so";
  std::string exe(self, static_cast<size_t>(n));
  std::string bin = exe.substr(0, exe.rfind('/'));
  return bin.substr(0, bin.rfind('/')) + "/lib/libcensus_torch_program.so";
}

const Plugin& plugin() {
  static const Plugin loaded = [] {
    Plugin p;
    const std::string path = plugin_path();
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* error = dlerror();
      p.error = error != nullptr ? error : path + ": dlopen failed";
      return p;
    }
    p.create = reinterpret_cast<CreateVariables>(dlsym(handle, "census_create_torch_variables"));
    p.create_replica = reinterpret_cast<CreateReplica>(dlsym(handle, "census_create_torch_replica"));
    if (p.create == nullptr || p.create_replica == nullptr) {
      // A plugin of another build: rebuild census_torch_program beside this program.
      p.create = nullptr;
      p.error = path + " lacks census_create_torch_variables or census_create_torch_replica (a plugin of an "
                       "older build? rebuild the census_torch_program target)";
    }
    return p;
  }();
  return loaded;
}

}  // namespace

bool torch_available() { return plugin().create != nullptr; }
std::string torch_unavailable_reason() { return plugin().error; }

capstan::Status create_torch_variables(capstan::ClusterCoordinator& cluster, const Optimizers& optimizers,
                                       uint64_t seed) {
  if (!torch_available()) {
    return capstan::Status::FailedPrecondition("the LibTorch model is not available: " + plugin().error);
  }
  std::string error;
  if (plugin().create(&cluster, &optimizers, seed, &error) != 0) {
    return capstan::Status::Internal(error);
  }
  return capstan::Status::Ok();
}

capstan::Result<std::unique_ptr<TorchReplica>> create_torch_replica(capstan::Communicator& group,
                                                                    capstan::ClusterCoordinator& cluster,
                                                                    const TorchReplicaOptions& options) {
  if (!torch_available()) {
    return capstan::Status::FailedPrecondition("the LibTorch model is not available: " + plugin().error);
  }
  capstan::Status error;
  std::unique_ptr<TorchReplica> replica(plugin().create_replica(&group, &cluster, &options, &error));
  if (replica == nullptr) return error.ok() ? capstan::Status::Internal("census_create_torch_replica failed") : error;
  return replica;
}

// The strategy modes' entry point, looked up apart from plugin()'s (an
// older plugin without it still serves the other modes).
capstan::Result<std::vector<capstan::MirroredVariableSpec>> torch_strategy_variables(
    capstan::ClusterCoordinator& cluster, const TorchReplicaOptions& options) {
  using StrategyVariables = int (*)(capstan::ClusterCoordinator*, const TorchReplicaOptions*,
                                    std::vector<capstan::MirroredVariableSpec>*, capstan::Status*);
  if (!torch_available()) {
    return capstan::Status::FailedPrecondition("the LibTorch model is not available: " + plugin().error);
  }
  // plugin() loaded it: this only finds the handle.
  void* handle = dlopen(plugin_path().c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  auto variables = handle == nullptr ? nullptr
                                     : reinterpret_cast<StrategyVariables>(
                                           dlsym(handle, "census_torch_strategy_variables"));
  if (variables == nullptr) {
    return capstan::Status::FailedPrecondition(plugin_path() +
                                               " lacks census_torch_strategy_variables (a plugin of an older build? "
                                               "rebuild the census_torch_program target)");
  }
  std::vector<capstan::MirroredVariableSpec> specs;
  capstan::Status error;
  if (variables(&cluster, &options, &specs, &error) != 0) {
    return error.ok() ? capstan::Status::Internal("census_torch_strategy_variables failed") : error;
  }
  return specs;
}

}  // namespace census
