// repeat(count): the input again and again; on splits, its split
// providers repeat instead.
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

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
    save_count(writer, "repeat", epoch_);
    writer.write_bool(produced_this_epoch_);
    return save_optional(writer, current_.get());
  }
  Status restore(StateReader& reader) override {
    bool has_current = false;
    CAPSTAN_RETURN_IF_ERROR(restore_count(reader, "repeat", &epoch_, 0, "an epoch"));
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

using Count = CountArg<&Op::Reader::getRepeat>;

}  // namespace

CAPSTAN_DATASET_OP(kRepeatKernel) = {
    .which = Op::REPEAT,
    .name = "repeat",
    .inputs = Inputs::kOne,
    .describe_args = Count::describe,
    .cardinality = [](Op::Reader op) -> int64_t {
      int64_t n = input_cardinality(op);
      int64_t count = Count::of(op);
      if (count == 0 || n == 0) return 0;
      if (count < 0) return n == kUnk ? kUnk : kInf;
      if (n < 0) return n;
      return saturating_mul(n, count);
    },
    .validate = Count::validate,
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      // On splits the repetitions come from the split providers (wrap_splits):
      // the input is read once, across all of them.
      if (pipeline.runs_on_splits(op)) return make_input(op, pipeline);
      return IteratorPtr(
          std::make_unique<RepeatIterator>(input_factory(op.getInput(), pipeline), Count::of(op)));
    },
    .wrap_splits = [](Op::Reader op, std::vector<std::unique_ptr<SplitProvider>> input) {
      for (auto& provider : input) provider = make_repeat_split_provider(std::move(provider), Count::of(op));
      return input;
    },
};

}  // namespace capstan::data::engine
