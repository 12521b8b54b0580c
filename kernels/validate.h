// Input checks shared by the ops' Validate() functions: a failed check is an
// INVALID_ARGUMENT naming the op and the condition.
#ifndef SPECSERVE_KERNELS_VALIDATE_H_
#define SPECSERVE_KERNELS_VALIDATE_H_

#include "absl/status/status.h"

#define SS_KERNEL_CHECK(cond, msg)                         \
  do {                                                     \
    if (!(cond)) return ::absl::InvalidArgumentError(msg); \
  } while (0)

#endif  // SPECSERVE_KERNELS_VALIDATE_H_
