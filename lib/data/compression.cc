#include "data/compression.h"

#include <arpa/inet.h>
#include <capnp/orphan.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>
#include <new>

#include "rpc/connection.h"
#include "async/status_exception.h"

namespace capstan::data {
namespace {

// zstd contexts are costly to create (hundreds of KiB); one per thread.
struct ZstdContexts {
  ZSTD_CCtx* compress = ZSTD_createCCtx();
  ZSTD_DCtx* decompress = ZSTD_createDCtx();
  ~ZstdContexts() {
    ZSTD_freeCCtx(compress);
    ZSTD_freeDCtx(decompress);
  }
};

ZstdContexts& contexts() {
  thread_local ZstdContexts c;
  return c;
}

// Keeps a reply's frames alive while the message that references them is
// in flight (as rpc/tensor_codec.cc's lease does for raw buffers).
class FrameLease final : public wire::Lease::Server {
 public:
  explicit FrameLease(std::shared_ptr<const Frame> frame) : frame_(std::move(frame)) {}

 private:
  const std::shared_ptr<const Frame> frame_;
};

// Below this a frame is copied into the message: cheaper than a lease.
constexpr size_t kCopyLimit = 4096;

void write_compressed(wire::Tensor::Builder builder, const Tensor& tensor, const std::shared_ptr<const Frame>& frame,
                      const rpc::CodecOptions& options) {
  builder.setDtype(rpc::to_wire(tensor.dtype()));
  auto shape = builder.initShape(static_cast<unsigned>(tensor.shape().size()));
  for (size_t i = 0; i < tensor.shape().size(); ++i) shape.set(static_cast<unsigned>(i), tensor.shape()[i]);
  auto compressed = builder.initCompressed();
  compressed.setCodec(wire::Codec::ZSTD);
  compressed.setRawSize(frame->raw_size);
  if (frame->size < kCopyLimit || (options.references != nullptr && !options.references->take())) {
    auto data = compressed.initData(static_cast<unsigned>(frame->size));
    std::memcpy(data.begin(), frame->data(), frame->size);
    return;
  }
  auto orphanage = capnp::Orphanage::getForMessageContaining(builder);
  compressed.adoptData(orphanage.referenceExternalData(capnp::Data::Reader(frame->data(), frame->size)));
  builder.setLease(kj::heap<FrameLease>(frame));
}

Result<Tensor> read_compressed(wire::Tensor::Reader reader, uint64_t* reply_raw_bytes) {
  DType dtype = rpc::from_wire(reader.getDtype());
  if (dtype == DType::kInvalid) {
    return Status::InvalidArgument("compressed tensor has unknown dtype " +
                                   std::to_string(static_cast<uint16_t>(reader.getDtype())));
  }
  Shape shape;
  for (int64_t d : reader.getShape()) {
    if (d < 0) return Status::InvalidArgument("compressed tensor dimension " + std::to_string(d) + " is negative");
    shape.push_back(d);
  }
  auto compressed = reader.getCompressed();
  auto data = compressed.getData();
  return decompress_tensor(dtype, shape, compressed.getCodec(), compressed.getRawSize(), data.begin(), data.size(),
                           reply_raw_bytes);
}

bool numeric_address_is_local(const std::string& host) {
  in_addr v4{};
  in6_addr v6{};
  bool is_v4 = inet_pton(AF_INET, host.c_str(), &v4) == 1;
  bool is_v6 = !is_v4 && inet_pton(AF_INET6, host.c_str(), &v6) == 1;
  if (!is_v4 && !is_v6) return false;
  if (is_v4 && (ntohl(v4.s_addr) >> 24) == 127) return true;
  if (is_v6 && IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* a = list; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    if (is_v4 && a->ifa_addr->sa_family == AF_INET) {
      found = reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == v4.s_addr;
    } else if (is_v6 && a->ifa_addr->sa_family == AF_INET6) {
      found = std::memcmp(&reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, &v6, sizeof(v6)) == 0;
    }
  }
  freeifaddrs(list);
  return found;
}

}  // namespace

Result<wire::ElementCompression> parse_compression(std::string_view value) {
  std::string upper(value);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (upper.empty() || upper == "AUTO") return wire::ElementCompression::AUTO;
  if (upper == "NONE") return wire::ElementCompression::NONE;
  if (upper == "ZSTD") return wire::ElementCompression::ZSTD;
  return Status::InvalidArgument("compression '" + std::string(value) +
                                 "' is not one of AUTO (the default), NONE, ZSTD");
}

std::string compression_name(wire::ElementCompression compression) {
  switch (compression) {
    case wire::ElementCompression::AUTO: return "AUTO";
    case wire::ElementCompression::NONE: return "NONE";
    case wire::ElementCompression::ZSTD: return "ZSTD";
  }
  return "INVALID(" + std::to_string(static_cast<int>(compression)) + ")";
}

bool known_compression(wire::ElementCompression compression) {
  switch (compression) {
    case wire::ElementCompression::AUTO:
    case wire::ElementCompression::NONE:
    case wire::ElementCompression::ZSTD:
      return true;
  }
  return false;
}

Result<Frame> compress_tensor(const Tensor& tensor, int level) {
  uint64_t raw = tensor.byte_size();
  if (raw > kMaxFrameRawBytes) {
    return Status::ResourceExhausted("a " + std::to_string(raw) + "-byte tensor is over the " +
                                     std::to_string(kMaxFrameRawBytes) + "-byte limit of a compressed frame");
  }
  size_t bound = ZSTD_compressBound(raw);
  Frame frame;
  frame.raw_size = raw;
  try {
    frame.storage = kj::heapArray<capnp::word>((bound + sizeof(capnp::word) - 1) / sizeof(capnp::word));
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("cannot allocate " + std::to_string(bound) + " bytes to compress a tensor");
  }
  size_t n = ZSTD_compressCCtx(contexts().compress, frame.storage.asBytes().begin(), bound, tensor.data(), raw, level);
  if (ZSTD_isError(n)) return Status::Internal(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  frame.size = n;
  return frame;
}

Result<Tensor> decompress_tensor(DType dtype, const Shape& shape, wire::Codec codec, uint64_t raw_size,
                                 const kj::byte* frame, size_t frame_size, uint64_t* reply_raw_bytes) {
  if (codec != wire::Codec::ZSTD) {
    return Status::InvalidArgument("compressed tensor uses unknown codec " + std::to_string(static_cast<int>(codec)) +
                                   " (this reader knows zstd only)");
  }
  int64_t n = shape_num_elements(shape);
  if (n < 0) return Status::InvalidArgument("compressed tensor shape " + shape_string(shape) + " has too many elements");
  const uint64_t count = static_cast<uint64_t>(n);
  if (dtype == DType::kString) {
    if (count >= std::numeric_limits<uint64_t>::max() / sizeof(uint64_t) - 1 ||
        raw_size < (count + 1) * sizeof(uint64_t)) {
      return Status::InvalidArgument("compressed string tensor of shape " + shape_string(shape) + " announces " +
                                     std::to_string(raw_size) + " bytes, too few for its offsets");
    }
  } else if (count > std::numeric_limits<uint64_t>::max() / dtype_size(dtype) ||
             raw_size != count * dtype_size(dtype)) {
    return Status::InvalidArgument("compressed tensor " + std::string(dtype_name(dtype)) + shape_string(shape) +
                                   " announces " + std::to_string(raw_size) + " bytes; it has " +
                                   std::to_string(count * dtype_size(dtype)));
  }
  if (raw_size > kMaxFrameRawBytes) {
    return Status::InvalidArgument("compressed tensor announces " + std::to_string(raw_size) +
                                   " bytes, over the reader's limit of " + std::to_string(kMaxFrameRawBytes) +
                                   " per frame");
  }
  if (*reply_raw_bytes + raw_size > kMaxReplyRawBytes) {
    return Status::InvalidArgument("compressed tensors of one reply announce over " +
                                   std::to_string(kMaxReplyRawBytes) + " bytes, the reader's limit");
  }
  unsigned long long announced = ZSTD_getFrameContentSize(frame, frame_size);
  if (announced == ZSTD_CONTENTSIZE_ERROR) {
    return Status::InvalidArgument("compressed tensor is not a zstd frame (" + std::to_string(frame_size) + " bytes)");
  }
  if (announced != ZSTD_CONTENTSIZE_UNKNOWN && announced != raw_size) {
    return Status::InvalidArgument("compressed tensor's frame holds " + std::to_string(announced) +
                                   " bytes; its header announces " + std::to_string(raw_size));
  }
  *reply_raw_bytes += raw_size;
  try {
    auto buffer = Tensor::uninitialized(DType::kUInt8, Shape{static_cast<int64_t>(raw_size)});
    if (!buffer.ok()) return buffer.status();
    auto owner = std::make_shared<Tensor>(std::move(*buffer));
    std::byte scratch{};
    std::byte* target = raw_size > 0 ? owner->mutable_data() : &scratch;
    size_t got = ZSTD_decompressDCtx(contexts().decompress, target, raw_size, frame, frame_size);
    if (ZSTD_isError(got)) {
      return Status::InvalidArgument(std::string("corrupt compressed tensor: ") + ZSTD_getErrorName(got));
    }
    if (got != raw_size) {
      return Status::InvalidArgument("compressed tensor decompressed to " + std::to_string(got) +
                                     " bytes; its header announces " + std::to_string(raw_size));
    }
    std::byte* data = owner->mutable_data();
    return Tensor::from_buffer(dtype, shape, std::move(owner), data, raw_size);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("cannot allocate " + std::to_string(raw_size) + " bytes for a compressed tensor");
  }
}

// ---- WireCompressor ----------------------------------------------------------------

WireCompressor::WireCompressor(wire::ElementCompression mode, int level) : mode_(mode), level_(level) {}

bool WireCompressor::active(bool local_consumer) const {
  if (mode_ == wire::ElementCompression::ZSTD) return true;
  return mode_ == wire::ElementCompression::AUTO && !local_consumer;
}

bool WireCompressor::auto_compressing() const {
  MutexLock lock(mutex_);
  return compressing_;
}

bool WireCompressor::should_try(size_t bytes) {
  if (bytes > kMaxFrameRawBytes) return false;
  if (mode_ == wire::ElementCompression::ZSTD) return bytes >= kZstdMinBytes;
  if (bytes < kAutoMinBytes) return false;
  MutexLock lock(mutex_);
  if (probed_ < kAutoProbeTensors || compressing_) return true;
  if (++skipped_ < kAutoReprobeEvery) return false;
  skipped_ = 0;
  return true;
}

void WireCompressor::record(uint64_t raw, uint64_t compressed) {
  if (mode_ != wire::ElementCompression::AUTO) return;
  MutexLock lock(mutex_);
  ++probed_;
  probe_raw_ += raw;
  probe_wire_ += compressed;
  // Decay, so that the verdict follows data that changes.
  if (probe_raw_ > (uint64_t{64} << 20)) {
    probe_raw_ /= 2;
    probe_wire_ /= 2;
  }
  if (probed_ >= kAutoProbeTensors) {
    compressing_ = static_cast<double>(probe_wire_) <= kAutoMaxRatio * static_cast<double>(probe_raw_);
  }
}

std::vector<ElementFrames> WireCompressor::frames(const std::vector<Element>& elements, bool local_consumer) {
  std::vector<ElementFrames> out(elements.size());
  if (!active(local_consumer)) return out;
  uint64_t reply_raw = 0;
  // AUTO sends a frame only when it pays; ZSTD whenever it shrinks at all.
  const double keep_ratio = mode_ == wire::ElementCompression::AUTO ? kAutoMaxRatio : 1.0;
  for (size_t e = 0; e < elements.size(); ++e) {
    const auto& components = elements[e].components;
    for (size_t c = 0; c < components.size(); ++c) {
      const Tensor& t = components[c];
      if (reply_raw + t.byte_size() > kMaxReplyRawBytes || !should_try(t.byte_size())) continue;
      auto frame = compress_tensor(t, level_);
      if (!frame.ok()) continue;  // sent raw
      record(frame->raw_size, frame->size);
      if (static_cast<double>(frame->size) >= keep_ratio * static_cast<double>(frame->raw_size)) continue;
      reply_raw += frame->raw_size;
      if (out[e].empty()) out[e].resize(components.size());
      out[e][c] = std::make_shared<const Frame>(std::move(*frame));
    }
  }
  return out;
}

// ---- On the wire ---------------------------------------------------------------------

void write_element(wire::Element::Builder builder, const Element& element, const ElementFrames& frames,
                   const rpc::CodecOptions& options) {
  if (frames.empty()) {
    rpc::write_element(builder, element, options);
    return;
  }
  rpc::ReferenceBudget own;  // as rpc::write_element does without the message's
  const rpc::CodecOptions codec = rpc::with_references(options, &own);
  rpc::write_element_with(builder, element, [&](wire::Tensor::Builder out, size_t i) {
    // A frame is for the tensor it was made from: a component replaced since
    // (say by a shared-memory placeholder) goes as it is now.
    if (i < frames.size() && frames[i] != nullptr && frames[i]->raw_size == element.components[i].byte_size()) {
      write_compressed(out, element.components[i], frames[i], codec);
    } else {
      rpc::write_tensor(out, element.components[i], codec);
    }
  });
}

kj::Promise<Element> read_element(wire::Element::Reader reader, uint64_t* reply_raw_bytes) {
  auto components = reader.getComponents();
  size_t raw_count = 0;
  for (auto component : components) raw_count += component.isCompressed() ? 0 : 1;
  if (raw_count == components.size()) return rpc::read_element(reader);
  auto names = reader.getNames();
  if (names.size() != 0 && names.size() != components.size()) {
    return async::to_exception(Status::InvalidArgument("element has " + std::to_string(names.size()) + " names for " +
                                                     std::to_string(components.size()) + " components"));
  }
  auto element = std::make_shared<Element>();
  for (auto name : names) element->names.emplace_back(name.cStr(), name.size());
  element->components.resize(components.size());
  auto reads = kj::heapArrayBuilder<kj::Promise<void>>(raw_count);
  for (unsigned i = 0; i < components.size(); ++i) {
    if (components[i].isCompressed()) {
      auto tensor = read_compressed(components[i], reply_raw_bytes);
      if (!tensor.ok()) return async::to_exception(tensor.status());
      element->components[i] = std::move(*tensor);
      continue;
    }
    reads.add(rpc::read_tensor(components[i]).then([element, i](Tensor&& t) { element->components[i] = std::move(t); }));
  }
  return kj::joinPromises(reads.finish()).then([element]() { return std::move(*element); });
}

bool is_local_address(const std::string& address) {
  std::string host;
  uint16_t port = 0;
  if (!rpc::parse_host_port(address, &host, &port).ok()) return false;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  std::string lower = host;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "localhost" || lower.ends_with(".localhost")) return true;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0 && lower == std::string(name)) return true;
  return numeric_address_is_local(host);
}

}  // namespace capstan::data
