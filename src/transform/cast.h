// dtype casts between the floating kinds (float16, bfloat16, float32,
// float64), for eformer's float_dtype on save and restore. Rounding is to
// nearest even; NaN stays NaN, overflow becomes infinity.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ckptio/status.h"
#include "ckptio/types.h"

namespace ckptio {

bool can_cast(DType from, DType to);
// Converts `count` elements. `dst` holds count * dtype_size(to) bytes.
Status cast_elements(DType from, DType to, const void* src, void* dst, uint64_t count);

}  // namespace ckptio
