#include "rpc/message_stream.h"

#include <capnp/message.h>
#include <capnp/serialize-async.h>
#include <catch2/catch.hpp>
#include <capnp/serialize.h>
#include <kj/async-io.h>
#include <kj/io.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "capstan_schemas/common.capnp.h"

namespace capstan::rpc {
namespace {

// A message whose root is a tensor carrying `bytes` inline, byte i = i * 7.
kj::Own<capnp::MallocMessageBuilder> message_of(size_t bytes) {
  auto message = kj::heap<capnp::MallocMessageBuilder>();
  auto data = message->initRoot<wire::Tensor>().initInline(static_cast<unsigned>(bytes));
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<kj::byte>(i * 7);
  return message;
}

struct Pipe {
  kj::AsyncIoContext io = kj::setupAsyncIo();
  kj::TwoWayPipe pipe = io.provider->newTwoWayPipe();
  MessageStream reader{*pipe.ends[1]};
};

capnp::ReaderOptions limit(uint64_t bytes) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = bytes / sizeof(capnp::word);
  return options;
}

std::string failure_of(kj::Promise<kj::Maybe<kj::Own<capnp::MessageReader>>> read, kj::WaitScope& wait_scope) {
  try {
    read.wait(wait_scope);
  } catch (const kj::Exception& e) {
    return e.getDescription().cStr();
  }
  return "";
}

TEST_CASE("messages read through a MessageStream arrive intact, small and large", "[rpc][message-stream]") {
  Pipe p;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{5000}, size_t{64 * 1024}, size_t{3 << 20}}) {
    auto message = message_of(bytes);
    auto write = capnp::writeMessage(*p.pipe.ends[0], *message);
    auto reader = p.reader.readMessage(limit(8 << 20)).wait(p.io.waitScope);
    write.wait(p.io.waitScope);
    auto data = reader->getRoot<wire::Tensor>().getInline();
    REQUIRE(data.size() == bytes);
    bool intact = true;
    for (size_t i = 0; i < bytes; ++i) intact = intact && data[i] == static_cast<kj::byte>(i * 7);
    CHECK(intact);
  }
}

TEST_CASE("messages that arrive together, some of several segments, are read one by one, intact and in order",
          "[rpc][message-stream]") {
  // All the messages go in one write, so each read() returns the end of one
  // message and the start of the next ones (the reader's read-ahead).
  const std::vector<size_t> sizes = {0, 1, 100, 5000, 20000, 70000, 3, 300000, 17, 64 * 1024, 16 * 1024, 9};
  kj::VectorOutputStream all;
  for (size_t i = 0; i < sizes.size(); ++i) {
    // Odd ones in segments of 64 words: the data lands in a segment of
    // its own after a small first one.
    capnp::MallocMessageBuilder message(i % 2 == 1 ? 64 : 1024,
                                        i % 2 == 1 ? capnp::AllocationStrategy::FIXED_SIZE
                                                   : capnp::SUGGESTED_ALLOCATION_STRATEGY);
    auto data = message.initRoot<wire::Tensor>().initInline(static_cast<unsigned>(sizes[i]));
    for (size_t k = 0; k < sizes[i]; ++k) data[k] = static_cast<kj::byte>(k * 7 + i);
    if (i % 2 == 1 && sizes[i] > 1024) REQUIRE(message.getSegmentsForOutput().size() > 1);
    capnp::writeMessage(all, message);
  }
  Pipe p;
  auto bytes = all.getArray();
  auto write = p.pipe.ends[0]->write(bytes.begin(), bytes.size()).then([&p]() { p.pipe.ends[0]->shutdownWrite(); });
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto reader = p.reader.readMessage(limit(8 << 20)).wait(p.io.waitScope);
    auto data = reader->getRoot<wire::Tensor>().getInline();
    REQUIRE(data.size() == sizes[i]);
    bool intact = true;
    for (size_t k = 0; k < sizes[i]; ++k) intact = intact && data[k] == static_cast<kj::byte>(k * 7 + i);
    CHECK(intact);
  }
  write.wait(p.io.waitScope);
  CHECK(p.reader.tryReadMessage(limit(8 << 20)).wait(p.io.waitScope) == nullptr);
}

TEST_CASE("a large message's bytes can be held past its reader, on another thread", "[rpc][message-stream]") {
  Pipe p;
  auto message = message_of(200 * 1024);
  auto write = capnp::writeMessage(*p.pipe.ends[0], *message);
  auto reader = p.reader.readMessage(limit(8 << 20)).wait(p.io.waitScope);
  write.wait(p.io.waitScope);
  auto data = reader->getRoot<wire::Tensor>().getInline();
  std::shared_ptr<void> held = received_buffer_holding(data.begin(), data.size());
  REQUIRE(held != nullptr);
  // Bytes outside any live message are not found.
  kj::byte elsewhere[16] = {};
  CHECK(received_buffer_holding(elsewhere, sizeof(elsewhere)) == nullptr);
  CHECK(received_buffer_holding(data.begin(), data.size() + 64 * 1024) == nullptr);
  const kj::byte* bytes = data.begin();
  reader = nullptr;  // the message is gone, its bytes are not
  CHECK(received_buffer_holding(bytes, 16) == held);
  bool intact = true;
  std::thread other([&held, &intact, bytes]() {
    for (size_t i = 0; i < 200 * 1024; ++i) intact = intact && bytes[i] == static_cast<kj::byte>(i * 7);
    held.reset();  // freed here
  });
  other.join();
  CHECK(intact);
  CHECK(received_buffer_holding(bytes, 16) == nullptr);
}

TEST_CASE("a small message's bytes are not offered for keeping", "[rpc][message-stream]") {
  Pipe p;
  auto message = message_of(kShareableMessageBytes / 2);
  auto write = capnp::writeMessage(*p.pipe.ends[0], *message);
  auto reader = p.reader.readMessage(limit(8 << 20)).wait(p.io.waitScope);
  write.wait(p.io.waitScope);
  auto data = reader->getRoot<wire::Tensor>().getInline();
  CHECK(received_buffer_holding(data.begin(), data.size()) == nullptr);
}

TEST_CASE("a message over the reader's limit is refused before it is read", "[rpc][message-stream][bad-input]") {
  Pipe p;
  auto message = message_of(1 << 20);
  auto write = capnp::writeMessage(*p.pipe.ends[0], *message).eagerlyEvaluate(nullptr);
  CHECK_THAT(failure_of(p.reader.tryReadMessage(limit(512 * 1024)), p.io.waitScope),
             Catch::Contains("Message is too large"));
}

TEST_CASE("a frame of 512 segments or more is refused", "[rpc][message-stream][bad-input]") {
  Pipe p;
  uint32_t header[2] = {600, 1};  // 601 segments
  p.pipe.ends[0]->write(header, sizeof(header)).wait(p.io.waitScope);
  CHECK_THAT(failure_of(p.reader.tryReadMessage(limit(8 << 20)), p.io.waitScope),
             Catch::Contains("too many segments"));
}

TEST_CASE("end of stream between messages is the end, inside one it is an error", "[rpc][message-stream][bad-input]") {
  {
    Pipe p;
    p.pipe.ends[0]->shutdownWrite();
    auto read = p.reader.tryReadMessage(limit(8 << 20)).wait(p.io.waitScope);
    CHECK(read == nullptr);
  }
  {
    Pipe p;
    uint32_t header[2] = {0, 100};  // one segment of 100 words, 3 sent
    p.pipe.ends[0]->write(header, sizeof(header)).wait(p.io.waitScope);
    uint64_t words[3] = {};
    p.pipe.ends[0]->write(words, sizeof(words)).wait(p.io.waitScope);
    p.pipe.ends[0]->shutdownWrite();
    CHECK_FALSE(failure_of(p.reader.tryReadMessage(limit(8 << 20)), p.io.waitScope).empty());
  }
  {
    Pipe p;
    uint32_t half = 3;  // half of the first word
    p.pipe.ends[0]->write(&half, sizeof(half)).wait(p.io.waitScope);
    p.pipe.ends[0]->shutdownWrite();
    CHECK_THAT(failure_of(p.reader.tryReadMessage(limit(8 << 20)), p.io.waitScope), Catch::Contains("EOF"));
  }
}

}  // namespace
}  // namespace capstan::rpc
