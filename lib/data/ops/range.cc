// range(start, stop, step): int64 scalars; DYNAMIC sharding hands out
// chunks of the indices.
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

class RangeIterator final : public IteratorBase {
 public:
  RangeIterator(int64_t start, int64_t stop, int64_t step)
      : next_(start), start_(start), stop_(stop), step_(step) {}
  Status get_next(Element* out, bool* end) override {
    if ((step_ > 0 && next_ >= stop_) || (step_ < 0 && next_ <= stop_)) {
      *end = true;
      return Status::Ok();
    }
    *out = scalar_element(Tensor::scalar<int64_t>(next_));
    // Stop instead of overflowing past INT64_MAX.
    if (__builtin_add_overflow(next_, step_, &next_)) next_ = stop_;
    *end = false;
    return Status::Ok();
  }
  Status save(StateWriter& writer) override {
    writer.begin("range");
    writer.write_int(next_);
    return Status::Ok();
  }
  // The position must be one range(start, stop, step) reaches: a damaged
  // state could otherwise start a range(1, 30) at -2^62, a stream no
  // consumer would live to see the end of.
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("range"));
    // From start to the first value past stop (within a step of it).
    const __int128 past = static_cast<__int128>(stop_) + (step_ > 0 ? step_ - 1 : step_ + 1);
    const __int128 low = step_ > 0 ? start_ : std::min<__int128>(past, start_);
    const __int128 high = step_ > 0 ? std::max<__int128>(past, start_) : start_;
    auto clamp64 = [](__int128 v) {
      return static_cast<int64_t>(std::clamp<__int128>(v, INT64_MIN, INT64_MAX));
    };
    int64_t next = 0;
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&next, clamp64(low), clamp64(high), "the next value"));
    const __int128 offset = static_cast<__int128>(next) - start_;
    if (next != stop_ && offset % step_ != 0) {
      return Status::InvalidArgument("iterator state: range: the next value " + std::to_string(next) +
                                     " is not start " + std::to_string(start_) + " plus a multiple of step " +
                                     std::to_string(step_));
    }
    next_ = next;
    return Status::Ok();
  }

 private:
  int64_t next_;
  const int64_t start_;
  const int64_t stop_;
  const int64_t step_;
};

// range() over the index chunks [begin, end) a provider hands out.
class SplitRangeIterator final : public IteratorBase {
 public:
  SplitRangeIterator(int64_t start, int64_t step, SplitProvider* splits)
      : start_(start), step_(step), splits_(splits) {}
  Status get_next(Element* out, bool* end) override {
    while (next_ >= end_) {
      CAPSTAN_ASSIGN_OR_RETURN(auto split, splits_->get_next());
      if (!split) {
        *end = true;
        return Status::Ok();
      }
      if (split->components.size() != 1 || split->components[0].dtype() != DType::kInt64 ||
          split->components[0].num_elements() != 2) {
        return Status::InvalidArgument("a range split must be an int64 [begin, end) pair");
      }
      next_ = split->components[0].flat<int64_t>()[0];
      end_ = split->components[0].flat<int64_t>()[1];
    }
    *out = scalar_element(Tensor::scalar<int64_t>(start_ + next_++ * step_));
    *end = false;
    return Status::Ok();
  }
  Status save(StateWriter&) override { return on_splits("range"); }
  Status restore(StateReader&) override { return on_splits("range"); }

 private:
  const int64_t start_;
  const int64_t step_;
  SplitProvider* const splits_;
  int64_t next_ = 0;
  int64_t end_ = 0;
};

int64_t range_cardinality(Op::Reader op) {
  auto r = op.getRange();
  if (r.getStep() == 0) return kUnknownCardinality;
  __int128 span = static_cast<__int128>(r.getStop()) - r.getStart();
  __int128 step = r.getStep();
  if ((span > 0) != (step > 0) || span == 0) return 0;
  __int128 n = (span + step + (step > 0 ? -1 : 1)) / step;
  return static_cast<int64_t>(n);
}

IteratorPtr make_range(int64_t start, int64_t stop, int64_t step) {
  return std::make_unique<RangeIterator>(start, stop, step);
}

IteratorPtr make_split_range(int64_t start, int64_t step, SplitProvider* splits) {
  return std::make_unique<SplitRangeIterator>(start, step, splits);
}

}  // namespace

CAPSTAN_DATASET_OP(kRangeKernel) = {
    .which = Op::RANGE,
    .name = "range",
    .inputs = Inputs::kNone,
    .describe_args =
        [](Op::Reader op, std::ostream& out) {
          auto r = op.getRange();
          out << r.getStart() << ", " << r.getStop() << ", " << r.getStep();
        },
    .cardinality = range_cardinality,
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      if (op.getRange().getStep() == 0) return invalid_op(op, "step must not be 0");
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline&) -> Result<IteratorPtr> {
      auto r = op.getRange();
      return make_range(r.getStart(), r.getStop(), r.getStep());
    },
    .split_provider = [](Op::Reader op, int64_t range_chunk) -> Result<std::unique_ptr<SplitProvider>> {
      return make_range_split_provider(std::max<int64_t>(range_cardinality(op), 0), range_chunk);
    },
    .read_splits = [](Op::Reader op, SplitProvider* splits) {
      return make_split_range(op.getRange().getStart(), op.getRange().getStep(), splits);
    },
};

}  // namespace capstan::data::engine
