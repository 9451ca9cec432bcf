// map(fn, num_parallel_calls, deterministic): fn of each element, inline
// or on worker threads; the parallel iterator also builds whole batches when
// batch() follows it (map_and_batch).
#include <chrono>
#include <deque>

#include "data/op_kernel.h"
#include "data/ops/common.h"
#include "data/tensor_util.h"
#include "sync/mutex.h"

namespace capstan::data::engine {

namespace {

using Clock = std::chrono::steady_clock;

class MapIterator final : public IteratorBase {
 public:
  MapIterator(IteratorPtr input, MapFunction fn) : input_(std::move(input)), fn_(std::move(fn)) {}
  Status get_next(Element* out, bool* end) override {
    Element in;
    CAPSTAN_RETURN_IF_ERROR(input_->get_next(&in, end));
    if (*end) return Status::Ok();
    CAPSTAN_ASSIGN_OR_RETURN(*out, fn_(std::move(in)));
    return Status::Ok();
  }
  Status save(StateWriter& writer) override { return save_through(writer, "map", *input_); }
  Status restore(StateReader& reader) override { return restore_through(reader, "map", *input_); }

 private:
  IteratorPtr input_;
  const MapFunction fn_;
};

// Workers pull from the input in turn (under input_mutex_, which also fixes
// each unit's place in the output order), run the function in parallel, and
// park results in `slots_`, which the consumer drains in input order
// (deterministic) or as they complete.
class ParallelMapIterator final : public IteratorBase {
 public:
  ParallelMapIterator(IteratorPtr input, MapFunction fn, int64_t parallelism, bool deterministic,
                      int64_t batch_size, bool drop_remainder, Pipeline& pipeline)
      : input_(std::move(input)),
        fn_(std::move(fn)),
        deterministic_(deterministic),
        batch_size_(batch_size),
        drop_remainder_(drop_remainder) {
    int budget = pipeline.cpu_budget();
    if (parallelism == kAutotune) {
      knob_ = pipeline.autotuner().add(Knob::Kind::kParallelism, budget, 1, budget);
      max_threads_ = budget;
    } else {
      knob_ = std::make_shared<Knob>(Knob::Kind::kParallelism, parallelism, parallelism, parallelism);
      max_threads_ = parallelism;
    }
  }

  ~ParallelMapIterator() override {
    {
      MutexLock lock(mutex_);
      cancelled_ = true;
    }
    work_cv_.notify_all();
    result_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  Status get_next(Element* out, bool* end) override {
    MutexLock lock(mutex_);
    if (threads_.empty()) start_threads();
    while (true) {
      std::shared_ptr<Slot> ready;
      if (deterministic_) {
        if (!slots_.empty() && slots_.front()->done) ready = slots_.front();
      } else {
        for (auto& slot : slots_) {
          if (slot->done) {
            ready = slot;
            break;
          }
        }
      }
      if (ready) {
        slots_.erase(std::find(slots_.begin(), slots_.end(), ready));
        work_cv_.notify_all();
        *end = false;
        if (!ready->item.status.ok()) return ready->item.status;
        *out = std::move(ready->item.element);
        return Status::Ok();
      }
      if (slots_.empty() && input_end_) {
        *end = true;
        return Status::Ok();
      }
      auto started = Clock::now();
      result_cv_.wait(mutex_);
      knob_->record_wait(Clock::now() - started);
    }
  }

  // Pauses the workers (until the whole pipeline is saved), waits for the
  // units they run, then writes every result not yet taken, in order.
  Status save(StateWriter& writer) override {
    {
      MutexLock lock(mutex_);
      paused_ = true;
      while (running_ > 0) result_cv_.wait(mutex_);
    }
    writer.defer([this]() {
      {
        MutexLock lock(mutex_);
        paused_ = false;
      }
      work_cv_.notify_all();
    });
    MutexLock input_lock(input_mutex_);
    writer.begin(op_name());
    {
      MutexLock lock(mutex_);
      writer.write_bool(input_end_);
      writer.write_int(static_cast<int64_t>(slots_.size()));
      for (const auto& slot : slots_) slot->item.save(writer);
    }
    return input_->save(writer);
  }

  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin(op_name()));
    bool input_end = false;
    std::vector<Item> items;
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&input_end));
    CAPSTAN_RETURN_IF_ERROR(read_items(reader, &items));
    {
      MutexLock lock(mutex_);
      if (!threads_.empty()) return Status::FailedPrecondition(std::string(op_name()) + ": restore after get_next");
      input_end_ = input_end;
      slots_.clear();
      for (auto& item : items) {
        auto slot = std::make_shared<Slot>();
        slot->done = true;
        slot->item = std::move(item);
        slots_.push_back(std::move(slot));
      }
    }
    MutexLock input_lock(input_mutex_);
    return input_->restore(reader);
  }

 private:
  // Both fields are guarded by the iterator's mutex_ (a nested struct cannot
  // name it in an annotation).
  struct Slot {
    bool done = false;
    Item item;
  };

  const char* op_name() const { return batch_size_ > 0 ? "map_and_batch" : "parallel_map"; }

  void start_threads() REQUIRES(mutex_) {
    for (int i = 0; i < max_threads_; ++i) threads_.emplace_back([this]() { work(); });
  }

  // Room for another unit: in flight + finished stay within twice the
  // current parallelism, and at most `parallelism` run at once.
  bool has_room() const REQUIRES(mutex_) {
    int64_t parallelism = knob_->value();
    return running_ < parallelism && static_cast<int64_t>(slots_.size()) < 2 * parallelism;
  }

  void work() {
    while (true) {
      std::shared_ptr<Slot> slot;
      std::vector<Element> inputs;
      Status input_status;
      {
        MutexLock lock(mutex_);
        while (!cancelled_ && !input_end_ && (paused_ || !has_room())) work_cv_.wait(mutex_);
        if (cancelled_ || input_end_) return;
        ++running_;
      }
      {
        // The unit's place in the output is fixed under input_mutex_, which
        // is taken only by a worker counted in running_ (save() waits for
        // none to be).
        MutexLock input_lock(input_mutex_);
        {
          MutexLock lock(mutex_);
          if (cancelled_ || input_end_) {
            --running_;
            result_cv_.notify_all();
            return;
          }
        }
        // Pull one unit: an element, or a batch's worth.
        int64_t want = batch_size_ > 0 ? batch_size_ : 1;
        bool end = false;
        while (static_cast<int64_t>(inputs.size()) < want && !end) {
          Element e;
          input_status = input_->get_next(&e, &end);
          if (!input_status.ok()) break;
          if (!end) inputs.push_back(std::move(e));
        }
        MutexLock lock(mutex_);
        if (end) input_end_ = true;
        bool short_batch = batch_size_ > 0 && static_cast<int64_t>(inputs.size()) < batch_size_;
        if (input_status.ok() && (inputs.empty() || (short_batch && drop_remainder_))) {
          --running_;
          result_cv_.notify_all();
          work_cv_.notify_all();
          if (input_end_) return;
          continue;
        }
        slot = std::make_shared<Slot>();
        slots_.push_back(slot);
      }
      Item item;
      item.status = input_status;
      if (item.status.ok()) item = run(std::move(inputs));
      {
        MutexLock lock(mutex_);
        slot->item = std::move(item);
        slot->done = true;
        --running_;
      }
      result_cv_.notify_all();
      work_cv_.notify_all();
    }
  }

  Item run(std::vector<Element> inputs) {
    Item item;
    if (batch_size_ == 0) {
      auto mapped = fn_(std::move(inputs[0]));
      if (mapped.ok()) item.element = std::move(*mapped);
      else item.status = mapped.status();
      return item;
    }
    std::vector<Element> mapped;
    mapped.reserve(inputs.size());
    for (auto& in : inputs) {
      auto m = fn_(std::move(in));
      if (!m.ok()) {
        item.status = m.status();
        return item;
      }
      mapped.push_back(std::move(*m));
    }
    auto batch = batch_elements(mapped);
    if (batch.ok()) item.element = std::move(*batch);
    else item.status = batch.status();
    return item;
  }

  IteratorPtr input_ GUARDED_BY(input_mutex_);
  const MapFunction fn_;
  const bool deterministic_;
  const int64_t batch_size_;  // 0: no batching
  const bool drop_remainder_;
  std::shared_ptr<Knob> knob_;
  int max_threads_ = 1;
  std::vector<std::thread> threads_;

  Mutex input_mutex_ ACQUIRED_BEFORE(mutex_);
  Mutex mutex_;
  CondVar work_cv_;
  CondVar result_cv_;
  std::deque<std::shared_ptr<Slot>> slots_ GUARDED_BY(mutex_);  // input order
  int64_t running_ GUARDED_BY(mutex_) = 0;
  bool input_end_ GUARDED_BY(mutex_) = false;
  bool cancelled_ GUARDED_BY(mutex_) = false;
  bool paused_ GUARDED_BY(mutex_) = false;  // by save()
};

}  // namespace

CAPSTAN_DATASET_OP(kMapKernel) = {
    .which = Op::MAP,
    .name = "map",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << fn_name(op.getMap().getFn()); },
    .cardinality = input_cardinality,
    .validate = [](Op::Reader op, const FunctionRegistry* functions) -> Status {
      CAPSTAN_RETURN_IF_ERROR(check_parallel(op, op.getMap().getNumParallelCalls(), "num_parallel_calls"));
      return with_op(op, resolve_map(op.getMap().getFn(), functions).status());
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      auto m = op.getMap();
      CAPSTAN_ASSIGN_OR_RETURN(MapFunction fn, resolve_map(m.getFn(), pipeline.functions()));
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      if (m.getNumParallelCalls() == 0) return IteratorPtr(std::make_unique<MapIterator>(std::move(in), std::move(fn)));
      return IteratorPtr(std::make_unique<ParallelMapIterator>(std::move(in), std::move(fn), m.getNumParallelCalls(),
                                                              resolve_deterministic(m.getDeterministic(), pipeline),
                                                              0, false, pipeline));
    },
};

IteratorPtr make_map_and_batch(IteratorPtr input, MapFunction fn, int64_t parallelism,
                               int64_t batch_size, bool drop_remainder, bool deterministic,
                               Pipeline& pipeline) {
  return std::make_unique<ParallelMapIterator>(std::move(input), std::move(fn), parallelism,
                                               deterministic, batch_size, drop_remainder, pipeline);
}

}  // namespace capstan::data::engine
