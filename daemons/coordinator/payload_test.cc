// The frame check the coordinator applies to a program's encoded closure
// arguments (payload.h), which it keeps without decoding.
#include "daemons/coordinator/payload.h"

#include <catch2/catch.hpp>

namespace capstan::coordinator {
namespace {

capnp::Data::Reader data_of(const std::string& bytes) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(bytes.data()), bytes.size());
}

std::string encoded_args() {
  Element args;
  args.components.push_back(Tensor::scalar<float>(1.5f));
  args.components.push_back(Tensor::zeros(DType::kInt64, {300}).value());
  return rpc::element_to_bytes(args);
}

TEST_CASE("arguments encoded by element_to_bytes pass the frame check and are kept byte for byte",
          "[coordinator][closures]") {
  const std::string bytes = encoded_args();
  REQUIRE(check_payload_frame(data_of(bytes)).ok());
  CHECK(payload_of(data_of(bytes)) == bytes);
  CHECK(rpc::element_from_bytes(payload_of(data_of(bytes))).value().components.size() == 2);
}

TEST_CASE("a truncated, padded, empty or ragged payload is refused with its size", "[coordinator][closures]") {
  const std::string bytes = encoded_args();
  Status truncated = check_payload_frame(data_of(bytes.substr(0, bytes.size() - 8)));
  CHECK(truncated.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(truncated.message(), Catch::Contains(std::to_string(bytes.size() - 8) + " bytes"));
  Status padded = check_payload_frame(data_of(bytes + std::string(8, '\0')));
  CHECK(padded.code() == StatusCode::kInvalidArgument);
  CHECK(check_payload_frame(data_of("")).code() == StatusCode::kInvalidArgument);
  Status ragged = check_payload_frame(data_of(bytes.substr(0, 13)));
  CHECK(ragged.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(ragged.message(), Catch::Contains("13 bytes"));
}

TEST_CASE("a segment table that claims more segments than fit is refused", "[coordinator][closures]") {
  std::string bytes(16, '\0');
  bytes[0] = '\xff';  // segment count - 1: far more segments than the payload holds
  bytes[1] = '\xff';
  CHECK(check_payload_frame(data_of(bytes)).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a payload past the inline limit is written as an element, and bad bytes are refused",
          "[coordinator][closures]") {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<wire::Element>();
  REQUIRE(write_payload_element(out, encoded_args(), rpc::CodecOptions{}).ok());
  CHECK(out.asReader().getComponents().size() == 2);
  capnp::MallocMessageBuilder other;
  CHECK(write_payload_element(other.initRoot<wire::Element>(), "not an element", rpc::CodecOptions{}).code() ==
        StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace capstan::coordinator
