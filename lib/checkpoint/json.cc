#include "checkpoint/json.h"

#include <set>

namespace capstan::checkpoint {
namespace {

// Thrown from the parser callback to stop parsing.
struct Stop {
  std::string why;
  JsonDuplicateKey duplicate;
  bool is_duplicate = false;
};

// Tracks where the parser is, to name a duplicate key's object.
class Tracker {
 public:
  bool on_event(int depth, nlohmann::json::parse_event_t event, const Json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (depth > kMaxJsonDepth) throw Stop{"nested deeper than " + std::to_string(kMaxJsonDepth) + " levels", {}};
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        enter_value();
        frames_.push_back(Frame{event == Event::array_start, 0, {}, {}});
        break;
      case Event::object_end:
      case Event::array_end:
        if (!frames_.empty()) frames_.pop_back();
        break;
      case Event::key: {
        Frame& object = frames_.back();
        std::string key = parsed.get<std::string>();
        if (!object.keys.insert(key).second) {
          Stop stop{"key '" + key + "' appears twice in one object", {}, true};
          stop.duplicate.path = path(frames_.size() - 1);
          stop.duplicate.key = key;
          throw stop;
        }
        object.key = std::move(key);
        break;
      }
      case Event::value:
        enter_value();
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool is_array;
    size_t next;       // arrays: the index of the next element
    std::string key;   // objects: the key whose value is being parsed
    std::set<std::string> keys;
  };

  // A value starts: in an array it takes the next index.
  void enter_value() {
    if (!frames_.empty() && frames_.back().is_array) ++frames_.back().next;
  }

  // The path to the container frames_[n] (the elements leading to it).
  std::vector<std::string> path(size_t n) const {
    std::vector<std::string> out;
    for (size_t i = 0; i < n; ++i) {
      const Frame& f = frames_[i];
      out.push_back(f.is_array ? "[" + std::to_string(f.next - 1) + "]" : f.key);
    }
    return out;
  }

  std::vector<Frame> frames_;
};

}  // namespace

Result<Json> parse_json(std::string_view text, JsonDuplicateKey* duplicate) {
  Tracker tracker;
  try {
    return Json::parse(text.begin(), text.end(),
                       [&tracker](int depth, nlohmann::json::parse_event_t event, Json& parsed) {
                         return tracker.on_event(depth, event, parsed);
                       });
  } catch (const Stop& stop) {
    if (stop.is_duplicate && duplicate != nullptr) *duplicate = stop.duplicate;
    return Status::InvalidArgument(stop.why);
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(e.what());
  }
}

std::string json_field(const std::vector<std::string>& path) {
  std::string out;
  for (const std::string& part : path) {
    if (!out.empty() && part.front() != '[') out += ".";
    out += part;
  }
  return out;
}

std::string json_quote(std::string_view s) { return Json(std::string(s)).dump(); }

}  // namespace capstan::checkpoint
