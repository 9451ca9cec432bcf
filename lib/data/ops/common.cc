#include "data/ops/common.h"

#include <cstring>
#include <random>

#include "data/tensor_util.h"

namespace capstan::data::engine {

namespace {

// make_vector_iterator (common.h).
class VectorIterator final : public IteratorBase {
 public:
  VectorIterator(std::vector<Element> elements, const char* op, bool save_elements = false)
      : elements_(std::move(elements)), op_(op), save_elements_(save_elements) {}
  Status get_next(Element* out, bool* end) override {
    *end = next_ >= elements_.size();
    if (!*end) *out = elements_[next_++];
    return Status::Ok();
  }
  Status save(StateWriter& writer) override {
    writer.begin(op_);
    writer.write_int(static_cast<int64_t>(next_));
    if (save_elements_) write_elements(writer, elements_);
    return Status::Ok();
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin(op_));
    int64_t next = 0;
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&next, 0, INT64_MAX, "the next element's index"));
    if (save_elements_) CAPSTAN_RETURN_IF_ERROR(read_elements(reader, &elements_));
    if (next > static_cast<int64_t>(elements_.size())) {
      return Status::InvalidArgument(std::string(op_) + ": the saved position " + std::to_string(next) +
                                     " is past its " + std::to_string(elements_.size()) + " elements");
    }
    next_ = static_cast<size_t>(next);
    return Status::Ok();
  }

 private:
  std::vector<Element> elements_;
  const char* const op_;
  const bool save_elements_;
  size_t next_ = 0;
};

}  // namespace

io::Compression to_io(Compression c) {
  return c == Compression::kGzip ? io::Compression::kGzip : io::Compression::kNone;
}

Element scalar_element(Tensor t) {
  Element e;
  e.components.push_back(std::move(t));
  return e;
}

Result<Tensor> string_scalar(const std::string& value) { return Tensor::from_strings({value}, {}); }

uint64_t epoch_seed(std::optional<uint64_t> seed, uint64_t epoch) {
  if (!seed) return std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
  // splitmix64 of (seed, epoch): different epochs get unrelated streams.
  uint64_t z = *seed + 0x9e3779b97f4a7c15ull * (epoch + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Status on_splits(const char* op) {
  return Status::FailedPrecondition(std::string(op) +
                                    ": reads splits handed out by a data service dispatcher, which holds its "
                                    "position; an iterator reading splits cannot save or restore one");
}

Status save_through(StateWriter& writer, const char* op, IteratorBase& input) {
  writer.begin(op);
  return input.save(writer);
}
Status restore_through(StateReader& reader, const char* op, IteratorBase& input) {
  CAPSTAN_RETURN_IF_ERROR(reader.begin(op));
  return input.restore(reader);
}

Status save_optional(StateWriter& writer, IteratorBase* input) {
  writer.write_bool(input != nullptr);
  return input != nullptr ? input->save(writer) : Status::Ok();
}

void write_elements(StateWriter& writer, const std::vector<Element>& elements) {
  writer.write_int(static_cast<int64_t>(elements.size()));
  for (const auto& e : elements) writer.write_element(e);
}

Status read_elements(StateReader& reader, std::vector<Element>* elements) {
  int64_t count = 0;
  CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&count, 0, INT64_MAX, "an element count"));
  elements->clear();
  for (int64_t i = 0; i < count; ++i) {
    Element e;
    CAPSTAN_RETURN_IF_ERROR(reader.read_element(&e));
    elements->push_back(std::move(e));
  }
  return Status::Ok();
}

Status charge_all(HeldBytes& held, const std::vector<Element>& elements) {
  for (const auto& e : elements) CAPSTAN_RETURN_IF_ERROR(held.add(footprint(e)));
  return Status::Ok();
}

void EpochCounter::save(StateWriter& writer) { writer.write_int(static_cast<int64_t>(next.load())); }

Status EpochCounter::restore(StateReader& reader) {
  int64_t value = 0;
  CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&value, 0, INT64_MAX, "an epoch count"));
  next = static_cast<uint64_t>(value);
  return Status::Ok();
}

Status collect(IteratorBase& input, int64_t n, std::vector<Element>* batch, bool* end, HeldBytes& held) {
  batch->clear();
  held.clear();
  bool input_end = false;
  while (static_cast<int64_t>(batch->size()) < n) {
    Element e;
    CAPSTAN_RETURN_IF_ERROR(input.get_next(&e, &input_end));
    if (input_end) break;
    Status charged = held.add(footprint(e));
    if (!charged.ok()) {
      batch->clear();
      held.clear();
      return charged;
    }
    batch->push_back(std::move(e));
  }
  *end = batch->empty();
  return Status::Ok();
}

namespace {

// A streamed batch's buffers stay under this (larger batches are collected,
// then stacked: their per-element costs are small beside their copies).
constexpr int64_t kMaxStreamedBatchBytes = int64_t{64} << 20;

bool same_layout(const Element& e, const Element& first) {
  if (e.components.size() != first.components.size()) return false;
  for (size_t c = 0; c < e.components.size(); ++c) {
    const Tensor& t = e.components[c];
    if (!t.valid() || t.dtype() != first.components[c].dtype() || t.shape() != first.components[c].shape()) {
      return false;
    }
  }
  return true;
}

}  // namespace

// Each element is copied into the batch's tensors as it comes and freed
// then, rather than held until the batch is whole: a batch of small
// elements (range().shuffle().batch()) otherwise frees hundreds of small
// allocations in a burst, and the allocator's consolidating them was a
// third of such a pipeline's time. An element whose layout (components,
// dtypes, shapes) differs from the first's, or a string component, sends
// the batch down the collecting path with the rows copied so far, so that
// errors and results are assemble()'s (batch_elements) exactly.
Status BatchingIterator::stream_batch(Element* out, bool* end) {
  held_.clear();
  Element first;
  bool input_end = false;
  CAPSTAN_RETURN_IF_ERROR(next_counted(&first, &input_end));
  if (input_end) {
    *end = true;
    return Status::Ok();
  }
  bool streamable = !first.components.empty();
  int64_t row_bytes = 0;
  for (const Tensor& t : first.components) {
    if (!t.valid() || t.dtype() == DType::kString) streamable = false;
    row_bytes += static_cast<int64_t>(t.byte_size());
  }
  if (!streamable || (row_bytes > 0 && batch_size_ > kMaxStreamedBatchBytes / row_bytes)) {
    std::vector<Element> batch;
    batch.push_back(std::move(first));
    return finish_collected(std::move(batch), out, end);
  }
  std::vector<Tensor> stacked;
  std::vector<size_t> sizes;
  for (const Tensor& t : first.components) {
    Shape shape{batch_size_};
    shape.insert(shape.end(), t.shape().begin(), t.shape().end());
    CAPSTAN_ASSIGN_OR_RETURN(Tensor rows, Tensor::uninitialized(t.dtype(), std::move(shape)));
    stacked.push_back(std::move(rows));
    sizes.push_back(t.byte_size());
  }
  auto copy_row = [&](const Element& e, int64_t row) {
    for (size_t c = 0; c < stacked.size(); ++c) {
      if (sizes[c] > 0) {
        std::memcpy(stacked[c].mutable_data() + static_cast<size_t>(row) * sizes[c], e.components[c].data(),
                    sizes[c]);
      }
    }
  };
  copy_row(first, 0);
  int64_t n = 1;
  while (n < batch_size_) {
    Element e;
    CAPSTAN_RETURN_IF_ERROR(next_counted(&e, &input_end));
    if (input_end) break;
    if (!same_layout(e, first)) {
      // The rows so far back into elements (views of the stacked buffers).
      std::vector<Element> batch(static_cast<size_t>(n));
      for (size_t c = 0; c < stacked.size(); ++c) {
        CAPSTAN_ASSIGN_OR_RETURN(Tensor so_far, slice_rows(stacked[c], 0, n));
        CAPSTAN_ASSIGN_OR_RETURN(std::vector<Tensor> rows, unstack(so_far));
        for (size_t row = 0; row < batch.size(); ++row) batch[row].components.push_back(std::move(rows[row]));
      }
      batch[0].names = first.names;  // batch_elements keeps the first element's names
      batch.push_back(std::move(e));
      return finish_collected(std::move(batch), out, end);
    }
    copy_row(e, n);
    ++n;
  }
  if (n < batch_size_) {
    if (drop_remainder_) {
      *end = true;
      return Status::Ok();
    }
    for (size_t c = 0; c < stacked.size(); ++c) {  // the short last batch
      Shape shape = stacked[c].shape();
      shape[0] = n;
      CAPSTAN_ASSIGN_OR_RETURN(Tensor rows, Tensor::uninitialized(stacked[c].dtype(), std::move(shape)));
      if (rows.byte_size() > 0) std::memcpy(rows.mutable_data(), stacked[c].data(), rows.byte_size());
      stacked[c] = std::move(rows);
    }
  }
  out->components = std::move(stacked);
  out->names = std::move(first.names);
  *end = false;
  return Status::Ok();
}

Status BatchingIterator::next_counted(Element* e, bool* input_end) {
  CAPSTAN_RETURN_IF_ERROR(input_->get_next(e, input_end));
  if (*input_end) return Status::Ok();
  Status charged = held_.add(footprint(*e));
  if (!charged.ok()) held_.clear();  // over the budget: the batch so far is dropped
  return charged;
}

Status BatchingIterator::finish_collected(std::vector<Element> batch, Element* out, bool* end) {
  bool input_end = false;
  while (static_cast<int64_t>(batch.size()) < batch_size_) {
    Element e;
    CAPSTAN_RETURN_IF_ERROR(next_counted(&e, &input_end));
    if (input_end) break;
    batch.push_back(std::move(e));
  }
  if (drop_remainder_ && static_cast<int64_t>(batch.size()) < batch_size_) {
    *end = true;
    return Status::Ok();
  }
  *end = false;
  CAPSTAN_ASSIGN_OR_RETURN(*out, assemble(batch));
  return Status::Ok();
}

Status BatchingIterator::get_next(Element* out, bool* end) {
  if (stacks_rows()) return stream_batch(out, end);
  std::vector<Element> batch;
  // The batch stays counted until the next call (its assembled copy is about
  // as large).
  CAPSTAN_RETURN_IF_ERROR(collect(*input_, batch_size_, &batch, end, held_));
  if (*end) return Status::Ok();
  if (drop_remainder_ && static_cast<int64_t>(batch.size()) < batch_size_) {
    *end = true;
    return Status::Ok();
  }
  CAPSTAN_ASSIGN_OR_RETURN(*out, assemble(batch));
  return Status::Ok();
}

void save_count(StateWriter& writer, const char* op, int64_t count) {
  writer.begin(op);
  writer.write_int(count);
}

Status restore_count(StateReader& reader, const char* op, int64_t* count, int64_t min, const char* what) {
  CAPSTAN_RETURN_IF_ERROR(reader.begin(op));
  return reader.read_int_in(count, min, INT64_MAX, what);
}

IteratorPtr make_vector_iterator(std::vector<Element> elements, const char* op, bool save_elements) {
  return std::make_unique<VectorIterator>(std::move(elements), op, save_elements);
}

Status read_items(StateReader& reader, std::vector<Item>* items) {
  int64_t count = 0;
  CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&count, 0, INT64_MAX, "a buffered element count"));
  for (int64_t i = 0; i < count; ++i) {
    Item item;
    CAPSTAN_RETURN_IF_ERROR(item.restore(reader));
    items->push_back(std::move(item));
  }
  return Status::Ok();
}

}  // namespace capstan::data::engine
