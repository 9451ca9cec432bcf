// Safetensors files: the Hugging Face tensor container that Capstan
// checkpoints keep their shards in, so that Python's `safetensors` package
// (safe_open, numpy.load_file) reads them as they are.
//
// Layout (every integer little-endian):
//
//   [0, 8)           N, the header length in bytes (uint64)
//   [8, 8 + N)       the header: a UTF-8 JSON object, padded with spaces so
//                    that N is a multiple of 8 (the data starts aligned)
//   [8 + N, end)     the data: each tensor's bytes, row-major
//
// The header maps each tensor name to its dtype, shape and byte range
// [begin, end) in the data (relative to the byte after the header), plus an
// optional "__metadata__" object whose values are strings. The writer emits
// compact JSON, tensors in the order given, "__metadata__" last and only when
// there is metadata:
//
//   {"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},
//    "b":{"dtype":"I64","shape":[],"data_offsets":[24,32]},
//    "__metadata__":{"step":"5"}}
//
// Like the reference implementation, the reader requires the ranges to tile
// the data exactly (sorted by offset: no gap, no overlap, nothing after the
// last tensor) and each range to hold dtype size * elements bytes; it ignores
// fields of a tensor's entry it does not know, as the reference reader does.
// Anything wrong is DataLoss naming the file (and the tensor, where there is
// one).
// Header bytes have no checksum of their own: a flipped byte that leaves
// valid JSON (a digit of a shape, a letter of a name) is only caught by the
// file's crc32c in the checkpoint manifest.
//
// Dtypes: F16 BF16 F32 F64 I8 I16 I32 I64 U8 BOOL map to Capstan's dtypes.
// U16 U32 U64 F8_E4M3 F8_E5M2 are valid safetensors dtypes Capstan has no
// type for: such a file opens, and reading those tensors is Unimplemented.
//
// String tensors. Safetensors has no string dtype, so a Capstan kString
// tensor is stored as a U8 vector holding its raw buffer ((n + 1) uint64
// offsets, then the bytes; see capstan/tensor.h), and its real dtype and
// shape go into the metadata:
//
//   "capstan.dtype.<name>": "string", "capstan.shape.<name>": "[3]"
//
// SafetensorsReader turns such a tensor back into a string tensor and leaves
// these keys out of metadata(); other readers see a U8 vector. Metadata keys
// beginning "capstan.dtype." or "capstan.shape." are therefore reserved.
//
// All this assumes a little-endian host (checked at compile time).
#ifndef CAPSTAN_LIB_CHECKPOINT_SAFETENSORS_H_
#define CAPSTAN_LIB_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "io/file_system.h"

namespace capstan::checkpoint {

// The reference implementation refuses longer headers; so do we, before
// allocating for one.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
inline constexpr std::string_view kSafetensorsMetadataKey = "__metadata__";
// Reserved metadata key prefixes for string tensors (see above).
inline constexpr std::string_view kStringDTypeKeyPrefix = "capstan.dtype.";
inline constexpr std::string_view kStringShapeKeyPrefix = "capstan.shape.";

// "F32", "BF16", ...; nullopt for kString and kInvalid, which have none.
std::optional<std::string_view> safetensors_dtype_name(DType dtype);

// Writes `tensors` (in this order) and `metadata` to `path` durably: to
// "<path>.tmp" first, fsynced, then renamed over `path` (the parent directory
// is fsynced too). Tensor names must be unique, non-empty, valid UTF-8 and
// not "__metadata__"; metadata must be valid UTF-8 and avoid the reserved
// prefixes. Those mistakes are InvalidArgument; I/O errors carry the code of
// the failed call (see io::errno_to_status).
// The file goes through `fs` (the local file system unless a test hands in
// another).
// `crc32c` (when given) gets the file's CRC32C, computed from the bytes
// written (the file is not read back).
Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata,
                         io::FileSystem& fs = io::local_file_system(), uint32_t* crc32c = nullptr);

// What the header says about one tensor.
struct SafetensorsTensorInfo {
  std::string safetensors_dtype;  // as in the header: "F32", "U8", ...
  // Capstan's view: kString (and the logical shape) for a stored string
  // tensor; kInvalid for a dtype Capstan lacks (U16, ...).
  DType dtype = DType::kInvalid;
  Shape shape;
  uint64_t begin = 0;  // byte range in the data section
  uint64_t end = 0;
};

// Reads tensors from a safetensors file with pread, one tensor (or a range
// of its rows) at a time; open() reads and checks only the header.
//
// Thread-safety: after open(), every method is const and may be called from
// many threads at once.
class SafetensorsReader {
 public:
  // NotFound / PermissionDenied when the file cannot be opened,
  // FailedPrecondition when it is not a regular file, DataLoss when the
  // header is damaged in any way this header describes.
  // `fs` must outlive the reader.
  static Result<std::unique_ptr<SafetensorsReader>> open(const std::string& path,
                                                         io::FileSystem& fs = io::local_file_system());
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  // In file order (the order the writer was given).
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // NotFound for an unknown name.
  Result<SafetensorsTensorInfo> info(const std::string& name) const;

  // The whole tensor. NotFound for an unknown name, Unimplemented for a
  // dtype Capstan lacks, DataLoss when the file is shorter than its header
  // said or the bytes are not a valid tensor (a bool other than 0 or 1,
  // string offsets out of order).
  Result<Tensor> read(const std::string& name) const;
  // Rows [begin, end) of dimension 0, reading only their bytes (for a string
  // tensor: their offsets, then their bytes). InvalidArgument for a scalar
  // or rows outside 0 <= begin <= end <= dim 0; otherwise as read().
  Result<Tensor> read_rows(const std::string& name, int64_t begin, int64_t end) const;

  // The "__metadata__" strings, without the reserved string-tensor keys.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsReader(std::string path, std::unique_ptr<io::RandomAccessFile> file)
      : path_(std::move(path)), file_(std::move(file)) {}
  Status parse_header(std::string_view header);
  Status corrupt(const std::string& why) const;
  const SafetensorsTensorInfo* find(const std::string& name, Status* error) const;
  // Reads n bytes at file offset `offset` into `out`; errors name `tensor`
  // ("" while reading the header).
  Status pread_data(uint64_t offset, void* out, size_t n, const std::string& tensor) const;
  // `shape` (with its dim 0 rows) starting at row `begin`; fixed-size dtypes.
  Result<Tensor> read_fixed_rows(const std::string& name, const SafetensorsTensorInfo& info,
                                 int64_t begin, Shape shape) const;
  // Elements [first, last) of a string tensor, as a string tensor of `shape`.
  Result<Tensor> read_string_elements(const std::string& name, const SafetensorsTensorInfo& info,
                                      uint64_t first, uint64_t last, Shape shape) const;

  // All constant after open().
  const std::string path_;
  const std::unique_ptr<io::RandomAccessFile> file_;
  uint64_t data_start_ = 0;  // 8 + N
  std::map<std::string, SafetensorsTensorInfo> tensors_;
  std::vector<std::string> order_;  // names sorted by data offset
  std::map<std::string, std::string> metadata_;
};

// Helpers shared by the checkpoint formats (safetensors, manifest, index)
// and the checkpoint writer; not an API.
namespace internal {

bool is_valid_utf8(std::string_view s);

// Parse the text of a JSON number. False unless all of `text` is a number of
// the target type (no fraction or exponent for the integers) in range.
bool parse_json_int64(std::string_view text, int64_t* out);
bool parse_json_uint64(std::string_view text, uint64_t* out);

}  // namespace internal

}  // namespace capstan::checkpoint

#endif  // CAPSTAN_LIB_CHECKPOINT_SAFETENSORS_H_
