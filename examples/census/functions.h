// The census pipeline's named functions, registered by the module (for
// workers and data workers) and by the program itself (the synchronous
// modes run the pipeline in each replica's process):
//
//   filter "census_is_record"  a CSV line with 15 fields (drops adult.test's
//                              "|1x3 Cross validator" line and blank lines)
//   map    "census_features"   decoded row (15 scalars) -> (wide_ids
//                              int64[15], numeric float32[5], label float32)
#ifndef CAPSTAN_EXAMPLES_CENSUS_FUNCTIONS_H_
#define CAPSTAN_EXAMPLES_CENSUS_FUNCTIONS_H_

#include <capstan/functions.h>

#include <algorithm>
#include <string>

#include "features.h"

namespace census {

inline capstan::Result<capstan::Element> features(capstan::Element row) {
  using capstan::Status;
  using capstan::Tensor;
  if (row.size() != kNumColumns) {
    return Status::InvalidArgument("census_features takes the " + std::to_string(kNumColumns) +
                                   " decoded CSV columns, got " + std::to_string(row.size()));
  }
  for (int column = 0; column < kNumColumns; ++column) {
    const Tensor& t = row.components[static_cast<size_t>(column)];
    if (t.num_elements() != 1) {
      return Status::InvalidArgument("census_features: column " + std::to_string(column) +
                                     " must be a scalar, got " + t.debug_string(0));
    }
  }
  auto integer = [&](int column) { return row.components[static_cast<size_t>(column)].flat<int64_t>()[0]; };
  auto text = [&](int column) { return std::string(row.components[static_cast<size_t>(column)].string_at(0)); };
  Row r;
  r.age = integer(kAge);
  r.workclass = text(kWorkclass);
  r.education = text(kEducation);
  r.education_num = integer(kEducationNum);
  r.marital_status = text(kMaritalStatus);
  r.occupation = text(kOccupation);
  r.relationship = text(kRelationship);
  r.race = text(kRace);
  r.gender = text(kGender);
  r.capital_gain = integer(kCapitalGain);
  r.capital_loss = integer(kCapitalLoss);
  r.hours_per_week = integer(kHoursPerWeek);
  r.native_country = text(kNativeCountry);
  r.income_bracket = text(kIncomeBracket);
  Features f = transform(r);
  CAPSTAN_ASSIGN_OR_RETURN(Tensor ids, Tensor::from_vector<int64_t>({f.wide_ids.begin(), f.wide_ids.end()},
                                                                     {kNumWideFields}));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor numeric, Tensor::from_vector<float>({f.numeric.begin(), f.numeric.end()}, {kNumeric}));
  return capstan::Element{{ids, numeric, Tensor::scalar<float>(f.label)}, {"wide_ids", "numeric", "label"}};
}

inline void register_pipeline_functions(capstan::FunctionRegistry& registry) {
  registry.register_filter("census_is_record", [](const capstan::Element& line) -> capstan::Result<bool> {
    if (line.size() != 1 || line.components[0].dtype() != capstan::DType::kString ||
        line.components[0].num_elements() != 1) {
      return capstan::Status::InvalidArgument("census_is_record takes one string scalar (a line)");
    }
    std::string_view text = line.components[0].string_at(0);
    return std::count(text.begin(), text.end(), ',') == kNumColumns - 1;
  });
  registry.register_map("census_features", features);
}

}  // namespace census

#endif  // CAPSTAN_EXAMPLES_CENSUS_FUNCTIONS_H_
