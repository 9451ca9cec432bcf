#include "io/crc32c.h"

#include <array>
#include <bit>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define CAPSTAN_CRC32C_X86 1
#endif

namespace capstan::io {
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

// Three streams at once. The crc32 instruction takes three cycles but can
// start every cycle, so one dependent chain uses a third of it: the SSE4.2
// path runs three chains over three adjacent blocks and joins them. The CRC
// register is linear in the data, so the register after blocks A, B, C is
//   shift(shift(reg(A, start)) ^ reg(B, 0)) ^ reg(C, 0),
// where shift is what appending one block of zero bytes does to a register.
// For a fixed block size that map is a 32x32 matrix over GF(2), applied
// here a byte at a time through four 256-entry tables.

// A 32x32 GF(2) matrix: column i is the image of bit i.
using Gf2Matrix = std::array<uint32_t, 32>;

uint32_t gf2_apply(const Gf2Matrix& m, uint32_t v) {
  uint32_t out = 0;
  for (int i = 0; v != 0; ++i, v >>= 1) {
    if (v & 1) out ^= m[static_cast<size_t>(i)];
  }
  return out;
}

// a after b.
Gf2Matrix gf2_compose(const Gf2Matrix& a, const Gf2Matrix& b) {
  Gf2Matrix out{};
  for (size_t i = 0; i < 32; ++i) out[i] = gf2_apply(a, b[i]);
  return out;
}

struct ZeroShift {
  std::array<std::array<uint32_t, 256>, 4> tables;
  uint32_t operator()(uint32_t reg) const {
    return tables[0][reg & 0xff] ^ tables[1][(reg >> 8) & 0xff] ^ tables[2][(reg >> 16) & 0xff] ^
           tables[3][reg >> 24];
  }
};

// The effect on the register of `bytes` zero bytes.
ZeroShift make_zero_shift(size_t bytes) {
  Gf2Matrix bit{};  // one zero bit: shift right, fold the polynomial in
  bit[0] = kPolynomial;
  for (size_t i = 1; i < 32; ++i) bit[i] = uint32_t{1} << (i - 1);
  Gf2Matrix power = bit;
  for (int k = 0; k < 3; ++k) power = gf2_compose(power, power);  // one byte
  Gf2Matrix result{};
  for (size_t i = 0; i < 32; ++i) result[i] = uint32_t{1} << i;  // identity
  for (size_t n = bytes; n != 0; n >>= 1) {
    if (n & 1) result = gf2_compose(power, result);
    power = gf2_compose(power, power);
  }
  ZeroShift shift{};
  for (uint32_t k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) shift.tables[k][b] = gf2_apply(result, b << (8 * k));
  }
  return shift;
}

// Block sizes of the three streams: long for big buffers, short for the
// rest (a 1 KB record gets one short round).
constexpr size_t kLongBlock = 8192;
constexpr size_t kShortBlock = 256;

// Precondition: cpu_has_sse42().
__attribute__((target("sse4.2"))) uint64_t three_streams(uint64_t c0, const uint8_t*& p, size_t& n,
                                                        size_t block, const ZeroShift& shift) {
  while (n >= 3 * block) {
    uint64_t c1 = 0, c2 = 0;
    const uint8_t* end = p + block;
    do {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, p, 8);
      std::memcpy(&w1, p + block, 8);
      std::memcpy(&w2, p + 2 * block, 8);
      c0 = _mm_crc32_u64(c0, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
      p += 8;
    } while (p < end);
    c0 = shift(static_cast<uint32_t>(c0)) ^ c1;
    c0 = shift(static_cast<uint32_t>(c0)) ^ c2;
    p += 2 * block;
    n -= 3 * block;
  }
  return c0;
}

// Precondition: cpu_has_sse42().
__attribute__((target("sse4.2"))) uint32_t extend_sse42(uint32_t crc, const uint8_t* p,
                                                         size_t n) {
  static const ZeroShift long_shift = make_zero_shift(kLongBlock);
  static const ZeroShift short_shift = make_zero_shift(kShortBlock);
  uint32_t c = ~crc;
  // Byte steps up to an 8-byte boundary, then whole words.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(c, *p++);
    --n;
  }
#if defined(__x86_64__)
  uint64_t c64 = c;
  c64 = three_streams(c64, p, n, kLongBlock, long_shift);
  c64 = three_streams(c64, p, n, kShortBlock, short_shift);
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

}  // namespace capstan::io
