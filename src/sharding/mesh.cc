// Mesh: validation, the --mesh text form, and device coordinates.
#include <charconv>
#include <set>
#include <unordered_set>

#include "ckptio/sharding.h"

namespace ckptio {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<Mesh> Mesh::create(std::vector<MeshAxis> axes, std::vector<int64_t> device_ids) {
  std::set<std::string_view> names;
  int64_t count = 1;
  for (size_t i = 0; i < axes.size(); ++i) {
    const MeshAxis& a = axes[i];
    if (a.name.empty()) return invalid_argument("mesh axis " + std::to_string(i) + " has an empty name");
    if (!names.insert(a.name).second) return invalid_argument("mesh axis name '" + a.name + "' appears twice");
    if (a.size < 1)
      return invalid_argument("mesh axis '" + a.name + "' has size " + std::to_string(a.size) +
                              "; sizes are >= 1");
    // Checked before multiplying, so the product never overflows.
    if (a.size > kMaxMeshDevices / count)
      return invalid_argument("mesh has more than " + std::to_string(kMaxMeshDevices) + " devices (at axis '" +
                              a.name + "')");
    count *= a.size;
  }
  if (static_cast<int64_t>(device_ids.size()) != count)
    return invalid_argument("mesh axes give " + std::to_string(count) + " devices but " +
                            std::to_string(device_ids.size()) + " device ids were given");
  std::unordered_set<int64_t> seen;
  for (int64_t id : device_ids) {
    if (id < 0) return invalid_argument("device id " + std::to_string(id) + " is negative");
    if (!seen.insert(id).second) return invalid_argument("device id " + std::to_string(id) + " appears twice in the mesh");
  }
  Mesh m;
  m.axes_ = std::move(axes);
  m.device_ids_ = std::move(device_ids);
  return m;
}

Result<Mesh> Mesh::create(std::vector<MeshAxis> axes) {
  int64_t count = 1;
  for (const MeshAxis& a : axes) {
    // create() reports bad sizes; only an in-range product is materialized.
    if (a.size < 1 || a.size > kMaxMeshDevices / count) return create(std::move(axes), {});
    count *= a.size;
  }
  std::vector<int64_t> ids(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) ids[static_cast<size_t>(i)] = i;
  return create(std::move(axes), std::move(ids));
}

Result<Mesh> Mesh::parse(std::string_view text) {
  const std::string quoted = "mesh \"" + std::string(text) + "\": ";
  std::vector<MeshAxis> axes;
  std::string_view rest = text;
  while (true) {
    size_t comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    if (item.empty()) return invalid_argument(quoted + "empty item; expected name=size, e.g. dp=2,tp=4");
    size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      return invalid_argument(quoted + "\"" + std::string(item) + "\" is not name=size");
    std::string_view name = trim(item.substr(0, eq));
    std::string_view size = trim(item.substr(eq + 1));
    if (name.empty()) return invalid_argument(quoted + "\"" + std::string(item) + "\" has no axis name");
    for (char c : name)
      if (is_space(c) || c == '=')
        return invalid_argument(quoted + "axis name \"" + std::string(name) + "\" contains '" + c + "'");
    int64_t n = 0;
    auto [end, ec] = std::from_chars(size.data(), size.data() + size.size(), n);
    if (size.empty() || ec != std::errc() || end != size.data() + size.size() || n < 1)
      return invalid_argument(quoted + "size \"" + std::string(size) + "\" of axis '" + std::string(name) +
                              "' is not an integer >= 1");
    axes.push_back({std::string(name), n});
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  Result<Mesh> m = create(std::move(axes));
  if (!m.ok()) return invalid_argument(quoted + m.status().message());
  return m;
}

std::optional<size_t> Mesh::axis_index(std::string_view name) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == name) return i;
  return std::nullopt;
}

std::vector<int64_t> Mesh::coordinates(size_t position) const {
  std::vector<int64_t> c(axes_.size());
  auto rest = static_cast<int64_t>(position);
  for (size_t i = axes_.size(); i-- > 0;) {  // row-major: the last axis varies fastest
    c[i] = rest % axes_[i].size;
    rest /= axes_[i].size;
  }
  return c;
}

std::string Mesh::to_string() const {
  std::string s;
  for (const MeshAxis& a : axes_) {
    if (!s.empty()) s += ',';
    s += a.name + "=" + std::to_string(a.size);
  }
  return s;
}

}  // namespace ckptio
