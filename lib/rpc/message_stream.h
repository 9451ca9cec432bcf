// MessageStream: the Cap'n Proto message framing over a byte stream, as
// capnp::AsyncIoMessageStream, except that each large received message
// lands in a buffer of its own that tensors may keep: tensor_codec's read
// path makes a large received tensor reference the message's bytes instead
// of copying them ("receive in place").
//
// Why not keep the capnp::Response instead: a Cap'n Proto message must be
// destroyed on its loop's thread, a tensor is released on any thread, maybe
// after the loop has gone. A received buffer is plain memory held by a
// std::shared_ptr: the MessageReader holds one reference, each tensor made
// from it another, and whoever lets go last frees it, on any thread, whether
// or not the loop still runs. Buffers come from the tensor buffer cache, so
// a large message does not fault its pages in afresh each time, and each
// segment starts on a 64-byte boundary, so a tensor's bytes (a segment of
// their own when the sender referenced them) are as aligned as a fresh
// tensor's.
//
// Reads ask for up to 16 KiB at a time, so small messages that arrive
// together cost one read() system call, not two or three each.
//
// Writes are capnp::AsyncIoMessageStream's (the sender side references
// tensor memory already; see tensor_codec.h).
//
// Example (on the loop thread):
//   rpc::MessageStream messages(*stream);
//   capnp::TwoPartyVatNetwork network(messages, capnp::rpc::twoparty::Side::CLIENT, options);
//   ...
//   // in a response handler, `data` a capnp::Data::Reader of the response:
//   std::shared_ptr<void> owner = rpc::received_buffer_holding(data.begin(), data.size());
//
// Thread-safety: a MessageStream is used on its loop's thread;
// received_buffer_holding() may be called on any thread.
#ifndef CAPSTAN_LIB_RPC_MESSAGE_STREAM_H_
#define CAPSTAN_LIB_RPC_MESSAGE_STREAM_H_

#include <capnp/serialize-async.h>
#include <kj/async-io.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace capstan::rpc {

// Received messages of at least this many bytes get a shareable buffer;
// smaller ones are cheaper to copy out of than to keep.
constexpr size_t kShareableMessageBytes = 64 * 1024;

class MessageStream final : public capnp::MessageStream {
 public:
  // `stream` must outlive this object.
  explicit MessageStream(kj::AsyncIoStream& stream);

  using capnp::MessageStream::tryReadMessage;
  using capnp::MessageStream::writeMessage;
  using capnp::MessageStream::writeMessages;

  // Fails (a kj::Exception, which ends the connection) on a message of 512
  // segments or more, or of more words than options.traversalLimitInWords,
  // as Cap'n Proto's own reader does; `scratch_space` is not used.
  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> tryReadMessage(
      kj::ArrayPtr<kj::AutoCloseFd> fd_space, capnp::ReaderOptions options = capnp::ReaderOptions(),
      kj::ArrayPtr<capnp::word> scratch_space = nullptr) override;
  kj::Promise<void> writeMessage(kj::ArrayPtr<const int> fds,
                                 kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) override;
  kj::Promise<void> writeMessages(
      kj::ArrayPtr<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> messages) override;
  kj::Maybe<int> getSendBufferSize() override;
  kj::Promise<void> end() override;

 private:
  // Each read() asks for up to this much: small messages that arrive
  // together are taken from one read; a larger message's bytes past the
  // read-ahead are read straight into its own buffer.
  static constexpr size_t kReadAheadBytes = 16 * 1024;

  // Resolves once at least `bytes` (at most kReadAheadBytes) are buffered,
  // or at the end of the stream, to the number buffered.
  kj::Promise<size_t> fill(size_t bytes);
  // Moves up to `bytes` buffered bytes to `destination`; returns how many.
  size_t take(void* destination, size_t bytes);
  // Fills `destination` with the next `bytes` bytes, buffered ones first.
  kj::Promise<void> read_into(kj::byte* destination, size_t bytes);
  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> read_segments(capnp::ReaderOptions options,
                                                                   kj::Array<uint32_t> sizes);

  kj::AsyncIoStream& stream_;
  capnp::AsyncIoMessageStream writer_;
  kj::Array<kj::byte> buffer_;  // read-ahead: bytes [begin_, end_) not yet taken
  size_t begin_ = 0;
  size_t end_ = 0;
};

// What a connection's reader accepts: `max_message_bytes` of payload (a
// chunk of a tensor may be that large; see tensor_codec.h) plus
// kMessageFramingBytes for the message around it; nesting 64 deep.
constexpr uint64_t kMessageFramingBytes = 64 * 1024;
capnp::ReaderOptions reader_options_for(uint64_t max_message_bytes);

// The buffer of a message received through a MessageStream in this process,
// still held by its MessageReader or by anyone holding a result of this,
// whose bytes contain [begin, begin + size); null if there is none (a
// message below kShareableMessageBytes, a local call whose data is the
// sender's memory, a message that came some other way). Holding the result
// keeps the bytes valid after the message is gone.
std::shared_ptr<void> received_buffer_holding(const void* begin, size_t size);

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_MESSAGE_STREAM_H_
