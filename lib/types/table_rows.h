// Rows of a dynamic embedding table with their state, as a parameter server
// exports and imports them (checkpoints, delta export, re-sharding on
// restore). n rows:
//   keys    int64[n]
//   values  dtype[n, dim]
//   slots   dtype[n, dim] each, in slot_names() order (optimizer.h)
//   meta    int64[n, kMetaColumns]: (lookups, last update step, last update
//           time in ms since the Unix epoch, version)
#ifndef CAPSTAN_LIB_TYPES_TABLE_ROWS_H_
#define CAPSTAN_LIB_TYPES_TABLE_ROWS_H_

#include <vector>

#include "capstan/tensor.h"

namespace capstan::ps {

struct TableRows {
  Tensor keys;
  Tensor values;
  std::vector<Tensor> slots;
  Tensor meta;
};
inline constexpr int kMetaColumns = 4;

}  // namespace capstan::ps

#endif  // CAPSTAN_LIB_TYPES_TABLE_ROWS_H_
