// Reading the small objects ckptio (or eformer) writes into a step: an index,
// metadata.json, a .zarray, a manifest. Storage::get and open refuse one
// larger than the reader's limit with kInvalidArgument (the caller's
// argument, for storage in general); here such an object is not one that
// was written there but damage: kDataLoss, so that restore-latest passes
// over its step and cp exits 1 (data), not 2 (usage).
#pragma once

#include <cstdint>
#include <string>

#include "ckptio/storage.h"

namespace ckptio {

inline Status oversized_is_damage(Status st) {
  if (st.code() == Code::kInvalidArgument) return data_loss(st.message());
  return st;
}

inline Result<std::string> get_own_object(Storage& storage, const std::string& key, uint64_t max_size) {
  auto text = storage.get(key, max_size);
  if (!text.ok()) return oversized_is_damage(text.status());
  return text;
}

}  // namespace ckptio
