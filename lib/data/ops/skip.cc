// skip(count): all but the first count elements (-1: none).
#include <algorithm>

#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {
namespace {

using Op = wire::Op;
using Inputs = OpKernel::Inputs;

constexpr int64_t kInf = kInfiniteCardinality;
constexpr int64_t kUnk = kUnknownCardinality;

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
    writer.begin("skip");
    writer.write_int(to_skip_);
    return input_->save(writer);
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("skip"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&to_skip_, -1, INT64_MAX, "the elements left to skip"));
    return input_->restore(reader);
  }

 private:
  IteratorPtr input_;
  int64_t to_skip_;  // -1: everything
};

}  // namespace

CAPSTAN_DATASET_OP(kSkipKernel) = {
    .which = Op::SKIP,
    .name = "skip",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getSkip().getCount(); },
    .cardinality = [](Op::Reader op) -> int64_t {
      int64_t n = input_cardinality(op);
      int64_t count = op.getSkip().getCount();
      if (n == kInf) return kInf;
      if (n == kUnk) return kUnk;
      if (count < 0) return 0;
      return std::max<int64_t>(0, n - count);
    },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      return check_count(op, op.getSkip().getCount(), "count");
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      return IteratorPtr(std::make_unique<SkipIterator>(std::move(in), op.getSkip().getCount()));
    },
};

}  // namespace capstan::data::engine
