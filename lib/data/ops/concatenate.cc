// concatenate(other): the elements of the first input, then of the
// second (which must have the same structure).
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

class ConcatenateIterator final : public IteratorBase {
 public:
  explicit ConcatenateIterator(std::vector<IteratorFactory> inputs) : inputs_(std::move(inputs)) {}
  Status get_next(Element* out, bool* end) override {
    while (next_ < inputs_.size() || current_ != nullptr) {
      if (current_ == nullptr) {
        CAPSTAN_ASSIGN_OR_RETURN(current_, inputs_[next_++]());
      }
      CAPSTAN_RETURN_IF_ERROR(current_->get_next(out, end));
      if (*end) {
        current_ = nullptr;
        continue;
      }
      // The datasets must yield the same structure (TF checks the types).
      if (signature_.empty()) {
        for (const auto& c : out->components) signature_.push_back(c.dtype());
      } else {
        std::vector<DType> got;
        for (const auto& c : out->components) got.push_back(c.dtype());
        if (got != signature_) {
          return Status::InvalidArgument(
              "concatenate: the datasets have different element types (" +
              std::to_string(signature_.size()) + " vs " + std::to_string(got.size()) +
              " components, or different dtypes)");
        }
      }
      return Status::Ok();
    }
    *end = true;
    return Status::Ok();
  }

  Status save(StateWriter& writer) override {
    writer.begin("concatenate");
    writer.write_int(static_cast<int64_t>(next_));
    writer.write_int(static_cast<int64_t>(signature_.size()));
    for (DType d : signature_) writer.write_int(static_cast<int64_t>(d));
    return save_optional(writer, current_.get());
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("concatenate"));
    int64_t next = 0;
    int64_t components = 0;
    bool has_current = false;
    CAPSTAN_RETURN_IF_ERROR(
        reader.read_int_in(&next, 0, static_cast<int64_t>(inputs_.size()), "the next dataset's index"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&components, 0, 1 << 16, "a component count"));
    signature_.clear();
    for (int64_t i = 0; i < components; ++i) {
      int64_t dtype = 0;
      CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&dtype, 0, 255, "a dtype"));
      signature_.push_back(static_cast<DType>(dtype));
    }
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&has_current));
    next_ = static_cast<size_t>(next);
    if (!has_current) return Status::Ok();
    if (next_ == 0) return Status::InvalidArgument("concatenate: the saved state reads a dataset before the first");
    CAPSTAN_ASSIGN_OR_RETURN(current_, inputs_[next_ - 1]());
    return current_->restore(reader);
  }

 private:
  const std::vector<IteratorFactory> inputs_;
  size_t next_ = 0;
  IteratorPtr current_;
  std::vector<DType> signature_;
};

}  // namespace

CAPSTAN_DATASET_OP(kConcatenateKernel) = {
    .which = Op::CONCATENATE,
    .name = "concatenate",
    .inputs = Inputs::kMany,
    .cardinality = [](Op::Reader op) -> int64_t {
      int64_t total = 0;
      for (auto in : op.getInputs()) {
        int64_t n = cardinality_of(in);
        if (n == kInf) return kInf;
        if (n == kUnk) return kUnk;
        total += n;
      }
      return total;
    },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      if (op.getInputs().size() != 2) return invalid_op(op, "needs two datasets");
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      std::vector<IteratorFactory> inputs;
      for (auto in : op.getInputs()) inputs.push_back(input_factory(in, pipeline));
      return IteratorPtr(std::make_unique<ConcatenateIterator>(std::move(inputs)));
    },
};

}  // namespace capstan::data::engine
