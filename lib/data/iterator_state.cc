#include "data/iterator_state.h"

#include <cstring>

#include "io/crc32c.h"
#include "rpc/tensor_codec.h"

namespace capstan::data::engine {
namespace {

constexpr std::string_view kMagic = "CAPSTAN-ITERATOR-STATE-1\n";

void put_u64(std::string& out, uint64_t value) {
  char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  out.append(bytes, 8);
}

uint64_t get_u64(const char* bytes) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return value;
}

}  // namespace

uint64_t fingerprint_of(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

void StateWriter::resume() {
  for (auto it = resumes_.rbegin(); it != resumes_.rend(); ++it) (*it)();
  resumes_.clear();
}

void StateWriter::begin(std::string_view op) { write_bytes(op); }

void StateWriter::write_int(int64_t value) { put_u64(body_, static_cast<uint64_t>(value)); }

void StateWriter::write_bytes(std::string_view bytes) {
  put_u64(body_, bytes.size());
  body_.append(bytes);
}

void StateWriter::write_element(const Element& element) { write_bytes(rpc::element_to_bytes(element)); }

void StateWriter::write_status(const Status& status) {
  write_int(static_cast<int64_t>(status.code()));
  write_bytes(status.message());
}

std::string StateWriter::finish(uint64_t fingerprint) const {
  std::string out(kMagic);
  put_u64(out, fingerprint);
  out += body_;
  put_u64(out, capstan::io::crc32c_mask(capstan::io::crc32c(out.data(), out.size())));
  return out;
}

Result<StateReader> StateReader::open(std::string_view state, uint64_t fingerprint) {
  if (state.size() < kMagic.size() + 16 || state.substr(0, kMagic.size()) != kMagic) {
    return Status::InvalidArgument("not a saved iterator state (" + std::to_string(state.size()) +
                                   " bytes without the header '" + std::string(kMagic.substr(0, kMagic.size() - 1)) +
                                   "'); pass the bytes Iterator::save() returned");
  }
  size_t body_end = state.size() - 8;
  uint64_t crc = capstan::io::crc32c_mask(capstan::io::crc32c(state.data(), body_end));
  if (get_u64(state.data() + body_end) != crc) {
    return Status::InvalidArgument("the saved iterator state is damaged (checksum mismatch over " +
                                   std::to_string(state.size()) + " bytes)");
  }
  uint64_t saved = get_u64(state.data() + kMagic.size());
  if (saved != fingerprint) {
    return Status::InvalidArgument(
        "the saved iterator state belongs to a different dataset definition; restore it into an "
        "iterator of the dataset it was saved from (same ops, arguments and functions)");
  }
  return StateReader(state.substr(kMagic.size() + 8, body_end - kMagic.size() - 8));
}

Status StateReader::damaged(std::string_view what) const {
  return Status::InvalidArgument("the saved iterator state is malformed at byte " + std::to_string(offset_) + ": " +
                                 std::string(what));
}

Status StateReader::take(size_t n, std::string_view what, std::string_view* out) {
  if (n > body_.size() - offset_) {
    return damaged("it ends while reading " + std::string(what) + " (" + std::to_string(n) + " bytes wanted, " +
                   std::to_string(body_.size() - offset_) + " left)");
  }
  *out = body_.substr(offset_, n);
  offset_ += n;
  return Status::Ok();
}

Status StateReader::begin(std::string_view op) {
  std::string name;
  CAPSTAN_RETURN_IF_ERROR(read_bytes(&name));
  if (name != op) {
    return Status::InvalidArgument("the saved iterator state holds a '" + name + "' iterator where this pipeline has '" +
                                   std::string(op) + "'; restore it into an iterator of the dataset it was saved from");
  }
  return Status::Ok();
}

Status StateReader::read_int(int64_t* value) {
  std::string_view bytes;
  CAPSTAN_RETURN_IF_ERROR(take(8, "an integer", &bytes));
  *value = static_cast<int64_t>(get_u64(bytes.data()));
  return Status::Ok();
}

Status StateReader::read_bool(bool* value) {
  int64_t v = 0;
  CAPSTAN_RETURN_IF_ERROR(read_int_in(&v, 0, 1, "a flag"));
  *value = v != 0;
  return Status::Ok();
}

Status StateReader::read_int_in(int64_t* value, int64_t min, int64_t max, std::string_view what) {
  CAPSTAN_RETURN_IF_ERROR(read_int(value));
  if (*value < min || *value > max) {
    return damaged(std::string(what) + " is " + std::to_string(*value) + ", outside [" + std::to_string(min) + ", " +
                   std::to_string(max) + "]");
  }
  return Status::Ok();
}

Status StateReader::read_bytes(std::string* bytes) {
  std::string_view length;
  CAPSTAN_RETURN_IF_ERROR(take(8, "a length", &length));
  uint64_t n = get_u64(length.data());
  if (n > body_.size() - offset_) {
    return damaged("a byte string of " + std::to_string(n) + " bytes runs past the end (" +
                   std::to_string(body_.size() - offset_) + " bytes left)");
  }
  std::string_view data;
  CAPSTAN_RETURN_IF_ERROR(take(static_cast<size_t>(n), "a byte string", &data));
  bytes->assign(data);
  return Status::Ok();
}

Status StateReader::read_element(Element* element) {
  std::string bytes;
  CAPSTAN_RETURN_IF_ERROR(read_bytes(&bytes));
  auto decoded = rpc::element_from_bytes(bytes);
  if (!decoded.ok()) return damaged("an element does not decode: " + decoded.status().message());
  *element = std::move(*decoded);
  return Status::Ok();
}

Status StateReader::read_status(Status* status) {
  int64_t code = 0;
  CAPSTAN_RETURN_IF_ERROR(read_int_in(&code, 0, 16, "a status code"));
  std::string message;
  CAPSTAN_RETURN_IF_ERROR(read_bytes(&message));
  *status = code == 0 ? Status::Ok() : Status(static_cast<StatusCode>(code), std::move(message));
  return Status::Ok();
}

Status StateReader::finish() const {
  if (offset_ != body_.size()) {
    return damaged(std::to_string(body_.size() - offset_) + " bytes are left over after the last iterator");
  }
  return Status::Ok();
}

}  // namespace capstan::data::engine
