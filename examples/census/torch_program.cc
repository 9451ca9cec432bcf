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

using CreateVariables = int (*)(capstan::ClusterCoordinator*, double, double, uint64_t, std::string*);

struct Plugin {
  CreateVariables create = nullptr;
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
    if (p.create == nullptr) p.error = path + " has no census_create_torch_variables";
    return p;
  }();
  return loaded;
}

}  // namespace

bool torch_available() { return plugin().create != nullptr; }
std::string torch_unavailable_reason() { return plugin().error; }

capstan::Status create_torch_variables(capstan::ClusterCoordinator& cluster, double wide_learning_rate,
                                       double deep_learning_rate, uint64_t seed) {
  if (!torch_available()) {
    return capstan::Status::FailedPrecondition("the LibTorch model is not available: " + plugin().error);
  }
  std::string error;
  if (plugin().create(&cluster, wide_learning_rate, deep_learning_rate, seed, &error) != 0) {
    return capstan::Status::Internal(error);
  }
  return capstan::Status::Ok();
}

}  // namespace census
