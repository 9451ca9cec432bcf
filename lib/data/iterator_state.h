// The saved position of a pipeline's iterators (tf.data's iterator
// checkpointing: save/restore of an iterator's state).
//
// Format: a flat byte string, "CAPSTAN-ITERATOR-STATE-1\n", the definition's
// fingerprint (8 bytes), then each iterator's fields in the order its save()
// wrote them, each iterator starting with its op's name, and last a masked
// CRC32C of everything before it. Integers are 8 bytes little-endian; byte
// strings and elements are length-prefixed. An iterator writes its own fields
// and then its inputs', depth first; restore() reads them back in the same
// order, so no keys are needed, and the op names catch a state restored into
// a different pipeline at the first op that differs.
//
// Every read is bounds-checked: a damaged or foreign state gives
// InvalidArgument naming what was expected, never a crash.
#ifndef CAPSTAN_LIB_DATA_ITERATOR_STATE_H_
#define CAPSTAN_LIB_DATA_ITERATOR_STATE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan::data::engine {

class StateWriter {
 public:
  // Starts one iterator's fields.
  void begin(std::string_view op);
  void write_int(int64_t value);
  void write_bool(bool value) { write_int(value ? 1 : 0); }
  void write_bytes(std::string_view bytes);
  void write_element(const Element& element);
  // An element's error kept in a buffer (its code and message).
  void write_status(const Status& status);

  // The finished state, for a definition with `fingerprint`.
  std::string finish(uint64_t fingerprint) const;
  // The fields written so far, without header or checksum (a nested state).
  const std::string& body() const { return body_; }

  // An iterator that paused its threads to save registers how to resume
  // them; they stay paused until the whole pipeline is saved (resume()), so
  // that no thread moves the pipeline between two iterators' saves.
  void defer(std::function<void()> resume_threads) { resumes_.push_back(std::move(resume_threads)); }
  // Resumes them, innermost first.
  void resume();

 private:
  std::string body_;
  std::vector<std::function<void()>> resumes_;
};

class StateReader {
 public:
  // Checks the header, the fingerprint and the checksum of `state`, which
  // must outlive the reader.
  static Result<StateReader> open(std::string_view state, uint64_t fingerprint);
  // Over a nested state (StateWriter::body()), which must outlive the reader.
  static StateReader nested(std::string_view body) { return StateReader(body); }

  // Checks that the next iterator's fields are `op`'s.
  Status begin(std::string_view op);
  Status read_int(int64_t* value);
  Status read_bool(bool* value);
  // An integer in [min, max], InvalidArgument naming `what` otherwise.
  Status read_int_in(int64_t* value, int64_t min, int64_t max, std::string_view what);
  Status read_bytes(std::string* bytes);
  Status read_element(Element* element);
  Status read_status(Status* status);
  // InvalidArgument unless every byte was read.
  Status finish() const;

 private:
  explicit StateReader(std::string_view body) : body_(body) {}
  Status take(size_t n, std::string_view what, std::string_view* out);
  Status damaged(std::string_view what) const;

  std::string_view body_;
  size_t offset_ = 0;
};

// A fingerprint of a definition's bytes (FNV-1a, 64 bits): a state saved from
// one definition is refused by an iterator of another.
uint64_t fingerprint_of(std::string_view bytes);

}  // namespace capstan::data::engine

#endif  // CAPSTAN_LIB_DATA_ITERATOR_STATE_H_
