// A step input (exactly-once input for synchronous steps, see
// "Exactly-once input" in docs/design.md): the elements of a finite,
// deterministic dataset read once into memory, and the batch of any
// positions of the input's global order. A worker-server holds one per
// strategy input; a multi-client process holds one in its MirroredInput.
//
// Position p of the global order is element perm(seed, p / N)[p % N] of the
// N elements: each epoch (N positions) visits every element once, in a
// permutation drawn from the seed and the epoch (the dataset's own order
// without shuffle). Each replica of a step takes a range of positions
// (step_shares: the coordinator hands them out, or each process computes
// its own); the replica needs no state of its own to read them, so one
// that (re)joins reads on from wherever the group is.
//
//   auto elements = StepInputElements::read(*iterator, budget).value();
//   Element batch = elements->batch({.start = 96, .count = 32, .seed = 7}).value();
//
// Thread-safe (const; the permutations are cached under a mutex).
#ifndef CAPSTAN_LIB_DATA_STEP_INPUT_H_
#define CAPSTAN_LIB_DATA_STEP_INPUT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan/status.h"
#include "capstan/tensor.h"
#include "sync/mutex.h"
#include "types/replica.h"

namespace capstan::data {

class StepInputElements {
 public:
  // Every element of `iterator`, which must end: FailedPrecondition when
  // they take more than `budget_bytes` (an endless dataset, or one too
  // large to hold: the input must be a finite dataset of examples, without
  // repeat()), or when there are none. An element's error fails the read.
  static Result<std::shared_ptr<const StepInputElements>> read(data::Iterator& iterator, int64_t budget_bytes);

  int64_t size() const { return static_cast<int64_t>(elements_.size()); }
  int64_t bytes() const { return bytes_; }

  // The element indices of positions [start, start + count).
  std::vector<int64_t> indices(int64_t start, int64_t count, uint64_t seed, bool shuffle) const;
  // Those elements stacked into one batch (each component gains a leading
  // dimension of `count`). InvalidArgument for a negative range or
  // elements whose components differ in dtype or shape.
  Result<Element> batch(const training::StepInput& input) const;

  // Epoch `epoch`'s permutation of [0, n), the same on every machine
  // (Fisher-Yates over SplitMix64, not the standard library's shuffle).
  static std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch);

 private:
  StepInputElements() = default;
  std::shared_ptr<const std::vector<int64_t>> epoch_order(uint64_t seed, int64_t epoch) const;

  std::vector<Element> elements_;
  int64_t bytes_ = 0;
  mutable Mutex mutex_;
  // The last permutations made, by (seed, epoch): a step reads at most two.
  mutable std::map<std::pair<uint64_t, int64_t>, std::shared_ptr<const std::vector<int64_t>>> orders_
      GUARDED_BY(mutex_);
};

// The element indices of positions [start, start + count) of an input of
// `n` elements: position p is order(p / n)[p % n] with `shuffle` (order:
// epoch -> shared_ptr to its permutation), else p % n.
template <typename OrderOf>
std::vector<int64_t> position_indices(int64_t n, int64_t start, int64_t count, bool shuffle, OrderOf&& order) {
  std::vector<int64_t> out;
  if (n < 1 || count < 1) return out;
  out.reserve(static_cast<size_t>(count));
  decltype(order(int64_t{0})) epoch_order;
  int64_t order_epoch = -1;
  for (int64_t p = start; p < start + count; ++p) {
    if (!shuffle) {
      out.push_back(p % n);
      continue;
    }
    if (p / n != order_epoch) {
      order_epoch = p / n;
      epoch_order = order(order_epoch);
    }
    out.push_back((*epoch_order)[static_cast<size_t>(p % n)]);
  }
  return out;
}

// A step's shares of `global` positions from `position` among `replicas`:
// replica r takes the r-th run of them, global / replicas each and one more
// for the first global % replicas, weighted by its share (count * replicas
// / global). FailedPrecondition when there are fewer positions than
// replicas (each needs one at least). dataset_id is left 0.
Result<std::vector<training::StepInput>> step_shares(int64_t position, int64_t global, int64_t replicas,
                                                     uint64_t seed, bool shuffle);

}  // namespace capstan::data

#endif  // CAPSTAN_LIB_DATA_STEP_INPUT_H_
