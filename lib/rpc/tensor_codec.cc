#include "rpc/tensor_codec.h"

#include <capnp/orphan.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#include "async/status_exception.h"
#include "rpc/message_stream.h"

namespace capstan::rpc {
namespace {

bool word_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % sizeof(capnp::word) == 0; }

// Serves chunks of one tensor. Holding the tensor keeps its buffer alive
// until the receiver releases the capability, which it does only after it
// has received every chunk (or given up), so the zero-copy replies never
// outlive their bytes while they are being written.
class ByteSourceImpl final : public wire::ByteSource::Server {
 public:
  ByteSourceImpl(Tensor tensor, uint32_t chunk_size)
      : tensor_(std::move(tensor)), chunk_size_(chunk_size) {}

 protected:
  kj::Promise<void> read(ReadContext context) override {
    uint64_t index = context.getParams().getIndex();
    uint64_t chunk_size = context.getParams().getChunkSize();
    if (chunk_size == 0) chunk_size = chunk_size_;
    if (chunk_size > kMaxChunkBytes) {
      async::throw_status(Status::InvalidArgument("chunk size " + std::to_string(chunk_size) + " is over the limit of " +
                                           std::to_string(kMaxChunkBytes) + " bytes; ask for smaller chunks"));
    }
    uint64_t begin = index * chunk_size;
    if (begin >= tensor_.byte_size()) {
      async::throw_status(Status::OutOfRange("chunk " + std::to_string(index) + " of " + std::to_string(chunk_size) +
                                      " bytes is past the end of a " + std::to_string(tensor_.byte_size()) +
                                      "-byte buffer"));
    }
    uint64_t size = std::min<uint64_t>(chunk_size, tensor_.byte_size() - begin);
    auto results = context.getResults(capnp::MessageSize{4, 0});
    const auto* bytes = reinterpret_cast<const kj::byte*>(tensor_.data()) + begin;
    if (!word_aligned(bytes)) {
      // A slice of another tensor may start anywhere; Cap'n Proto can only
      // reference word-aligned memory.
      auto data = results.initData(static_cast<unsigned>(size));
      std::memcpy(data.begin(), bytes, size);
      return kj::READY_NOW;
    }
    auto orphanage = capnp::Orphanage::getForMessageContaining(results);
    results.adoptData(orphanage.referenceExternalData(capnp::Data::Reader(bytes, size)));
    return kj::READY_NOW;
  }

 private:
  const Tensor tensor_;
  const uint32_t chunk_size_;
};

// Holds a tensor while a message that references its memory is in flight.
class LeaseImpl final : public wire::Lease::Server {
 public:
  explicit LeaseImpl(Tensor tensor) : tensor_(std::move(tensor)) {}

 private:
  const Tensor tensor_;
};

// Below this size a copy is cheaper than exporting a lease capability.
constexpr size_t kCopyLimit = 4096;

// Chunk reads kept in flight per tensor.
constexpr int kWindow = 3;

// Received buffers at least this large are kept in their message rather
// than copied (below, the copy costs less than looking the buffer up and
// keeping the whole message alive).
constexpr size_t kInPlaceBytes = 64 * 1024;

// Pulls chunks lane, lane + window, ... one after another; `window` lanes
// run at once.
kj::Promise<void> pull_lane(wire::ByteSource::Client source, std::shared_ptr<Tensor> target,
                            uint32_t chunk_size, uint64_t index, uint64_t count, int window) {
  if (index >= count) return kj::READY_NOW;
  auto request = source.readRequest(capnp::MessageSize{4, 0});
  request.setIndex(static_cast<uint32_t>(index));
  request.setChunkSize(chunk_size);
  return request.send().then([source, target, chunk_size, index, count,
                              window](capnp::Response<wire::ByteSource::ReadResults>&& response) mutable {
    auto data = response.getData();
    uint64_t begin = index * chunk_size;
    uint64_t expected = std::min<uint64_t>(chunk_size, target->byte_size() - begin);
    if (data.size() != expected) {
      async::throw_status(Status::InvalidArgument("tensor chunk " + std::to_string(index) + " has " +
                                           std::to_string(data.size()) + " bytes, expected " +
                                           std::to_string(expected)));
    }
    std::memcpy(target->mutable_data() + begin, data.begin(), data.size());
    return pull_lane(kj::mv(source), kj::mv(target), chunk_size, index + window, count, window);
  });
}

// Checks the announced size against dtype and shape.
Status check_size(DType dtype, const Shape& shape, uint64_t byte_size) {
  uint64_t n = static_cast<uint64_t>(shape_num_elements(shape));
  if (dtype == DType::kString) {
    if (n >= std::numeric_limits<uint64_t>::max() / sizeof(uint64_t) ||
        byte_size < (n + 1) * sizeof(uint64_t)) {
      return Status::InvalidArgument("string tensor of shape " + shape_string(shape) + " sent " +
                                     std::to_string(byte_size) + " bytes, too few for its offsets");
    }
  } else if (n > std::numeric_limits<uint64_t>::max() / dtype_size(dtype) ||
             byte_size != n * dtype_size(dtype)) {
    return Status::InvalidArgument(std::string(dtype_name(dtype)) + shape_string(shape) +
                                   " needs " + std::to_string(n * dtype_size(dtype)) +
                                   " bytes, message has " + std::to_string(byte_size));
  }
  return Status::Ok();
}

// Checks the announced size and allocates a raw buffer for it; finish()
// turns the filled buffer into the typed tensor.
Result<std::shared_ptr<Tensor>> allocate_raw(DType dtype, const Shape& shape, uint64_t byte_size) {
  CAPSTAN_RETURN_IF_ERROR(check_size(dtype, shape, byte_size));
  auto raw = Tensor::uninitialized(DType::kUInt8, Shape{static_cast<int64_t>(byte_size)});
  if (!raw.ok()) return raw.status();
  return std::make_shared<Tensor>(std::move(*raw));
}

Result<Tensor> finish(DType dtype, Shape shape, std::shared_ptr<Tensor> raw) {
  std::byte* data = raw->mutable_data();
  size_t size = raw->byte_size();
  return Tensor::from_buffer(dtype, std::move(shape), std::move(raw), data, size);
}

// The tensor over received bytes, in place when they lie in a shareable
// message buffer (rpc/message_stream.h) and are large enough to pay for it,
// else copied into a buffer of its own.
Result<Tensor> receive(DType dtype, Shape shape, capnp::Data::Reader data) {
  if (data.size() >= kInPlaceBytes) {
    if (std::shared_ptr<void> owner = received_buffer_holding(data.begin(), data.size())) {
      CAPSTAN_RETURN_IF_ERROR(check_size(dtype, shape, data.size()));
      auto* bytes = reinterpret_cast<std::byte*>(const_cast<kj::byte*>(data.begin()));
      return Tensor::from_buffer(dtype, std::move(shape), std::move(owner), bytes, data.size());
    }
  }
  auto raw = allocate_raw(dtype, shape, data.size());
  if (!raw.ok()) return raw.status();
  if (data.size() > 0) std::memcpy((*raw)->mutable_data(), data.begin(), data.size());
  return finish(dtype, std::move(shape), std::move(*raw));
}

}  // namespace

CodecOptions codec_options_for(uint64_t max_message_bytes) {
  CodecOptions options;
  // Half the limit leaves ample room for the message around the chunk.
  uint64_t chunk = std::clamp<uint64_t>(max_message_bytes / 2, 1u << 20, 1u << 30);
  options.chunk_size = static_cast<uint32_t>(std::min<uint64_t>(chunk, 8u << 20));
  options.inline_limit = std::min<size_t>(options.inline_limit, options.chunk_size);
  // The reader takes max_message_bytes of payload (rpc/message_stream.h).
  options.whole_chunk_limit = static_cast<uint32_t>(
      std::clamp<uint64_t>(max_message_bytes, options.chunk_size, kMaxChunkBytes));
  return options;
}

CodecOptions answer_codec(CodecOptions options, uint64_t inline_limit) {
  options.inline_limit = std::max<size_t>(options.inline_limit, std::min<uint64_t>(inline_limit, kMaxChunkBytes));
  return options;
}

CodecOptions with_references(CodecOptions options, ReferenceBudget* budget) {
  if (options.references == nullptr) options.references = budget;
  return options;
}

wire::DType to_wire(DType dtype) {
  // The enums share their numbering.
  return static_cast<wire::DType>(static_cast<uint16_t>(dtype));
}

DType from_wire(wire::DType dtype) {
  auto value = static_cast<uint16_t>(dtype);
  if (value > static_cast<uint16_t>(DType::kString)) return DType::kInvalid;
  return static_cast<DType>(value);
}

void write_tensor(wire::Tensor::Builder builder, const Tensor& tensor,
                  const CodecOptions& options) {
  builder.setDtype(to_wire(tensor.dtype()));
  auto shape = builder.initShape(static_cast<unsigned>(tensor.shape().size()));
  for (size_t i = 0; i < tensor.shape().size(); ++i) shape.set(static_cast<unsigned>(i), tensor.shape()[i]);
  const auto* bytes = reinterpret_cast<const kj::byte*>(tensor.data());
  const bool inline_bytes = tensor.byte_size() <= options.inline_limit;
  if (tensor.byte_size() < kCopyLimit || (inline_bytes && !word_aligned(bytes)) ||
      (inline_bytes && options.references != nullptr && !options.references->take())) {
    auto data = builder.initInline(static_cast<unsigned>(tensor.byte_size()));
    if (tensor.byte_size() > 0) std::memcpy(data.begin(), bytes, tensor.byte_size());
    return;
  }
  if (inline_bytes) {
    auto orphanage = capnp::Orphanage::getForMessageContaining(builder);
    builder.adoptInline(
        orphanage.referenceExternalData(capnp::Data::Reader(bytes, tensor.byte_size())));
    builder.setLease(kj::heap<LeaseImpl>(tensor));
    return;
  }
  auto chunked = builder.initChunked();
  chunked.setByteSize(tensor.byte_size());
  chunked.setChunkSize(options.chunk_size);
  chunked.setSource(kj::heap<ByteSourceImpl>(tensor, options.chunk_size));
}

void write_element(wire::Element::Builder builder, const Element& element,
                   const CodecOptions& options) {
  // An element may have many components: without the message's budget, it
  // has one of its own.
  ReferenceBudget own;
  const CodecOptions codec = with_references(options, &own);
  write_element_with(builder, element, [&](wire::Tensor::Builder out, size_t i) {
    write_tensor(out, element.components[i], codec);
  });
}

namespace {

// Checks dtype and shape of an incoming tensor.
Status read_header(wire::Tensor::Reader reader, DType* dtype, Shape* shape) {
  *dtype = from_wire(reader.getDtype());
  if (*dtype == DType::kInvalid) {
    return Status::InvalidArgument("tensor has unknown dtype " +
                                   std::to_string(static_cast<uint16_t>(reader.getDtype())));
  }
  shape->reserve(reader.getShape().size());
  for (int64_t d : reader.getShape()) {
    if (d < 0) return Status::InvalidArgument("tensor dimension " + std::to_string(d) + " is negative");
    shape->push_back(d);
  }
  if (shape_num_elements(*shape) < 0) {
    return Status::InvalidArgument("tensor shape " + shape_string(*shape) + " has too many elements");
  }
  return Status::Ok();
}

// A self-contained tensor: always a copy, never the message's bytes.
Result<Tensor> read_inline(DType dtype, Shape shape, capnp::Data::Reader data) {
  auto raw = allocate_raw(dtype, shape, data.size());
  if (!raw.ok()) return raw.status();
  if (data.size() > 0) std::memcpy((*raw)->mutable_data(), data.begin(), data.size());
  return finish(dtype, std::move(shape), std::move(*raw));
}

// The whole buffer in one chunk, kept in place where it can be.
kj::Promise<Tensor> pull_whole(wire::ByteSource::Client source, DType dtype, Shape shape, uint64_t byte_size) {
  auto request = source.readRequest(capnp::MessageSize{4, 0});
  request.setIndex(0);
  request.setChunkSize(static_cast<uint32_t>(byte_size));
  return request.send().then([dtype, shape = std::move(shape), byte_size](
                                 capnp::Response<wire::ByteSource::ReadResults>&& response) mutable
                             -> kj::Promise<Tensor> {
    auto data = response.getData();
    if (data.size() != byte_size) {
      return async::to_exception(Status::InvalidArgument("tensor chunk 0 has " + std::to_string(data.size()) +
                                                  " bytes, expected " + std::to_string(byte_size)));
    }
    auto tensor = receive(dtype, std::move(shape), data);
    if (!tensor.ok()) return async::to_exception(tensor.status());
    return std::move(*tensor);
  });
}

}  // namespace

void write_tensor_inline(wire::Tensor::Builder builder, const Tensor& tensor) {
  builder.setDtype(to_wire(tensor.dtype()));
  auto shape = builder.initShape(static_cast<unsigned>(tensor.shape().size()));
  for (size_t i = 0; i < tensor.shape().size(); ++i) shape.set(static_cast<unsigned>(i), tensor.shape()[i]);
  auto data = builder.initInline(static_cast<unsigned>(tensor.byte_size()));
  if (tensor.byte_size() > 0) std::memcpy(data.begin(), tensor.data(), tensor.byte_size());
}

void write_element_inline(wire::Element::Builder builder, const Element& element) {
  write_element_with(builder, element,
                     [&](wire::Tensor::Builder out, size_t i) { write_tensor_inline(out, element.components[i]); });
}

Result<Tensor> read_tensor_inline(wire::Tensor::Reader reader) {
  DType dtype;
  Shape shape;
  CAPSTAN_RETURN_IF_ERROR(read_header(reader, &dtype, &shape));
  if (!reader.isInline()) return Status::InvalidArgument("tensor is not stored inline");
  try {
    return read_inline(dtype, std::move(shape), reader.getInline());
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("cannot allocate a tensor of shape " + shape_string(shape));
  }
}

Result<Element> read_element_inline(wire::Element::Reader reader) {
  auto components = reader.getComponents();
  auto names = reader.getNames();
  if (names.size() != 0 && names.size() != components.size()) {
    return Status::InvalidArgument("element has " + std::to_string(names.size()) + " names for " +
                                   std::to_string(components.size()) + " components");
  }
  Element element;
  for (auto name : names) element.names.emplace_back(name.cStr(), name.size());
  for (auto component : components) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor t, read_tensor_inline(component));
    element.components.push_back(std::move(t));
  }
  return element;
}

std::string element_to_bytes(const Element& element) {
  capnp::MallocMessageBuilder message;
  write_element_inline(message.initRoot<wire::Element>(), element);
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

Result<Element> element_from_bytes(const std::string& bytes) {
  if (bytes.size() % sizeof(capnp::word) != 0 || bytes.empty()) {
    return Status::InvalidArgument("not a serialized element (" + std::to_string(bytes.size()) + " bytes)");
  }
  auto words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  try {
    // Each word of a written element is read once; a budget of a small
    // multiple of the size refuses bytes whose pointers share targets (a
    // damaged or crafted cache file that would expand into far more memory
    // than it occupies).
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 4 * words.size() + 1024;
    capnp::FlatArrayMessageReader reader(words, options);
    return read_element_inline(reader.getRoot<wire::Element>());
  } catch (const kj::Exception& e) {
    return Status::InvalidArgument(std::string("malformed element: ") + e.getDescription().cStr());
  }
}

kj::Promise<Tensor> read_tensor(wire::Tensor::Reader reader) { return read_tensor(reader, CodecOptions{}); }

kj::Promise<Tensor> read_tensor(wire::Tensor::Reader reader, const CodecOptions& options) {
  DType dtype;
  Shape shape;
  Status header = read_header(reader, &dtype, &shape);
  if (!header.ok()) return async::to_exception(header);
  try {
    if (reader.isInline()) {
      auto tensor = receive(dtype, std::move(shape), reader.getInline());
      if (!tensor.ok()) return async::to_exception(tensor.status());
      return std::move(*tensor);
    }
    auto chunked = reader.getChunked();
    uint64_t byte_size = chunked.getByteSize();
    uint32_t chunk_size = chunked.getChunkSize();
    if (chunk_size == 0) {
      return async::to_exception(Status::InvalidArgument("chunked tensor has chunk size 0"));
    }
    uint64_t whole_limit = std::min<uint64_t>(std::max(chunk_size, options.whole_chunk_limit), kMaxChunkBytes);
    if (byte_size > 0 && byte_size <= whole_limit) {
      Status size = check_size(dtype, shape, byte_size);
      if (!size.ok()) return async::to_exception(size);
      return pull_whole(chunked.getSource(), dtype, std::move(shape), byte_size);
    }
    auto raw = allocate_raw(dtype, shape, byte_size);
    if (!raw.ok()) return async::to_exception(raw.status());
    auto target = std::move(*raw);
    uint64_t count = (byte_size + chunk_size - 1) / chunk_size;
    auto source = chunked.getSource();
    auto lanes = kj::heapArrayBuilder<kj::Promise<void>>(kWindow);
    for (int lane = 0; lane < kWindow; ++lane) {
      lanes.add(pull_lane(source, target, chunk_size, static_cast<uint64_t>(lane), count, kWindow));
    }
    return kj::joinPromises(lanes.finish())
        .then([dtype, shape = std::move(shape), target]() mutable -> kj::Promise<Tensor> {
          auto tensor = finish(dtype, std::move(shape), std::move(target));
          if (!tensor.ok()) return async::to_exception(tensor.status());
          return std::move(*tensor);
        });
  } catch (const std::bad_alloc&) {
    return async::to_exception(Status::ResourceExhausted("cannot allocate a tensor of shape " +
                                                  shape_string(shape)));
  }
}

kj::Promise<Element> read_element(wire::Element::Reader reader) { return read_element(reader, CodecOptions{}); }

kj::Promise<Element> read_element(wire::Element::Reader reader, const CodecOptions& options) {
  auto components = reader.getComponents();
  auto names = reader.getNames();
  if (names.size() != 0 && names.size() != components.size()) {
    return async::to_exception(Status::InvalidArgument(
        "element has " + std::to_string(names.size()) + " names for " +
        std::to_string(components.size()) + " components"));
  }
  auto element = std::make_shared<Element>();
  for (auto name : names) element->names.emplace_back(name.cStr(), name.size());
  element->components.resize(components.size());
  auto reads = kj::heapArrayBuilder<kj::Promise<void>>(components.size());
  for (unsigned i = 0; i < components.size(); ++i) {
    reads.add(read_tensor(components[i], options).then([element, i](Tensor&& t) {
      element->components[i] = std::move(t);
    }));
  }
  return kj::joinPromises(reads.finish()).then([element]() { return std::move(*element); });
}

}  // namespace capstan::rpc
