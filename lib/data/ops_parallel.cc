// Iterators with background threads: parallel map (and its fusion with
// batch), prefetch, and interleave. Each stops and joins its threads when
// destroyed; buffers are bounded (by fixed sizes or autotuned knobs).
#include <chrono>
#include <deque>
#include <mutex>
#include <thread>

#include "data/definition.h"
#include "data/iterator_state.h"
#include "data/ops.h"
#include "data/tensor_util.h"
#include "sync/mutex.h"

namespace capstan::data::engine {
namespace {

using Clock = std::chrono::steady_clock;

// One result of a background producer: an element, an error, or the end.
struct Item {
  Status status;
  Element element;
  bool end = false;
  // An error that ends the producer (over the memory budget): like the end
  // marker it stays for later calls.
  bool terminal = false;

  void save(StateWriter& writer) const {
    writer.write_status(status);
    writer.write_bool(end);
    writer.write_bool(terminal);
    if (status.ok() && !end) writer.write_element(element);
  }
  Status restore(StateReader& reader) {
    CAPSTAN_RETURN_IF_ERROR(reader.read_status(&status));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&end));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&terminal));
    if (status.ok() && !end) CAPSTAN_RETURN_IF_ERROR(reader.read_element(&element));
    return Status::Ok();
  }
};

// Reads `count` saved items (bounded by the bytes left, as each read checks).
Status read_items(StateReader& reader, std::vector<Item>* items) {
  int64_t count = 0;
  CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&count, 0, INT64_MAX, "a buffered element count"));
  for (int64_t i = 0; i < count; ++i) {
    Item item;
    CAPSTAN_RETURN_IF_ERROR(item.restore(reader));
    items->push_back(std::move(item));
  }
  return Status::Ok();
}

// ---- Parallel map (optionally fused with batch) -------------------------------------

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

// ---- Prefetch ---------------------------------------------------------------------

// Pulls from its input on a background thread into a bounded queue. The
// thread starts with the first take() or ready() (so that a restore comes
// before it pulls anything).
class Prefetcher {
 public:
  Prefetcher(IteratorPtr input, std::shared_ptr<Knob> capacity, int64_t ram_budget, MemoryBudget& memory)
      : input_(std::move(input)), capacity_(std::move(capacity)), ram_budget_(ram_budget), memory_(memory) {}
  ~Prefetcher() {
    {
      MutexLock lock(mutex_);
      cancelled_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    MutexLock lock(mutex_);
    for (auto& item : queue_) {
      if (item.status.ok() && !item.end) memory_.release(footprint(item.element));
    }
  }

  // Pauses the thread (until the whole pipeline is saved), then writes the
  // queued items and the input's position.
  Status save(StateWriter& writer) {
    {
      MutexLock lock(mutex_);
      paused_ = true;
      while (busy_) cv_.wait(mutex_);
    }
    writer.defer([this]() {
      {
        MutexLock lock(mutex_);
        paused_ = false;
      }
      cv_.notify_all();
    });
    bool finished = false;
    {
      MutexLock lock(mutex_);
      writer.write_int(static_cast<int64_t>(queue_.size()));
      for (const auto& item : queue_) item.save(writer);
      finished = !queue_.empty() && (queue_.back().end || queue_.back().terminal);
    }
    // The thread is parked outside input_ (or gone): reading it is safe.
    return finished ? Status::Ok() : input_->save(writer);
  }

  Status restore(StateReader& reader) {
    std::vector<Item> items;
    CAPSTAN_RETURN_IF_ERROR(read_items(reader, &items));
    bool finished = !items.empty() && (items.back().end || items.back().terminal);
    {
      MutexLock lock(mutex_);
      if (started_) return Status::FailedPrecondition("prefetch: restore after the first element");
      for (auto& item : items) {
        if (item.status.ok() && !item.end) {
          Status charged = memory_.charge(footprint(item.element), "prefetch");
          if (!charged.ok()) return charged;
        }
        queue_.push_back(std::move(item));
      }
      // A producer that had ended does not start again.
      started_ = finished;
    }
    return finished ? Status::Ok() : input_->restore(reader);
  }

  // Blocks until an item is ready.
  Item take() {
    MutexLock lock(mutex_);
    start();
    if (queue_.empty()) {
      auto started = Clock::now();
      while (queue_.empty()) cv_.wait(mutex_);
      capacity_->record_wait(Clock::now() - started);
    }
    if (queue_.front().end || queue_.front().terminal) return queue_.front();  // stays for later calls
    Item item = std::move(queue_.front());
    queue_.pop_front();
    if (item.status.ok()) memory_.release(footprint(item.element));
    cv_.notify_all();
    return item;
  }
  // Whether take() would return at once.
  bool ready() {
    MutexLock lock(mutex_);
    start();
    return !queue_.empty();
  }

 private:
  void start() REQUIRES(mutex_) {
    if (started_) return;
    started_ = true;
    thread_ = std::thread([this]() { run(); });
  }

  void run() {
    while (true) {
      {
        MutexLock lock(mutex_);
        while (!cancelled_ && (paused_ || static_cast<int64_t>(queue_.size()) >= capacity_->value())) {
          cv_.wait(mutex_);
        }
        if (cancelled_) return;
        busy_ = true;
      }
      Item item;
      item.status = input_->get_next(&item.element, &item.end);
      if (item.status.ok() && !item.end) {
        note_size(item.element.byte_size());
        Status charged = memory_.charge(footprint(item.element), "prefetch");
        if (!charged.ok()) {
          item = Item{charged, Element(), false, true};
          // Drop what is buffered: the consumer sees the error next.
          MutexLock lock(mutex_);
          for (auto& queued : queue_) {
            if (queued.status.ok() && !queued.end) memory_.release(footprint(queued.element));
          }
          queue_.clear();
        }
      }
      bool end = (item.status.ok() && item.end) || item.terminal;
      {
        MutexLock lock(mutex_);
        queue_.push_back(std::move(item));
        busy_ = false;
      }
      cv_.notify_all();
      if (end) return;
    }
  }

  // Keeps the autotuned buffer within the RAM budget for elements this size.
  void note_size(size_t bytes) {
    average_bytes_ = average_bytes_ == 0 ? static_cast<double>(bytes) : 0.9 * average_bytes_ + 0.1 * static_cast<double>(bytes);
    if (average_bytes_ > 0 && ram_budget_ > 0) {
      capacity_->set_max(std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(ram_budget_) / average_bytes_)));
    }
  }

  IteratorPtr input_;  // prefetch thread only
  std::shared_ptr<Knob> capacity_;
  const int64_t ram_budget_;
  MemoryBudget& memory_;
  double average_bytes_ = 0;  // prefetch thread only
  std::thread thread_;
  Mutex mutex_;
  CondVar cv_;
  std::deque<Item> queue_ GUARDED_BY(mutex_);
  bool cancelled_ GUARDED_BY(mutex_) = false;
  bool started_ GUARDED_BY(mutex_) = false;
  bool paused_ GUARDED_BY(mutex_) = false;  // by save()
  bool busy_ GUARDED_BY(mutex_) = false;    // the thread is in input_->get_next
};

class PrefetchIterator final : public IteratorBase {
 public:
  PrefetchIterator(IteratorPtr input, int64_t buffer_size, Pipeline& pipeline) {
    std::shared_ptr<Knob> knob;
    int64_t ram = pipeline.autotuner().ram_budget();
    if (buffer_size == kAutotune) {
      knob = pipeline.autotuner().add(Knob::Kind::kBufferSize, 2, 1, std::max<int64_t>(2, ram));
    } else {
      knob = std::make_shared<Knob>(Knob::Kind::kBufferSize, buffer_size, buffer_size, buffer_size);
      ram = 0;  // a fixed size is the user's call
    }
    prefetcher_ = std::make_unique<Prefetcher>(std::move(input), std::move(knob), ram, pipeline.memory());
  }
  Status get_next(Element* out, bool* end) override {
    Item item = prefetcher_->take();
    *end = item.end;
    if (!item.status.ok()) return item.status;
    if (!item.end) *out = std::move(item.element);
    return Status::Ok();
  }
  Status save(StateWriter& writer) override {
    writer.begin("prefetch");
    return prefetcher_->save(writer);
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("prefetch"));
    return prefetcher_->restore(reader);
  }

 private:
  std::unique_ptr<Prefetcher> prefetcher_;
};

// ---- Interleave ---------------------------------------------------------------------

// TF's interleave order: cycle over up to cycle_length open datasets taking
// block_length elements from each; a dataset that ends is replaced, in its
// place in the cycle, by the dataset of the next input element. In parallel
// mode every open dataset is drained by its own prefetch thread; the order
// stays the same unless deterministic is off, in which case a slot whose
// next element is not ready yet is passed over.
class InterleaveIterator final : public IteratorBase {
 public:
  InterleaveIterator(IteratorPtr input, InterleaveFunction fn, int64_t cycle_length,
                     int64_t block_length, bool parallel, bool deterministic, Pipeline& pipeline)
      : input_(std::move(input)),
        fn_(std::move(fn)),
        cycle_(static_cast<size_t>(cycle_length)),
        block_length_(block_length),
        parallel_(parallel),
        deterministic_(deterministic),
        pipeline_(pipeline) {}

  ~InterleaveIterator() override {
    for (auto& slot : cycle_) slot.reset();  // stop prefetchers before the definitions go
  }

  Status get_next(Element* out, bool* end) override {
    while (!input_end_ || open_ > 0) {
      Slot* slot = cycle_[cycle_index_].get();
      if (slot != nullptr) {
        if (parallel_ && !deterministic_ && !slot->prefetcher->ready()) {
          if (Slot* other = find_ready()) slot = other;
        }
        Item item = next_of(*slot);
        if (!item.end) {
          if (++block_index_ == block_length_) advance();
          *end = false;
          if (!item.status.ok()) return item.status;
          *out = std::move(item.element);
          return Status::Ok();
        }
        close(slot);
        advance();
      } else if (!input_end_) {
        Element args;
        CAPSTAN_RETURN_IF_ERROR(input_->get_next(&args, &input_end_));
        if (!input_end_) {
          CAPSTAN_ASSIGN_OR_RETURN(cycle_[cycle_index_], open(std::move(args)));
          ++open_;
        }
      } else {
        advance();
      }
    }
    *end = true;
    return Status::Ok();
  }

  // The cycle: where it is, and for each open slot the input element its
  // dataset was made from and that dataset's position. The datasets are made
  // again from those elements on restore.
  Status save(StateWriter& writer) override {
    writer.begin("interleave");
    writer.write_int(static_cast<int64_t>(cycle_index_));
    writer.write_int(block_index_);
    writer.write_bool(input_end_);
    for (auto& slot : cycle_) {
      writer.write_bool(slot != nullptr);
      if (slot == nullptr) continue;
      writer.write_element(slot->args);
      if (slot->prefetcher) {
        CAPSTAN_RETURN_IF_ERROR(slot->prefetcher->save(writer));
      } else {
        CAPSTAN_RETURN_IF_ERROR(slot->iterator->save(writer));
      }
    }
    return input_->save(writer);
  }

  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("interleave"));
    int64_t cycle_index = 0;
    CAPSTAN_RETURN_IF_ERROR(
        reader.read_int_in(&cycle_index, 0, static_cast<int64_t>(cycle_.size()) - 1, "the cycle index"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&block_index_, 0, block_length_ - 1, "the block index"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&input_end_));
    cycle_index_ = static_cast<size_t>(cycle_index);
    open_ = 0;
    for (auto& slot : cycle_) {
      bool present = false;
      CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&present));
      slot.reset();
      if (!present) continue;
      Element args;
      CAPSTAN_RETURN_IF_ERROR(reader.read_element(&args));
      CAPSTAN_ASSIGN_OR_RETURN(slot, open(std::move(args)));
      ++open_;
      if (slot->prefetcher) {
        CAPSTAN_RETURN_IF_ERROR(slot->prefetcher->restore(reader));
      } else {
        CAPSTAN_RETURN_IF_ERROR(slot->iterator->restore(reader));
      }
    }
    return input_->restore(reader);
  }

 private:
  struct Slot {
    Element args;                                     // the input element it was made from
    std::shared_ptr<const Dataset::Impl> definition;  // outlives the iterator below
    IteratorPtr iterator;                             // sequential mode
    std::unique_ptr<Prefetcher> prefetcher;           // parallel mode
    ~Slot() {
      prefetcher.reset();
      iterator.reset();
    }
  };

  Result<std::unique_ptr<Slot>> open(Element args) {
    CAPSTAN_ASSIGN_OR_RETURN(Dataset dataset, fn_(args));
    auto slot = std::make_unique<Slot>();
    slot->args = std::move(args);
    slot->definition = dataset.impl();
    CAPSTAN_RETURN_IF_ERROR(validate(slot->definition->root(), pipeline_.functions()));
    CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr it, make_iterator(slot->definition->root(), pipeline_));
    if (parallel_) {
      auto knob = std::make_shared<Knob>(Knob::Kind::kBufferSize, 2 * block_length_, 1, 2 * block_length_);
      slot->prefetcher = std::make_unique<Prefetcher>(std::move(it), std::move(knob), 0, pipeline_.memory());
    } else {
      slot->iterator = std::move(it);
    }
    return slot;
  }

  Item next_of(Slot& slot) {
    if (slot.prefetcher) return slot.prefetcher->take();
    Item item;
    item.status = slot.iterator->get_next(&item.element, &item.end);
    return item;
  }

  Slot* find_ready() {
    for (size_t k = 1; k < cycle_.size(); ++k) {
      size_t i = (cycle_index_ + k) % cycle_.size();
      if (cycle_[i] && cycle_[i]->prefetcher->ready()) {
        cycle_index_ = i;
        block_index_ = 0;
        return cycle_[i].get();
      }
    }
    return nullptr;
  }

  void close(Slot* slot) {
    for (auto& s : cycle_) {
      if (s.get() == slot) {
        s.reset();
        --open_;
        return;
      }
    }
  }

  void advance() {
    block_index_ = 0;
    cycle_index_ = (cycle_index_ + 1) % cycle_.size();
  }

  IteratorPtr input_;
  const InterleaveFunction fn_;
  std::vector<std::unique_ptr<Slot>> cycle_;
  const int64_t block_length_;
  const bool parallel_;
  const bool deterministic_;
  Pipeline& pipeline_;
  size_t cycle_index_ = 0;
  int64_t block_index_ = 0;
  int64_t open_ = 0;
  bool input_end_ = false;
};

}  // namespace

IteratorPtr make_parallel_map(IteratorPtr input, MapFunction fn, int64_t parallelism,
                              bool deterministic, Pipeline& pipeline) {
  return std::make_unique<ParallelMapIterator>(std::move(input), std::move(fn), parallelism,
                                               deterministic, 0, false, pipeline);
}

IteratorPtr make_map_and_batch(IteratorPtr input, MapFunction fn, int64_t parallelism,
                               int64_t batch_size, bool drop_remainder, bool deterministic,
                               Pipeline& pipeline) {
  return std::make_unique<ParallelMapIterator>(std::move(input), std::move(fn), parallelism,
                                               deterministic, batch_size, drop_remainder, pipeline);
}

IteratorPtr make_prefetch(IteratorPtr input, int64_t buffer_size, Pipeline& pipeline) {
  return std::make_unique<PrefetchIterator>(std::move(input), buffer_size, pipeline);
}

IteratorPtr make_interleave(IteratorPtr input, InterleaveFunction fn, int64_t cycle_length,
                            int64_t block_length, bool parallel, bool deterministic,
                            Pipeline& pipeline) {
  return std::make_unique<InterleaveIterator>(std::move(input), std::move(fn), cycle_length,
                                              block_length, parallel, deterministic, pipeline);
}

}  // namespace capstan::data::engine
