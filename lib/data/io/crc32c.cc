#include "data/io/crc32c.h"

#include <array>
#include <bit>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define CAPSTAN_CRC32C_X86 1
#endif

namespace capstan::data::io {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78u;  // Castagnoli, bit-reflected

// kTables[k][b] is the CRC of byte b followed by k zero bytes, which lets the
// portable path consume eight bytes per step (slicing-by-8).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables tables{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? kPolynomial : 0);
    tables[0][b] = crc;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (size_t k = 1; k < 8; ++k) {
      uint32_t previous = tables[k - 1][b];
      tables[k][b] = (previous >> 8) ^ tables[0][previous & 0xff];
    }
  }
  return tables;
}

constexpr Tables kTables = make_tables();

inline uint64_t load_le64(const uint8_t* p) {
  uint64_t word;
  std::memcpy(&word, p, sizeof(word));
  if constexpr (std::endian::native == std::endian::big) word = __builtin_bswap64(word);
  return word;
}

uint32_t extend_portable(uint32_t crc, const uint8_t* p, size_t n) {
  uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word = load_le64(p) ^ c;
    c = kTables[7][word & 0xff] ^ kTables[6][(word >> 8) & 0xff] ^
        kTables[5][(word >> 16) & 0xff] ^ kTables[4][(word >> 24) & 0xff] ^
        kTables[3][(word >> 32) & 0xff] ^ kTables[2][(word >> 40) & 0xff] ^
        kTables[1][(word >> 48) & 0xff] ^ kTables[0][word >> 56];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ kTables[0][(c ^ *p) & 0xff];
  return ~c;
}

#ifdef CAPSTAN_CRC32C_X86

bool cpu_has_sse42() { return __builtin_cpu_supports("sse4.2"); }

// Precondition: cpu_has_sse42().
__attribute__((target("sse4.2"))) uint32_t extend_sse42(uint32_t crc, const uint8_t* p,
                                                         size_t n) {
  uint32_t c = ~crc;
  // Byte steps up to an 8-byte boundary, then whole words.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(c, *p++);
    --n;
  }
#if defined(__x86_64__)
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, sizeof(word));
    c64 = _mm_crc32_u64(c64, word);
  }
  c = static_cast<uint32_t>(c64);
#endif
  for (; n >= 4; n -= 4, p += 4) {
    uint32_t word;
    std::memcpy(&word, p, sizeof(word));
    c = _mm_crc32_u32(c, word);
  }
  for (; n > 0; --n) c = _mm_crc32_u8(c, *p++);
  return ~c;
}

#else  // !CAPSTAN_CRC32C_X86

bool cpu_has_sse42() { return false; }

uint32_t extend_sse42(uint32_t crc, const uint8_t* p, size_t n) {
  return extend_portable(crc, p, n);
}

#endif  // CAPSTAN_CRC32C_X86

}  // namespace

namespace internal {

uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n) {
  return extend_portable(crc, static_cast<const uint8_t*>(data), n);
}

bool crc32c_sse42_available() { return cpu_has_sse42(); }

uint32_t crc32c_extend_sse42(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  return cpu_has_sse42() ? extend_sse42(crc, p, n) : extend_portable(crc, p, n);
}

}  // namespace internal

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
  // Decided once; __builtin_cpu_supports reads a table filled at startup.
  static const bool use_sse42 = cpu_has_sse42();
  const auto* p = static_cast<const uint8_t*>(data);
  return use_sse42 ? extend_sse42(crc, p, n) : extend_portable(crc, p, n);
}

}  // namespace capstan::data::io
