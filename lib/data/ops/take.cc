// take(count): the first count elements (-1: all).
#include <algorithm>

#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

class TakeIterator final : public IteratorBase {
 public:
  TakeIterator(IteratorPtr input, int64_t count) : input_(std::move(input)), remaining_(count) {}
  Status get_next(Element* out, bool* end) override {
    if (remaining_ == 0) {
      *end = true;
      input_ = nullptr;  // stop any background work early
      return Status::Ok();
    }
    CAPSTAN_RETURN_IF_ERROR(input_->get_next(out, end));
    if (!*end && remaining_ > 0) --remaining_;
    return Status::Ok();
  }
  Status save(StateWriter& writer) override {
    save_count(writer, "take", remaining_);
    return save_optional(writer, input_.get());
  }
  Status restore(StateReader& reader) override {
    bool has_input = false;
    CAPSTAN_RETURN_IF_ERROR(restore_count(reader, "take", &remaining_, -1, "the elements left to take"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&has_input));
    if (!has_input) {
      input_ = nullptr;
      return remaining_ == 0 ? Status::Ok() : Status::InvalidArgument("take: a saved state without its input");
    }
    return input_->restore(reader);
  }

 private:
  IteratorPtr input_;
  int64_t remaining_;  // -1: all
};

using Count = CountArg<&Op::Reader::getTake>;

}  // namespace

CAPSTAN_DATASET_OP(kTakeKernel) = {
    .which = Op::TAKE,
    .name = "take",
    .inputs = Inputs::kOne,
    .describe_args = Count::describe,
    .cardinality = [](Op::Reader op) -> int64_t {
      int64_t n = input_cardinality(op);
      int64_t count = Count::of(op);
      if (count < 0) return n;
      if (n == kInf) return count;
      if (n == kUnk) return kUnk;
      return std::min(n, count);
    },
    .validate = Count::validate,
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      return IteratorPtr(std::make_unique<TakeIterator>(std::move(in), Count::of(op)));
    },
};

}  // namespace capstan::data::engine
