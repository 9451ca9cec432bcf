// interleave(fn, cycle_length, block_length, num_parallel_calls,
// deterministic): the datasets fn makes of the input's elements, taken in
// turns.
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

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

CAPSTAN_DATASET_OP(kInterleaveKernel) = {
    .which = Op::INTERLEAVE,
    .name = "interleave",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << fn_name(op.getInterleave().getFn()); },
    .validate = [](Op::Reader op, const FunctionRegistry* functions) -> Status {
      auto i = op.getInterleave();
      if (i.getCycleLength() != kAutotune) {
        CAPSTAN_RETURN_IF_ERROR(check_positive(op, i.getCycleLength(), "cycle_length"));
        // Each open dataset of the cycle has a slot (and a thread when parallel).
        if (i.getCycleLength() > kMaxCycleLength) {
          return invalid_op(op, "cycle_length must be at most " + std::to_string(kMaxCycleLength) + ", got " +
                                    std::to_string(i.getCycleLength()));
        }
      }
      CAPSTAN_RETURN_IF_ERROR(check_positive(op, i.getBlockLength(), "block_length"));
      CAPSTAN_RETURN_IF_ERROR(check_parallel(op, i.getNumParallelCalls(), "num_parallel_calls"));
      return with_op(op, resolve_interleave(i.getFn(), functions).status());
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      auto i = op.getInterleave();
      CAPSTAN_ASSIGN_OR_RETURN(InterleaveFunction fn, resolve_interleave(i.getFn(), pipeline.functions()));
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      int64_t cycle = i.getCycleLength() == kAutotune ? pipeline.cpu_budget() : i.getCycleLength();
      return make_interleave(std::move(in), std::move(fn), cycle, i.getBlockLength(), i.getNumParallelCalls() != 0,
                             resolve_deterministic(i.getDeterministic(), pipeline), pipeline);
    },
};

IteratorPtr make_interleave(IteratorPtr input, InterleaveFunction fn, int64_t cycle_length,
                            int64_t block_length, bool parallel, bool deterministic,
                            Pipeline& pipeline) {
  return std::make_unique<InterleaveIterator>(std::move(input), std::move(fn), cycle_length,
                                              block_length, parallel, deterministic, pipeline);
}

}  // namespace capstan::data::engine
