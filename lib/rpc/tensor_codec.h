// Converting Tensor/Element to and from their Cap'n Proto form.
//
// Tiny buffers (under 4 KiB) are copied into the message: cheaper than any
// bookkeeping. Buffers up to `inline_limit` are referenced, not copied, by the
// message, which carries a Lease capability holding the tensor until the
// receiver drops the message. Larger ones stay with the sender: the message
// carries a ByteSource capability that holds a reference to the tensor, and the
// receiver pulls the buffer chunk by chunk, each chunk's reply referencing
// the tensor's memory directly (Orphanage::referenceExternalData). Several
// chunks are in flight at once, so the transfer streams at socket speed, and
// no message exceeds the reader's traversal limit whatever the tensor's
// size.
//
// Receiving: a buffer that fits in one chunk message (the sender's chunk
// size, or the receiver's whole_chunk_limit, which can ask for larger
// chunks) is pulled as one chunk; from 64 KiB up, a received buffer, inline
// or pulled, is kept in place: the tensor references the bytes of the
// message it came in (rpc/message_stream.h keeps them in a buffer any thread
// may release) instead of a copy. Buffers split over several chunks are
// copied chunk by chunk into one fresh buffer.
//
// Must be used on the thread that runs the KJ loop of the message.
#ifndef CAPSTAN_LIB_RPC_TENSOR_CODEC_H_
#define CAPSTAN_LIB_RPC_TENSOR_CODEC_H_

#include <kj/async.h>

#include <cstddef>
#include <cstdint>

#include "capstan/tensor.h"
#include "capstan_schemas/common.capnp.h"

namespace capstan::rpc {

// The largest chunk a ByteSource serves (Cap'n Proto's Data holds < 512 MiB).
constexpr uint32_t kMaxChunkBytes = 256u << 20;

// Sending: each buffer a message references (rather than copies) is a
// segment of the message, and a reader takes fewer than 512 segments
// (Cap'n Proto's limit, which rpc::MessageStream keeps). The writes of one
// message that may carry many tensors share one budget: past it, buffers
// are copied into the message instead.
inline constexpr size_t kMaxReferencedBuffers = 384;
class ReferenceBudget {
 public:
  // Whether one more buffer may be referenced (and counts it).
  bool take() {
    if (left_ == 0) return false;
    --left_;
    return true;
  }

 private:
  size_t left_ = kMaxReferencedBuffers;
};

struct CodecOptions {
  // Sending: buffers up to this size travel inline.
  size_t inline_limit = 256 * 1024;
  // Sending: the budget of the message written (see ReferenceBudget); null
  // for a message that carries one element or tensor (write_element keeps
  // a budget of its own then).
  ReferenceBudget* references = nullptr;
  // Sending: size of each pulled chunk; must leave room under the peer's
  // message limit.
  uint32_t chunk_size = 32u << 20;
  // Receiving: a chunked buffer up to this size is asked for in one chunk,
  // whatever the sender's chunk size (0: the sender's chunks). At most what
  // this side's reader accepts.
  uint32_t whole_chunk_limit = 0;
};

// Chunk sizes for a peer whose reader takes `max_message_bytes` (sending),
// and the whole_chunk_limit of a reader that takes it (receiving; see
// rpc/message_stream.h).
CodecOptions codec_options_for(uint64_t max_message_bytes);

// The options for answering a caller that takes values of up to
// `inline_limit` bytes inline (0: `options` as they are): the answer then
// carries such a value referenced in the message (with its Lease) instead of
// a ByteSource, saving the caller the round trip that pulls it. Honored up
// to kMaxChunkBytes.
CodecOptions answer_codec(CodecOptions options, uint64_t inline_limit);
// `options` with `budget` for the message being written, unless they carry
// a budget already (the enclosing message's, which a part written inside it
// must share).
CodecOptions with_references(CodecOptions options, ReferenceBudget* budget);

wire::DType to_wire(DType dtype);
// kInvalid for an unknown wire value.
DType from_wire(wire::DType dtype);

void write_tensor(wire::Tensor::Builder builder, const Tensor& tensor, const CodecOptions& options);
void write_element(wire::Element::Builder builder, const Element& element,
                   const CodecOptions& options);
// An element's components, each written by `write_component(out, i)`, and
// its names: the frame the element writers above and data::write_element
// (compressed components) share.
template <typename WriteComponent>
void write_element_with(wire::Element::Builder builder, const Element& element, WriteComponent&& write_component) {
  auto components = builder.initComponents(static_cast<unsigned>(element.components.size()));
  for (size_t i = 0; i < element.components.size(); ++i) write_component(components[static_cast<unsigned>(i)], i);
  if (!element.names.empty()) {
    auto names = builder.initNames(static_cast<unsigned>(element.names.size()));
    for (size_t i = 0; i < element.names.size(); ++i) names.set(static_cast<unsigned>(i), element.names[i]);
  }
}

// Self-contained encodings for data at rest (pipeline definitions, cache
// files): the bytes are always copied into the message, never referenced.
void write_tensor_inline(wire::Tensor::Builder builder, const Tensor& tensor);
void write_element_inline(wire::Element::Builder builder, const Element& element);
// InvalidArgument for malformed input, including a chunked tensor.
Result<Tensor> read_tensor_inline(wire::Tensor::Reader reader);
Result<Element> read_element_inline(wire::Element::Reader reader);

// An element as one self-contained byte string (a flat Cap'n Proto message),
// and back (InvalidArgument for bytes that are not one).
std::string element_to_bytes(const Element& element);
Result<Element> element_from_bytes(const std::string& bytes);

// The reader need only stay valid until the call returns: everything the
// promise still needs is copied out or held first. Malformed input (unknown
// dtype, negative dimension, sizes that disagree, bad string offsets, a
// chunk of the wrong size) rejects the promise with InvalidArgument.
// A tensor kept in place shares the message's bytes (reading the same field
// twice gives two tensors over the same bytes) and keeps the whole message's
// buffer alive until it goes: copy a small slice that is kept for long.
// `options`: this side's CodecOptions (whole_chunk_limit); without, the
// sender's chunks.
kj::Promise<Tensor> read_tensor(wire::Tensor::Reader reader);
kj::Promise<Tensor> read_tensor(wire::Tensor::Reader reader, const CodecOptions& options);
kj::Promise<Element> read_element(wire::Element::Reader reader);
kj::Promise<Element> read_element(wire::Element::Reader reader, const CodecOptions& options);

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_TENSOR_CODEC_H_
