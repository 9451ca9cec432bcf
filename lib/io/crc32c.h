// CRC32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of
// TFRecord files, LevelDB logs and iSCSI.
//
// crc32c_extend() uses the SSE4.2 crc32 instruction when the CPU has it and a
// slicing-by-8 table otherwise; both give the same values.
//
//   uint32_t crc = crc32c(header, 8);
//   crc = crc32c_extend(crc, more, n);  // == crc32c(header ++ more)
//
// Thread-safety: every function is pure and may be called from any thread.
#ifndef CAPSTAN_LIB_IO_CRC32C_H_
#define CAPSTAN_LIB_IO_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace capstan::io {

// Returns the CRC32C of A ++ data[0, n), where `crc` is the CRC32C of some
// string A (0 for the empty string).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);

// The CRC32C of data[0, n).
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

// TensorFlow and LevelDB store masked CRCs: computing the CRC of a string that
// itself contains embedded CRCs is problematic, so the stored value is
// rotated and offset.
inline uint32_t crc32c_mask(uint32_t crc) {
  constexpr uint32_t kMaskDelta = 0xa282ead8u;
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}
inline uint32_t crc32c_unmask(uint32_t masked) {
  constexpr uint32_t kMaskDelta = 0xa282ead8u;
  uint32_t rotated = masked - kMaskDelta;
  return (rotated >> 17) | (rotated << 15);
}

// The two implementations, exposed so tests can compare them.
namespace internal {
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);
// Whether this CPU can run crc32c_extend_sse42().
bool crc32c_sse42_available();
// The SSE4.2 path; falls back to the portable one where the CPU lacks it.
uint32_t crc32c_extend_sse42(uint32_t crc, const void* data, size_t n);
}  // namespace internal

}  // namespace capstan::io

#endif  // CAPSTAN_LIB_IO_CRC32C_H_
