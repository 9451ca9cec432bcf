// The pipeline engine: turns a definition (schemas/dataset.capnp) into a tree
// of iterators and runs it.
//
// Glossary:
//   op          one node of the definition (range, map, batch, ...).
//   iterator    the running state of one op; pulls from its input iterators.
//   pipeline    everything one make_iterator() call created: the iterators,
//               their threads, per-op state that must survive an iterator
//               being re-created (shuffle epochs under repeat, caches), and
//               the autotuner.
//
// Iterators are pull-based (get_next) like tf.data's. Ops with parallelism
// (map, interleave, prefetch) run background threads that stop and join
// when the iterator is destroyed.
#ifndef CAPSTAN_LIB_DATA_ENGINE_H_
#define CAPSTAN_LIB_DATA_ENGINE_H_

#include <atomic>
#include <functional>
#include <map>
#include <type_traits>
#include <string_view>
#include <memory>
#include <thread>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan_schemas/dataset.capnp.h"
#include "data/autotune.h"
#include "data/definition.h"
#include "sync/mutex.h"

namespace capstan::data::engine {

class StateWriter;
class StateReader;

class IteratorBase {
 public:
  virtual ~IteratorBase() = default;
  // Sets *end_of_sequence, or fills *out. A non-OK status is one element's
  // error: the next call continues with the following element.
  virtual Status get_next(Element* out, bool* end_of_sequence) = 0;
  // Writes this iterator's position, then its inputs' (iterator_state.h), so
  // that an iterator of the same op restored from it yields what this one
  // would have yielded next. Iterators with background threads pause them
  // and write what they had buffered. FailedPrecondition naming the op where
  // the position lives elsewhere (splits handed out by a data service).
  virtual Status save(StateWriter& writer) = 0;
  // Reads back what save() wrote, into an iterator just made from the same
  // op that has produced nothing yet.
  virtual Status restore(StateReader& reader) = 0;
};

// The bytes the buffering ops of one pipeline hold at once (shuffle and
// prefetch buffers, batches being built, memory caches), against a limit
// (Options::memory_budget; a data worker's task_memory_mib): the op whose
// buffer would pass it fails with ResourceExhausted naming itself and the
// sizes, and drops what it holds, instead of the process running out of
// memory. Thread-safe.
class MemoryBudget {
 public:
  explicit MemoryBudget(int64_t limit_bytes) : limit_(limit_bytes) {}
  // Counts `bytes` more held by `op`; ResourceExhausted, counting nothing,
  // when that would pass the limit.
  Status charge(int64_t bytes, std::string_view op);
  void release(int64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }
  int64_t limit() const { return limit_; }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }

 private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
};

// The memory an element takes, as the budget counts it: its tensors' bytes
// plus the allocations around them (the element, each tensor's buffer and
// shape), so that a buffer of many small elements is not undercounted.
inline int64_t footprint(const Element& element) {
  return static_cast<int64_t>(element.byte_size()) + 64 +
         128 * static_cast<int64_t>(element.components.size());
}

// What one op holds against its pipeline's budget; released as it goes.
// Used by one thread at a time (its op's, or under the op's mutex).
class HeldBytes {
 public:
  HeldBytes(MemoryBudget& budget, const char* op) : budget_(budget), op_(op) {}
  HeldBytes(const HeldBytes&) = delete;
  HeldBytes& operator=(const HeldBytes&) = delete;
  ~HeldBytes() { clear(); }
  Status add(int64_t bytes) {
    CAPSTAN_RETURN_IF_ERROR(budget_.charge(bytes, op_));
    held_ += bytes;
    return Status::Ok();
  }
  void remove(int64_t bytes) {
    budget_.release(bytes);
    held_ -= bytes;
  }
  void clear() {
    budget_.release(held_);
    held_ = 0;
  }

 private:
  MemoryBudget& budget_;
  const char* const op_;
  int64_t held_ = 0;
};

// Upper bounds on the sizes in a definition that become threads or
// up-front allocations (validate() refuses larger ones).
inline constexpr int64_t kMaxParallelCalls = 1024;
inline constexpr int64_t kMaxCycleLength = 1024;

// Per-op state that outlives an op's iterators (shuffle epochs under
// repeat, caches); saved with the pipeline's iterators.
class PipelineState {
 public:
  virtual ~PipelineState() = default;
  virtual void save(StateWriter& writer) = 0;
  virtual Status restore(StateReader& reader) = 0;
};

// Shared by every iterator of one pipeline. Thread-safe.
class Pipeline {
 public:
  // `splits` (empty, or one per source of the root definition, in the order
  // of split_sources()) feed the root definition's sources.
  Pipeline(std::shared_ptr<const Dataset::Impl> definition, const FunctionRegistry* functions,
           std::vector<SplitProvider*> splits = {});
  ~Pipeline();

  const FunctionRegistry* functions() const { return functions_; }
  bool deterministic_default() const { return deterministic_; }
  int cpu_budget() const { return cpu_budget_; }
  Autotuner& autotuner() { return autotuner_; }
  MemoryBudget& memory() { return memory_; }
  // The split provider for `op`'s source, when `op` belongs to the root
  // definition and the pipeline runs on splits; else null.
  SplitProvider* splits_for(wire::Op::Reader op) const;
  // True when `op` belongs to the root definition and the pipeline runs on
  // splits (repeat then takes its repetitions from the split providers).
  bool runs_on_splits(wire::Op::Reader op) const;

  // State of the op with `key` that lives as long as the pipeline; created by
  // `make` on first use. Ops outside the root definition (datasets made by an
  // interleave function) get fresh state each time.
  template <typename T>
  std::shared_ptr<T> state(const void* key) {
    static_assert(std::is_base_of_v<PipelineState, T>);
    if (!definition_->contains(key)) return std::make_shared<T>();
    MutexLock lock(mutex_);
    auto& slot = states_[key];
    if (!slot) {
      auto made = std::make_shared<T>();
      // A restored state that waited for its op's first iterator; a damaged
      // one leaves the fresh state (restore() checked its framing).
      (void)restore_pending(key, *made);
      slot = made;
    }
    return std::static_pointer_cast<T>(slot);
  }

  // Saves `root` (this pipeline's root iterator) and the per-op states, as
  // Iterator::save() returns them.
  Result<std::string> save(IteratorBase& root);
  // Restores them into `root`, just made by make_iterator() for this pipeline.
  Status restore(IteratorBase& root, std::string_view state);

 private:
  const std::shared_ptr<const Dataset::Impl> definition_;
  const FunctionRegistry* const functions_;
  std::map<const void*, SplitProvider*> splits_;  // source op key -> its provider
  const bool deterministic_;
  const int cpu_budget_;
  Autotuner autotuner_;
  MemoryBudget memory_;
  Status restore_pending(const void* key, PipelineState& state) REQUIRES(mutex_);
  uint64_t fingerprint() const;

  Mutex mutex_;
  std::map<const void*, std::shared_ptr<PipelineState>> states_ GUARDED_BY(mutex_);
  // Saved states of ops that had no iterator when restore() ran.
  std::map<const void*, std::string> pending_ GUARDED_BY(mutex_);
};

// Creates the iterator of `op` (and, recursively, of its inputs). The
// definition `op` lives in must outlive the iterator.
Result<std::unique_ptr<IteratorBase>> make_iterator(wire::Op::Reader op, Pipeline& pipeline);

// The sources under `op` (ops without inputs), depth first: the order of
// split providers.
std::vector<wire::Op::Reader> split_sources(wire::Op::Reader op);
// One split provider per source under `op`, as its transformations hand them
// out (repeat repeats them). FailedPrecondition naming the source when one
// cannot be split.
Result<std::vector<std::unique_ptr<SplitProvider>>> make_split_providers(wire::Op::Reader op,
                                                                        int64_t range_chunk);

// Checks every op's arguments and functions before anything runs.
Status validate(wire::Op::Reader op, const FunctionRegistry* functions);

// The engine's functions, resolved from a definition's Fn.
Result<MapFunction> resolve_map(wire::Fn::Reader fn, const FunctionRegistry* functions);
Result<FilterFunction> resolve_filter(wire::Fn::Reader fn, const FunctionRegistry* functions);
Result<InterleaveFunction> resolve_interleave(wire::Fn::Reader fn,
                                              const FunctionRegistry* functions);

// Dataset::make_iterator: checks the definition, then builds the pipeline
// (`splits`: empty, or one provider per source, as make_split_providers()
// orders them).
Result<std::unique_ptr<Iterator>> make_root_iterator(const std::shared_ptr<const Dataset::Impl>& definition,
                                                     const FunctionRegistry* functions,
                                                     std::vector<SplitProvider*> splits);
// Dataset::make_split_providers and make_split_provider.
Result<std::vector<std::unique_ptr<SplitProvider>>> make_root_split_providers(const Dataset::Impl& definition,
                                                                             int64_t range_chunk);
Result<std::unique_ptr<SplitProvider>> make_root_split_provider(const Dataset::Impl& definition,
                                                                int64_t range_chunk);

// Turns an iterator's Status-based interface into the public Iterator.
std::unique_ptr<Iterator> wrap_root(std::unique_ptr<Pipeline> pipeline,
                                    std::unique_ptr<IteratorBase> root);

}  // namespace capstan::data::engine

#endif  // CAPSTAN_LIB_DATA_ENGINE_H_
