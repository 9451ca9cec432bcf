#include "io/crc32c.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace capstan::io {
namespace {

uint32_t crc_of(const std::string& s) { return crc32c(s.data(), s.size()); }

TEST_CASE("crc32c matches the standard check value of \"123456789\"") {
  CHECK(crc_of("123456789") == 0xE3069283u);
}

TEST_CASE("crc32c of the empty string is zero") {
  CHECK(crc32c("", 0) == 0u);
  CHECK(crc32c_extend(0x12345678u, nullptr, 0) == 0x12345678u);
}

// The vectors of RFC 3720 (iSCSI), as LevelDB's crc32c_test uses them.
TEST_CASE("crc32c matches the RFC 3720 test vectors") {
  std::vector<uint8_t> buf(32, 0);
  CHECK(crc32c(buf.data(), buf.size()) == 0x8A9136AAu);

  buf.assign(32, 0xff);
  CHECK(crc32c(buf.data(), buf.size()) == 0x62A8AB43u);

  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
  CHECK(crc32c(buf.data(), buf.size()) == 0x46DD794Eu);

  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
  CHECK(crc32c(buf.data(), buf.size()) == 0x113FDB5Cu);

  const uint8_t iscsi_read_command[48] = {
      0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
      0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  };
  CHECK(crc32c(iscsi_read_command, sizeof(iscsi_read_command)) == 0xD9963A56u);
}

TEST_CASE("crc32c distinguishes different strings") {
  CHECK(crc_of("a") != crc_of("foo"));
}

TEST_CASE("crc32c_extend continues a CRC over concatenated data") {
  CHECK(crc_of("hello world") == crc32c_extend(crc_of("hello "), "world", 5));
  // Every split point of a longer string, crossing word boundaries.
  std::string text = "The quick brown fox jumps over the lazy dog, twice over.";
  uint32_t whole = crc_of(text);
  for (size_t split = 0; split <= text.size(); ++split) {
    uint32_t head = crc32c(text.data(), split);
    CHECK(crc32c_extend(head, text.data() + split, text.size() - split) == whole);
  }
}

TEST_CASE("crc32c_mask and crc32c_unmask are inverse and change the value") {
  uint32_t crc = crc_of("foo");
  CHECK(crc != crc32c_mask(crc));
  CHECK(crc != crc32c_mask(crc32c_mask(crc)));
  CHECK(crc == crc32c_unmask(crc32c_mask(crc)));
  CHECK(crc == crc32c_unmask(crc32c_unmask(crc32c_mask(crc32c_mask(crc)))));
}

// The masked CRCs TensorFlow wrote for the record "The Quick Brown Fox".
TEST_CASE("crc32c_mask matches the masked CRCs in a TensorFlow TFRecord") {
  const uint8_t length_bytes[8] = {19, 0, 0, 0, 0, 0, 0, 0};
  CHECK(crc32c_mask(crc32c(length_bytes, 8)) == 0x1B32910Cu);
  CHECK(crc32c_mask(crc_of("The Quick Brown Fox")) == 0x3AE80D18u);
}

TEST_CASE("the SSE4.2 and table-driven CRC32C agree on random data") {
#if defined(__x86_64__)
  // Every x86-64 CPU made since 2009 has SSE4.2; without it this compares
  // the portable code with itself.
  REQUIRE(internal::crc32c_sse42_available());
#endif
  std::mt19937_64 rng(20240611);
  std::vector<uint8_t> data(1 << 16);
  for (auto& byte : data) byte = static_cast<uint8_t>(rng());
  // Every length up to 300 and every start alignment up to 8, then big blocks.
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n <= 300; ++n) {
      uint32_t seed = static_cast<uint32_t>(rng());
      uint32_t portable = internal::crc32c_extend_portable(seed, data.data() + offset, n);
      REQUIRE(internal::crc32c_extend_sse42(seed, data.data() + offset, n) == portable);
      REQUIRE(crc32c_extend(seed, data.data() + offset, n) == portable);
    }
  }
  uint32_t portable = internal::crc32c_extend_portable(0, data.data() + 3, data.size() - 3);
  CHECK(internal::crc32c_extend_sse42(0, data.data() + 3, data.size() - 3) == portable);
  // Around the sizes where the SSE4.2 path runs three streams (3 x 256 and
  // 3 x 8192 bytes) and joins them.
  std::vector<size_t> lengths;
  for (size_t n = 760; n <= 2400; ++n) lengths.push_back(n);
  for (size_t base : {size_t{24576}, size_t{49152}, size_t{3 * 8192 + 3 * 256}}) {
    for (size_t n = base - 20; n <= base + 20; ++n) lengths.push_back(n);
  }
  for (size_t n : lengths) {
    for (size_t offset : {size_t{0}, size_t{5}}) {
      uint32_t seed = static_cast<uint32_t>(rng());
      INFO("length " << n << ", offset " << offset);
      REQUIRE(internal::crc32c_extend_sse42(seed, data.data() + offset, n) ==
              internal::crc32c_extend_portable(seed, data.data() + offset, n));
    }
  }
}

TEST_CASE("each CRC32C implementation alone matches the check value") {
  CHECK(internal::crc32c_extend_portable(0, "123456789", 9) == 0xE3069283u);
  CHECK(internal::crc32c_extend_sse42(0, "123456789", 9) == 0xE3069283u);
}

}  // namespace
}  // namespace capstan::io
