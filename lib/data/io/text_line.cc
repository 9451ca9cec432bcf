#include "data/io/text_line.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace capstan::data::io {
namespace {

constexpr size_t kBlockBytes = size_t{256} << 10;

// Drops every '\r', as TensorFlow's ReadLine does.
void drop_carriage_returns(std::string* line) {
  if (std::memchr(line->data(), '\r', line->size()) == nullptr) return;
  line->erase(std::remove(line->begin(), line->end(), '\r'), line->end());
}

}  // namespace

Result<std::unique_ptr<TextLineReader>> TextLineReader::open(const std::string& path,
                                                             Compression compression) {
  CAPSTAN_ASSIGN_OR_RETURN(auto stream, open_input(path, compression));
  return std::make_unique<TextLineReader>(std::move(stream));
}

TextLineReader::TextLineReader(std::unique_ptr<InputStream> stream)
    : stream_(std::move(stream)) {}

Result<bool> TextLineReader::fill() {
  // Drop the consumed prefix first so the buffer holds at most one line plus
  // one block.
  buffer_.erase(0, begin_);
  begin_ = 0;
  size_t old_size = buffer_.size();
  buffer_.resize(old_size + kBlockBytes);
  auto got = stream_->read(buffer_.data() + old_size, kBlockBytes);
  if (!got.ok()) {
    buffer_.resize(old_size);
    status_ = got.status();
    return status_;
  }
  buffer_.resize(old_size + *got);
  return *got > 0;
}

Result<bool> TextLineReader::read(std::string* line) {
  if (!status_.ok()) return status_;
  size_t scan_from = begin_;  // no '\n' in buffer_[begin_, scan_from)
  while (true) {
    const char* start = buffer_.data() + scan_from;
    const auto* newline =
        static_cast<const char*>(std::memchr(start, '\n', buffer_.size() - scan_from));
    if (newline != nullptr) {
      size_t end = static_cast<size_t>(newline - buffer_.data());
      line->assign(buffer_, begin_, end - begin_);
      begin_ = end + 1;
      drop_carriage_returns(line);
      return true;
    }
    if (at_end_) {
      line->assign(buffer_, begin_, std::string::npos);
      begin_ = buffer_.size();
      drop_carriage_returns(line);
      return !line->empty();
    }
    size_t unread = buffer_.size() - begin_;
    CAPSTAN_ASSIGN_OR_RETURN(bool more, fill());
    at_end_ = !more;
    scan_from = unread;  // fill() moved the unread bytes to the front
  }
}

}  // namespace capstan::data::io
