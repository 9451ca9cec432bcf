// Helpers for the libFuzzer harnesses in fuzz/: each harness feeds outside
// bytes to one decoder and must never crash, hang or leak (errors are fine).
#ifndef CAPSTAN_FUZZ_FUZZ_UTIL_H_
#define CAPSTAN_FUZZ_FUZZ_UTIL_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace capstan::fuzz {

// The input as a file (an anonymous memfd): for decoders that read paths.
class InputFile {
 public:
  InputFile(const uint8_t* data, size_t size) : fd_(memfd_create("capstan-fuzz", 0)) {
    size_t done = 0;
    while (fd_ >= 0 && done < size) {
      ssize_t n = write(fd_, data + done, size - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
  }
  ~InputFile() {
    if (fd_ >= 0) close(fd_);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace capstan::fuzz

#endif  // CAPSTAN_FUZZ_FUZZ_UTIL_H_
