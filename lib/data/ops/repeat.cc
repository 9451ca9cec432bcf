// repeat(count): the input again and again; on splits, its split
// providers repeat instead.
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {
namespace {

using Op = wire::Op;
using Inputs = OpKernel::Inputs;

constexpr int64_t kInf = kInfiniteCardinality;
constexpr int64_t kUnk = kUnknownCardinality;

int64_t saturating_mul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  if (a > INT64_MAX / b) return INT64_MAX;
  return a * b;
}

class RepeatIterator final : public IteratorBase {
 public:
  RepeatIterator(IteratorFactory factory, int64_t count) : factory_(std::move(factory)), count_(count) {}

  Status get_next(Element* out, bool* end) override {
    while (count_ < 0 || epoch_ < count_) {
      if (current_ == nullptr) {
        CAPSTAN_ASSIGN_OR_RETURN(current_, factory_());
        produced_this_epoch_ = false;
      }
      CAPSTAN_RETURN_IF_ERROR(current_->get_next(out, end));
      if (!*end) {
        produced_this_epoch_ = true;
        return Status::Ok();
      }
      current_ = nullptr;
      ++epoch_;
      // An empty input repeated forever would spin: end instead (as TF does).
      if (!produced_this_epoch_) break;
    }
    *end = true;
    return Status::Ok();
  }

  Status save(StateWriter& writer) override {
    writer.begin("repeat");
    writer.write_int(epoch_);
    writer.write_bool(produced_this_epoch_);
    return save_optional(writer, current_.get());
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("repeat"));
    bool has_current = false;
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&epoch_, 0, INT64_MAX, "an epoch"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&produced_this_epoch_));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&has_current));
    if (!has_current) return Status::Ok();
    CAPSTAN_ASSIGN_OR_RETURN(current_, factory_());
    return current_->restore(reader);
  }

 private:
  const IteratorFactory factory_;
  const int64_t count_;
  int64_t epoch_ = 0;
  bool produced_this_epoch_ = false;
  IteratorPtr current_;
};

}  // namespace

CAPSTAN_DATASET_OP(kRepeatKernel) = {
    .which = Op::REPEAT,
    .name = "repeat",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getRepeat().getCount(); },
    .cardinality = [](Op::Reader op) -> int64_t {
      int64_t n = input_cardinality(op);
      int64_t count = op.getRepeat().getCount();
      if (count == 0 || n == 0) return 0;
      if (count < 0) return n == kUnk ? kUnk : kInf;
      if (n < 0) return n;
      return saturating_mul(n, count);
    },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      return check_count(op, op.getRepeat().getCount(), "count");
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      // On splits the repetitions come from the split providers (wrap_splits):
      // the input is read once, across all of them.
      if (pipeline.runs_on_splits(op)) return make_input(op, pipeline);
      return IteratorPtr(
          std::make_unique<RepeatIterator>(input_factory(op.getInput(), pipeline), op.getRepeat().getCount()));
    },
    .wrap_splits = [](Op::Reader op, std::vector<std::unique_ptr<SplitProvider>> input) {
      for (auto& provider : input) provider = make_repeat_split_provider(std::move(provider), op.getRepeat().getCount());
      return input;
    },
};

}  // namespace capstan::data::engine
