#include "data/ops/common.h"

#include <random>

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

Status BatchingIterator::get_next(Element* out, bool* end) {
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
