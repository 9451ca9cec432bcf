// unbatch(): each input element split along the first dimension of its
// components into that many elements (tf.data's unbatch,
// unbatch_dataset_op.cc). Every component needs rank >= 1 and the same first
// dimension; an input element of first dimension 0 yields nothing.
#include "data/op_kernel.h"
#include "data/ops/common.h"
#include "data/tensor_util.h"

namespace capstan::data::engine {

namespace {

// The common first dimension of `e`'s components; InvalidArgument (TF's
// messages) for a scalar component or differing sizes.
Result<int64_t> batch_size_of(const Element& e) {
  if (e.components.empty()) return Status::InvalidArgument("unbatch: an input element has no components");
  for (size_t i = 0; i < e.components.size(); ++i) {
    if (e.components[i].rank() == 0) {
      return Status::InvalidArgument("unbatch: input element must have a non-scalar value in each component; "
                                     "component " + std::to_string(i) + " is a scalar");
    }
  }
  int64_t size = e.components[0].shape()[0];
  for (size_t i = 1; i < e.components.size(); ++i) {
    int64_t other = e.components[i].shape()[0];
    if (other != size) {
      return Status::InvalidArgument("unbatch: input element must have the same batch size in each component. "
                                     "Component 0 had size " + std::to_string(size) + " but component " +
                                     std::to_string(i) + " had size " + std::to_string(other) + ".");
    }
  }
  return size;
}

class UnbatchIterator final : public IteratorBase {
 public:
  explicit UnbatchIterator(IteratorPtr input) : input_(std::move(input)) {}

  Status get_next(Element* out, bool* end) override {
    while (next_row_ >= rows_) {
      if (input_ == nullptr) {
        *end = true;
        return Status::Ok();
      }
      clear();
      Element in;
      CAPSTAN_RETURN_IF_ERROR(input_->get_next(&in, end));
      if (*end) {
        input_ = nullptr;
        return Status::Ok();
      }
      // An invalid element is dropped with its error (as TF does); the next
      // call reads the input's next element.
      CAPSTAN_ASSIGN_OR_RETURN(int64_t rows, batch_size_of(in));
      CAPSTAN_RETURN_IF_ERROR(split(std::move(in), rows));
    }
    Element result;
    result.names = current_.names;
    result.components.reserve(columns_.size());
    for (auto& column : columns_) result.components.push_back(std::move(column[static_cast<size_t>(next_row_)]));
    ++next_row_;
    if (next_row_ >= rows_) clear();
    *out = std::move(result);
    *end = false;
    return Status::Ok();
  }

  // The element being split (when rows of it are left) and the next row,
  // then the input's position (absent once it ended).
  Status save(StateWriter& writer) override {
    writer.begin("unbatch");
    bool splitting = next_row_ < rows_;
    writer.write_bool(splitting);
    if (splitting) {
      writer.write_element(current_);
      writer.write_int(next_row_);
    }
    return save_optional(writer, input_.get());
  }

  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("unbatch"));
    clear();
    bool splitting = false;
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&splitting));
    if (splitting) {
      Element current;
      CAPSTAN_RETURN_IF_ERROR(reader.read_element(&current));
      auto rows = batch_size_of(current);
      if (!rows.ok()) return rows.status().with_context("unbatch: the saved element");
      int64_t next_row = 0;
      CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&next_row, 0, *rows - 1, "the next row of the saved element"));
      CAPSTAN_RETURN_IF_ERROR(split(std::move(current), *rows));
      next_row_ = next_row;
    }
    bool has_input = false;
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&has_input));
    if (!has_input) {
      input_ = nullptr;
      return Status::Ok();
    }
    if (input_ == nullptr) return Status::InvalidArgument("unbatch: a saved input for an iterator whose input ended");
    return input_->restore(reader);
  }

 private:
  // Makes `e` (of first dimension `rows`) the element being split.
  Status split(Element e, int64_t rows) {
    std::vector<std::vector<Tensor>> columns;
    columns.reserve(e.components.size());
    for (const Tensor& c : e.components) {
      CAPSTAN_ASSIGN_OR_RETURN(auto column, unstack(c));  // rows alias c's buffer
      columns.push_back(std::move(column));
    }
    current_ = std::move(e);
    columns_ = std::move(columns);
    rows_ = rows;
    next_row_ = 0;
    return Status::Ok();
  }
  void clear() {
    current_ = Element();
    columns_.clear();
    rows_ = 0;
    next_row_ = 0;
  }

  IteratorPtr input_;  // null once it ended
  Element current_;    // the input element being split (kept for save)
  std::vector<std::vector<Tensor>> columns_;  // its rows, per component
  int64_t rows_ = 0;   // its first dimension
  int64_t next_row_ = 0;
};

}  // namespace

CAPSTAN_DATASET_OP(kUnbatchKernel) = {
    .which = Op::UNBATCH,
    .name = "unbatch",
    .inputs = Inputs::kOne,
    // As TF: known only when every input element's first dimension is known,
    // here a batch(k, drop_remainder = true) right below; infinite and
    // unknown inputs pass through.
    .cardinality = [](Op::Reader op) -> int64_t {
      auto in = op.getInput();
      if (!in.isBatch() || !in.getBatch().getDropRemainder()) return kUnk;
      int64_t n = input_cardinality(op);
      if (n == kInf || n == kUnk) return n;
      return n * in.getBatch().getBatchSize();
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      return IteratorPtr(std::make_unique<UnbatchIterator>(std::move(in)));
    },
};

}  // namespace capstan::data::engine
