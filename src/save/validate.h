// The checks save() makes of the leaves it is handed.
#pragma once

#include <vector>

#include "ckptio/status.h"
#include "ckptio/types.h"

namespace ckptio {

// Checks the leaves handed to save(): names, dtypes, shapes, and that the
// shards of each leaf lie inside it and cover it exactly once.
// With `partial` (a process of a multi-process save), a leaf's shards must
// be disjoint but need not cover it, and a leaf may have none.
Status validate_leaves(const std::vector<LeafView>& leaves, bool partial = false);

}  // namespace ckptio
