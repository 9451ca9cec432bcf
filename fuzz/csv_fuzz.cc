// decode_csv: quoting, delimiters, numbers, missing fields.
#include "data/ops/csv.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace capstan;
  static const data::CsvSpec spec = [] {
    data::CsvSpec s;
    s.record_defaults = {Tensor::scalar<int32_t>(0), Tensor::scalar<int64_t>(0), Tensor::scalar<float>(0),
                         Tensor::scalar<double>(0), Tensor::from_strings({""}, {}).value()};
    s.na_value = "?";
    s.trim_whitespace = true;
    return s;
  }();
  auto records = Tensor::from_strings({fuzz::as_string(data, size)}, {});
  if (records.ok()) (void)data::decode_csv(*records, spec);
  return 0;
}
