// The caller's own buffers for a restore (RestoreOptions::into), matched to
// the leaves it selected. Shared by the restore of ckptio's steps
// (restore_whole.cc) and of zarr steps (restore_zarr.cc).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ckptio/index.h"
#include "ckptio/manager.h"

namespace ckptio {

// RestoreOptions::into matched to the selected leaves: per selected leaf its
// destination or nullptr (an empty vector when `into` is empty). A later
// entry for the same leaf wins; one whose size is not the leaf's, or that
// names no selected leaf, is refused (kInvalidArgument) before any read.
Result<std::vector<const RestoreOptions::Destination*>> match_destinations(
    const std::vector<std::pair<std::string, LeafRecord*>>& selected,
    const std::vector<RestoreOptions::Destination>& into);

}  // namespace ckptio
