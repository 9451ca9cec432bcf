// What fit's tests share (torch/src/fit_test.cc, fit_cluster_test.cc and
// fit_multi_client_test.cc): the data they train on, where they write, and a
// callback that interrupts a fit.
#ifndef CAPSTAN_TORCH_TESTS_FIT_TEST_UTIL_H_
#define CAPSTAN_TORCH_TESTS_FIT_TEST_UTIL_H_

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan/fit.h"

namespace capstan::torch::testing {

// n examples of 4 N(0, 1) features, labelled by a linear rule
// (x0 + 2 x1 - x2 + 0.5 x3 > 0): separable, so a model that learns it
// classifies nearly all of them right; chance is about one half.
inline data::Dataset examples(int64_t n, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n) * 4), y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float* row = &x[static_cast<size_t>(i) * 4];
    for (int j = 0; j < 4; ++j) row[j] = normal(random);
    y[static_cast<size_t>(i)] = row[0] + 2 * row[1] - row[2] + 0.5f * row[3] > 0 ? 1.0f : 0.0f;
  }
  return data::Dataset::from_tensor_slices(
      Element{{Tensor::from_vector(x, {n, 4}).value(), Tensor::from_vector(y, {n, 1}).value()}, {"x", "y"}});
}

// A path under the system temp dir for `name`, this process's, emptied
// (the fit or checkpoint under test creates it).
inline std::string temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("capstan-fit-" + name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

// Ends fit with an error at the end of epoch `at` (a crash of the program).
struct Interrupt : Callback {
  int at;
  explicit Interrupt(int at) : at(at) {}
  Status on_epoch_end(int epoch, const Logs&, FitState&) override {
    return epoch == at ? Status::Aborted("interrupted in epoch " + std::to_string(epoch)) : Status::Ok();
  }
};

}  // namespace capstan::torch::testing

#endif  // CAPSTAN_TORCH_TESTS_FIT_TEST_UTIL_H_
