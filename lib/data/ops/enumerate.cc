// enumerate(start): each element with its index, counting from start, in
// front as component 0 (tf.data's enumerate yields (index, element)).
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

class EnumerateIterator final : public IteratorBase {
 public:
  EnumerateIterator(IteratorPtr input, int64_t start) : input_(std::move(input)), start_(start), next_(start) {}

  Status get_next(Element* out, bool* end) override {
    if (past_max_) {
      return Status::OutOfRange("enumerate: the index passed INT64_MAX (start " + std::to_string(start_) +
                                "); start lower or take() fewer elements");
    }
    Element in;
    CAPSTAN_RETURN_IF_ERROR(input_->get_next(&in, end));
    if (*end) return Status::Ok();
    Element result;
    result.components.reserve(in.components.size() + 1);
    result.components.push_back(Tensor::scalar<int64_t>(next_));
    for (auto& c : in.components) result.components.push_back(std::move(c));
    // The index has no name, and an element's components are all named or
    // none is (as zip keeps them).
    *out = std::move(result);
    past_max_ = __builtin_add_overflow(next_, 1, &next_);
    return Status::Ok();
  }

  Status save(StateWriter& writer) override {
    writer.begin("enumerate");
    writer.write_int(next_);
    writer.write_bool(past_max_);
    return input_->save(writer);
  }

  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("enumerate"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&next_, start_, INT64_MAX, "the next index"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&past_max_));
    return input_->restore(reader);
  }

 private:
  IteratorPtr input_;
  const int64_t start_;
  int64_t next_;           // the index of the next element
  bool past_max_ = false;  // the last index handed out was INT64_MAX
};

}  // namespace

CAPSTAN_DATASET_OP(kEnumerateKernel) = {
    .which = Op::ENUMERATE,
    .name = "enumerate",
    .inputs = OpKernel::Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getEnumerate().getStart(); },
    .cardinality = input_cardinality,
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      return IteratorPtr(std::make_unique<EnumerateIterator>(std::move(in), op.getEnumerate().getStart()));
    },
};

}  // namespace capstan::data::engine
