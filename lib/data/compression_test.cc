// Compression on the wire (data/compression.h): the codec's round trip for
// every dtype, the frames a reader refuses, the compression option's
// values, and the rules that pick what travels compressed.
#include <catch2/catch.hpp>

#include <capnp/message.h>
#include <kj/async.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "data/compression.h"
#include "async/status_exception.h"

namespace capstan::data {
namespace {

Tensor repeated(DType dtype, Shape shape) {
  Tensor t = Tensor::zeros(dtype, std::move(shape)).value();
  // A pattern that compresses (and is a valid value for bool).
  for (size_t i = 0; i < t.byte_size(); ++i) {
    t.mutable_data()[i] = static_cast<std::byte>(dtype == DType::kBool ? (i / 7) % 2 : (i % 13));
  }
  return t;
}

Tensor random_bytes(size_t n, uint32_t seed) {
  Tensor t = Tensor::uninitialized(DType::kUInt8, Shape{static_cast<int64_t>(n)}).value();
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) t.mutable_data()[i] = static_cast<std::byte>(rng());
  return t;
}

Tensor census_lines(int n) {
  std::vector<std::string> lines;
  for (int i = 0; i < n; ++i) {
    lines.push_back(std::to_string(20 + i % 50) +
                    ", Private, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, "
                    "0, 40, United-States, <=50K");
  }
  return Tensor::from_strings(lines, Shape{n}).value();
}

Result<Tensor> round_trip(const Tensor& t) {
  CAPSTAN_ASSIGN_OR_RETURN(Frame frame, compress_tensor(t));
  uint64_t reply = 0;
  return decompress_tensor(t.dtype(), t.shape(), wire::Codec::ZSTD, frame.raw_size, frame.data(), frame.size, &reply);
}

TEST_CASE("compressed tensors of every dtype decompress to the same tensor", "[data][compression]") {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kInt8,
                      DType::kInt16, DType::kInt32, DType::kInt64, DType::kUInt8, DType::kBool}) {
    INFO(dtype_name(dtype));
    Tensor t = repeated(dtype, Shape{37, 11});
    auto back = round_trip(t);
    REQUIRE(back.ok());
    CHECK(back->equals(t));
  }
  Tensor strings = Tensor::from_strings({"", "a", std::string(5000, 'x'), "tf.data"}, Shape{2, 2}).value();
  auto back = round_trip(strings);
  REQUIRE(back.ok());
  CHECK(back->equals(strings));
  CHECK(back->string_at(2) == std::string(5000, 'x'));
}

TEST_CASE("empty tensors and scalars survive compression", "[data][compression]") {
  for (const Tensor& t : {Tensor::zeros(DType::kFloat32, Shape{0, 5}).value(),
                          Tensor::from_strings({}, Shape{0}).value(), Tensor::scalar<int64_t>(42),
                          Tensor::from_strings({""}, Shape{}).value()}) {
    INFO(t.debug_string());
    auto back = round_trip(t);
    REQUIRE(back.ok());
    CHECK(back->equals(t));
  }
}

TEST_CASE("a reader refuses frames that lie about their size, are corrupt or too large", "[data][compression]") {
  Tensor t = repeated(DType::kFloat32, Shape{1024});
  Frame frame = compress_tensor(t).value();
  auto decode = [](DType dtype, const Shape& shape, uint64_t raw, const std::vector<kj::byte>& bytes,
                         wire::Codec codec = wire::Codec::ZSTD, uint64_t already = 0) {
    uint64_t reply = already;
    return decompress_tensor(dtype, shape, codec, raw, bytes.data(), bytes.size(), &reply).status();
  };
  std::vector<kj::byte> good(frame.data(), frame.data() + frame.size);

  SECTION("raw size other than dtype x shape") {
    Status s = decode(DType::kFloat32, Shape{1024}, 4095, good);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("announces 4095 bytes; it has 4096"));
  }
  SECTION("shape that does not match the frame's content") {
    Status s = decode(DType::kFloat32, Shape{512}, 2048, good);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("frame holds 4096 bytes; its header announces 2048"));
  }
  SECTION("string tensor too small for its offsets") {
    Status s = decode(DType::kString, Shape{1000}, 16, good);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("too few for its offsets"));
  }
  SECTION("string offsets out of range") {
    // A frame of the right size whose "offsets" point past the end.
    Tensor bogus = Tensor::zeros(DType::kUInt8, Shape{24}).value();
    bogus.mutable_data()[8] = std::byte{200};
    Frame f = compress_tensor(bogus).value();
    uint64_t reply = 0;
    Status s = decompress_tensor(DType::kString, Shape{2}, wire::Codec::ZSTD, 24, f.data(), f.size, &reply).status();
    CHECK(s.code() == StatusCode::kInvalidArgument);
  }
  SECTION("over the reader's per-frame limit: refused before decompressing (no bomb)") {
    int64_t n = static_cast<int64_t>(kMaxFrameRawBytes / 4) + 1;
    Status s = decode(DType::kFloat32, Shape{n}, static_cast<uint64_t>(n) * 4, good);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("over the reader's limit"));
  }
  SECTION("over the reply's limit") {
    Status s = decode(DType::kFloat32, Shape{1024}, 4096, good, wire::Codec::ZSTD, kMaxReplyRawBytes - 100);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("of one reply"));
  }
  SECTION("corrupt bytes, truncated frames, no frame at all") {
    std::vector<kj::byte> flipped = good;
    flipped[flipped.size() / 2] ^= 0xff;
    flipped[flipped.size() - 1] ^= 0x5a;
    Status s = decode(DType::kFloat32, Shape{1024}, 4096, flipped);
    // Either zstd notices, or the bytes decode to something of the right
    // size; never a crash. Truncation and garbage are always caught.
    if (!s.ok()) CHECK(s.code() == StatusCode::kInvalidArgument);
    std::vector<kj::byte> truncated(good.begin(), good.begin() + static_cast<long>(good.size() / 2));
    s = decode(DType::kFloat32, Shape{1024}, 4096, truncated);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    s = decode(DType::kFloat32, Shape{1024}, 4096, std::vector<kj::byte>(64, 0x42));
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("not a zstd frame"));
    s = decode(DType::kFloat32, Shape{1024}, 4096, {});
    CHECK(s.code() == StatusCode::kInvalidArgument);
  }
  SECTION("an unknown codec") {
    Status s = decode(DType::kFloat32, Shape{1024}, 4096, good, static_cast<wire::Codec>(7));
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("unknown codec 7"));
  }
}

TEST_CASE("the compression option takes TF's values and names the accepted ones otherwise", "[data][compression]") {
  CHECK(parse_compression("AUTO").value() == wire::ElementCompression::AUTO);
  CHECK(parse_compression("").value() == wire::ElementCompression::AUTO);
  CHECK(parse_compression("none").value() == wire::ElementCompression::NONE);
  CHECK(parse_compression("Zstd").value() == wire::ElementCompression::ZSTD);
  auto bad = parse_compression("gzip");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("'gzip'") && Catch::Contains("AUTO") &&
                                         Catch::Contains("NONE") && Catch::Contains("ZSTD"));
  CHECK(compression_name(wire::ElementCompression::ZSTD) == "ZSTD");
}

Element element_of(std::vector<Tensor> tensors) {
  Element e;
  e.components = std::move(tensors);
  return e;
}

int compressed_count(const std::vector<ElementFrames>& frames) {
  int n = 0;
  for (const auto& f : frames) {
    for (const auto& c : f) n += c != nullptr;
  }
  return n;
}

TEST_CASE("NONE sends raw, ZSTD compresses what shrinks, AUTO what pays and never to a local consumer",
          "[data][compression]") {
  std::vector<Element> batch;
  for (int i = 0; i < 4; ++i) {
    batch.push_back(element_of({census_lines(64), Tensor::scalar<int64_t>(i), random_bytes(8192, i)}));
  }
  WireCompressor none(wire::ElementCompression::NONE);
  CHECK_FALSE(none.active(false));
  CHECK(compressed_count(none.frames(batch, false)) == 0);

  // ZSTD: the lines (they shrink), not the scalar (too small to try) nor the
  // random bytes (they do not shrink).
  WireCompressor zstd(wire::ElementCompression::ZSTD);
  auto frames = zstd.frames(batch, /*local_consumer=*/true);
  REQUIRE(frames.size() == 4);
  for (const auto& f : frames) {
    REQUIRE(f.size() == 3);
    CHECK(f[0] != nullptr);
    CHECK(f[1] == nullptr);
    CHECK(f[2] == nullptr);
  }

  WireCompressor automatic(wire::ElementCompression::AUTO);
  CHECK_FALSE(automatic.active(/*local_consumer=*/true));
  CHECK(compressed_count(automatic.frames(batch, true)) == 0);
  CHECK(compressed_count(automatic.frames(batch, false)) == 4);
}

TEST_CASE("AUTO stops compressing a task whose tensors do not shrink, and resumes when they do",
          "[data][compression]") {
  WireCompressor automatic(wire::ElementCompression::AUTO);
  uint32_t seed = 1;
  std::vector<Element> noise;
  for (int i = 0; i < kAutoProbeTensors; ++i) noise.push_back(element_of({random_bytes(4096, seed++)}));
  CHECK(compressed_count(automatic.frames(noise, false)) == 0);
  CHECK_FALSE(automatic.auto_compressing());
  // Compressible data again: the occasional probe notices and the decayed
  // ratio turns the verdict back (within a few hundred tensors).
  std::vector<Element> lines;
  for (int i = 0; i < 64; ++i) lines.push_back(element_of({census_lines(64)}));
  for (int round = 0; round < 40 && !automatic.auto_compressing(); ++round) automatic.frames(lines, false);
  CHECK(automatic.auto_compressing());
  CHECK(compressed_count(automatic.frames(lines, false)) == 64);
}

TEST_CASE("elements with compressed components cross a message and read back identical", "[data][compression]") {
  kj::EventLoop loop;
  kj::WaitScope wait(loop);
  Element element = element_of({census_lines(128), Tensor::scalar<int64_t>(7), repeated(DType::kFloat32, Shape{2048})});
  element.names = {"lines", "id", "features"};
  WireCompressor zstd(wire::ElementCompression::ZSTD);
  auto frames = zstd.frames({element}, false);
  REQUIRE(compressed_count(frames) == 2);

  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<wire::Element>();
  write_element(root, element, frames[0], rpc::CodecOptions{});
  CHECK(root.getComponents()[0].isCompressed());
  CHECK(root.getComponents()[1].isInline());
  CHECK(root.getComponents()[2].isCompressed());
  CHECK(message.sizeInWords() * sizeof(capnp::word) < element.byte_size() / 4);

  uint64_t reply = 0;
  Element back = read_element(root.asReader(), &reply).wait(wait);
  CHECK(back.equals(element));
  CHECK(back.names == element.names);
  CHECK(reply == element.components[0].byte_size() + element.components[2].byte_size());

  // A damaged frame in a message is the element's InvalidArgument.
  auto data = root.getComponents()[0].getCompressed().getData();
  std::memset(data.begin(), 0x42, 8);
  reply = 0;
  try {
    read_element(root.asReader(), &reply).wait(wait);
    FAIL("a damaged frame was accepted");
  } catch (const kj::Exception& e) {
    Status s = async::from_exception(e);
    CHECK(s.code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("is_local_address knows loopback and this host, not other hosts", "[data][compression]") {
  CHECK(is_local_address("127.0.0.1:5000"));
  CHECK(is_local_address("localhost:5000"));
  CHECK(is_local_address("[::1]:5000"));
  CHECK_FALSE(is_local_address("192.0.2.7:5000"));   // TEST-NET-1: never a local interface
  CHECK_FALSE(is_local_address("data-worker-3.example:5000"));
  CHECK_FALSE(is_local_address("not an address"));
}

}  // namespace
}  // namespace capstan::data
