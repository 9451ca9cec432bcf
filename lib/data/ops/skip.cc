// skip(count): all but the first count elements (-1: none).
#include <algorithm>

#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

class SkipIterator final : public IteratorBase {
 public:
  SkipIterator(IteratorPtr input, int64_t count) : input_(std::move(input)), to_skip_(count) {}
  Status get_next(Element* out, bool* end) override {
    while (to_skip_ != 0) {
      Element ignored;
      CAPSTAN_RETURN_IF_ERROR(input_->get_next(&ignored, end));
      if (*end) return Status::Ok();
      if (to_skip_ > 0) --to_skip_;
    }
    return input_->get_next(out, end);
  }
  Status save(StateWriter& writer) override {
    save_count(writer, "skip", to_skip_);
    return input_->save(writer);
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(restore_count(reader, "skip", &to_skip_, -1, "the elements left to skip"));
    return input_->restore(reader);
  }

 private:
  IteratorPtr input_;
  int64_t to_skip_;  // -1: everything
};

using Count = CountArg<&Op::Reader::getSkip>;

}  // namespace

CAPSTAN_DATASET_OP(kSkipKernel) = {
    .which = Op::SKIP,
    .name = "skip",
    .inputs = Inputs::kOne,
    .describe_args = Count::describe,
    .cardinality = [](Op::Reader op) -> int64_t {
      int64_t n = input_cardinality(op);
      int64_t count = Count::of(op);
      if (n == kInf) return kInf;
      if (n == kUnk) return kUnk;
      if (count < 0) return 0;
      return std::max<int64_t>(0, n - count);
    },
    .validate = Count::validate,
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      return IteratorPtr(std::make_unique<SkipIterator>(std::move(in), Count::of(op)));
    },
};

}  // namespace capstan::data::engine
