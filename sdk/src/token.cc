// The cluster token from the environment (capstan/client.h): plain file and
// environment reads, in capstan_base so that the data-service reader can
// fall back on them without depending on the client.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "capstan/client.h"

namespace capstan {

Result<std::string> read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("cannot read token file '" + path + "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string token = buffer.str();
  size_t begin = token.find_first_not_of(" \t\r\n");
  size_t end = token.find_last_not_of(" \t\r\n");
  if (begin == std::string::npos) return Status::InvalidArgument("token file '" + path + "' is empty");
  return token.substr(begin, end - begin + 1);
}

Result<std::string> token_from_environment() {
  if (const char* token = std::getenv("CAPSTAN_TOKEN"); token != nullptr && *token != '\0') {
    return std::string(token);
  }
  if (const char* file = std::getenv("CAPSTAN_TOKEN_FILE"); file != nullptr && *file != '\0') {
    return read_token_file(file);
  }
  return std::string();
}

}  // namespace capstan
