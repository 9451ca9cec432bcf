#include "data/step_input.h"

#include <string>
#include <utility>

#include "data/tensor_util.h"

namespace capstan::data {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A uniform draw from [0, bound) (Lemire's multiply-shift with rejection).
uint64_t below(uint64_t& state, uint64_t bound) {
  for (;;) {
    __uint128_t m = static_cast<__uint128_t>(splitmix64(state)) * bound;
    auto low = static_cast<uint64_t>(m);
    if (low >= bound || low >= (0 - bound) % bound) return static_cast<uint64_t>(m >> 64);
  }
}

}  // namespace

Result<std::shared_ptr<const StepInputElements>> StepInputElements::read(data::Iterator& iterator,
                                                                         int64_t budget_bytes) {
  std::shared_ptr<StepInputElements> out(new StepInputElements());
  for (;;) {
    CAPSTAN_ASSIGN_OR_RETURN(std::optional<Element> next, iterator.get_next());
    if (!next.has_value()) break;
    out->bytes_ += static_cast<int64_t>(next->byte_size()) + 64;
    if (out->bytes_ > budget_bytes) {
      return Status::FailedPrecondition(
          "the step input holds its elements in memory and they pass " + std::to_string(budget_bytes >> 20) +
          " MiB after " + std::to_string(out->elements_.size()) +
          " elements: give a finite dataset of examples (no repeat(); steps go on through epochs by themselves) "
          "or raise the worker's step_input_memory_mib");
    }
    out->elements_.push_back(std::move(*next));
  }
  if (out->elements_.empty()) {
    return Status::FailedPrecondition("the step input's dataset has no elements");
  }
  return std::shared_ptr<const StepInputElements>(std::move(out));
}

std::vector<int64_t> StepInputElements::permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  uint64_t state = seed ^ (0x5851f42d4c957f2dull * static_cast<uint64_t>(epoch + 1));
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(below(state, static_cast<uint64_t>(i + 1)));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

std::shared_ptr<const std::vector<int64_t>> StepInputElements::epoch_order(uint64_t seed, int64_t epoch) const {
  const auto key = std::make_pair(seed, epoch);
  {
    MutexLock lock(mutex_);
    auto it = orders_.find(key);
    if (it != orders_.end()) return it->second;
  }
  auto order = std::make_shared<const std::vector<int64_t>>(permutation(size(), seed, epoch));
  MutexLock lock(mutex_);
  if (orders_.size() >= 4) orders_.erase(orders_.begin());  // the oldest epoch
  orders_.emplace(key, order);
  return order;
}

std::vector<int64_t> StepInputElements::indices(int64_t start, int64_t count, uint64_t seed, bool shuffle) const {
  return position_indices(size(), start, count, shuffle, [&](int64_t epoch) { return epoch_order(seed, epoch); });
}

Result<Element> StepInputElements::batch(const training::StepInput& input) const {
  if (input.start < 0 || input.count < 1) {
    return Status::InvalidArgument("step input: positions [" + std::to_string(input.start) + ", +" +
                                   std::to_string(input.count) + ") are not a range of the input");
  }
  std::vector<Element> rows;
  rows.reserve(static_cast<size_t>(input.count));
  for (int64_t i : indices(input.start, input.count, input.seed, input.shuffle)) {
    rows.push_back(elements_[static_cast<size_t>(i)]);
  }
  return data::batch_elements(rows);
}

Result<std::vector<training::StepInput>> step_shares(int64_t position, int64_t global, int64_t replicas,
                                                     uint64_t seed, bool shuffle) {
  if (replicas < 1 || global < replicas) {
    return Status::FailedPrecondition("a global batch of " + std::to_string(global) + " cannot be split among " +
                                      std::to_string(replicas) + " replicas (each needs an example at least)");
  }
  std::vector<training::StepInput> shares(static_cast<size_t>(replicas));
  int64_t start = position;
  for (int64_t r = 0; r < replicas; ++r) {
    training::StepInput& share = shares[static_cast<size_t>(r)];
    share.count = global / replicas + (r < global % replicas ? 1 : 0);
    share.start = start;
    share.first = position;
    share.end = position + global;
    share.seed = seed;
    share.shuffle = shuffle;
    share.weight = static_cast<double>(share.count) * static_cast<double>(replicas) / static_cast<double>(global);
    start += share.count;
  }
  return shares;
}

}  // namespace capstan::data
