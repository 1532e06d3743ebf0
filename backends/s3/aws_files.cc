// The AWS shared config and credentials files: their grammar (parse_aws_ini,
// as s3_config.h states it), and which files and which profile of them a
// resolution reads (load_config_sources).
#include <map>
#include <set>
#include <string>
#include <string_view>

#include "backends/s3/s3_config.h"
#include "backends/s3/s3_config_internal.h"
#include "src/util/printable.h"

namespace ckptio::s3 {
namespace {

using config_internal::kMaxIniBytes;
using config_internal::lowercase;
using config_internal::trim;

Status ini_error(size_t line, const std::string& why) {
  return invalid_argument("line " + std::to_string(line) + ": " + why);
}

}  // namespace

Result<AwsIni> parse_aws_ini(std::string_view text, AwsIniKind kind) {
  if (text.size() > kMaxIniBytes) return invalid_argument("larger than 1 MiB");
  AwsIni out;
  std::set<std::string> seen_sections;
  bool in_section = false;
  std::map<std::string, std::string>* section = nullptr;  // null: a section we drop
  std::string section_name;
  // The last key of the section, for nested "s3 =" blocks.
  bool have_key = false;
  size_t key_indent = 0;
  bool key_opens_block = false;
  std::string key_name;

  size_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? nl : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);

    size_t indent = 0;
    while (indent < line.size() && (line[indent] == ' ' || line[indent] == '\t')) ++indent;
    const std::string_view body = trim(line);
    if (body.empty() || body.front() == '#' || body.front() == ';') continue;
    for (char c : body)
      if (is_control_byte(static_cast<unsigned char>(c)) && c != '\t')
        return ini_error(line_no, "control character");

    if (have_key && indent > key_indent) {  // continuation of the previous key
      if (!key_opens_block)
        return ini_error(line_no, "indented line continues a value; only nested settings "
                                  "such as 's3 =' may be followed by indented lines");
      const size_t eq = body.find('=');
      if (eq == std::string_view::npos) return ini_error(line_no, "expected 'name = value' in a nested block");
      const std::string name = lowercase(trim(body.substr(0, eq)));
      if (name.empty()) return ini_error(line_no, "empty key");
      if (section) {
        const std::string full = key_name + "." + name;
        if (section->count(full)) return ini_error(line_no, "repeated key in [" + section_name + "]");
        (*section)[full] = std::string(trim(body.substr(eq + 1)));
      }
      continue;
    }

    if (body.front() == '[') {
      if (body.back() != ']') return ini_error(line_no, "section header is missing ']'");
      const std::string_view raw = trim(body.substr(1, body.size() - 2));
      if (raw.empty()) return ini_error(line_no, "empty section name");
      if (raw.find_first_of("[]") != std::string_view::npos)
        return ini_error(line_no, "'[' or ']' inside a section name");
      std::string name(raw);
      bool keep = true;
      if (kind == AwsIniKind::kConfig && raw != "default") {
        const bool has_space = raw.find_first_of(" \t") != std::string_view::npos;
        if (raw.substr(0, 7) == "profile" && raw.size() > 7 && (raw[7] == ' ' || raw[7] == '\t')) {
          name = std::string(trim(raw.substr(8)));
          if (name.empty()) return ini_error(line_no, "empty profile name");
        } else if (!has_space) {
          keep = false;  // "[name]" is not a profile in the config file
        }
      }
      in_section = true;
      have_key = false;
      section_name = name;
      if (keep) {
        if (!seen_sections.insert(name).second)
          return ini_error(line_no, "section [" + name + "] repeated");
        section = &out[name];
      } else {
        section = nullptr;
      }
      continue;
    }

    const size_t delim = body.find_first_of("=:");
    if (delim == std::string_view::npos)
      return ini_error(line_no, "expected '[section]' or 'key = value'");
    if (!in_section) return ini_error(line_no, "setting outside of any [section]");
    const std::string key = lowercase(trim(body.substr(0, delim)));
    if (key.empty()) return ini_error(line_no, "empty key");
    const std::string_view value = trim(body.substr(delim + 1));
    if (section) {
      if (section->count(key)) return ini_error(line_no, "repeated key in [" + section_name + "]");
      (*section)[key] = std::string(value);
    }
    have_key = true;
    key_indent = indent;
    key_opens_block = value.empty();
    key_name = key;
  }
  return out;
}

namespace config_internal {

std::optional<std::string> ConfigSources::env(const std::string& name) const {
  std::optional<std::string> v = getenv && *getenv ? (*getenv)(name) : std::nullopt;
  if (v && v->empty()) return std::nullopt;
  return v;
}

bool ConfigSources::env_true(const std::string& name) const {
  const auto v = env(name);
  return v && lowercase(trim(*v)) == "true";
}

std::optional<std::string> ConfigSources::from_profile(const std::string& key) const {
  auto it = prof.find(key);
  if (it == prof.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

bool ConfigSources::ignore_configured_endpoints() const {
  return env_true("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS") ||
         lowercase(from_profile("ignore_configured_endpoint_urls").value_or("")) == "true";
}

Result<ConfigSources> load_config_sources(const S3ConfigOverrides& o, const GetEnv& getenv,
                                          const ReadFile& read_file) {
  ConfigSources src;
  src.getenv = &getenv;
  auto env = [&](const std::string& name) { return src.env(name); };
  std::optional<std::string> named_profile = o.profile;
  if (!named_profile) named_profile = env("AWS_PROFILE");
  src.profile = named_profile ? *named_profile : "default";
  const std::optional<std::string> home = env("HOME");
  auto path_of = [&](const char* var, const char* leaf) -> std::optional<std::string> {
    if (auto p = env(var)) {
      if (p->substr(0, 2) == "~/" && home) return *home + p->substr(1);
      return p;
    }
    if (home) return *home + "/.aws/" + leaf;
    return std::nullopt;
  };
  const std::optional<std::string> creds_path = path_of("AWS_SHARED_CREDENTIALS_FILE", "credentials");
  const std::optional<std::string> config_path = path_of("AWS_CONFIG_FILE", "config");
  auto load = [&](const std::optional<std::string>& path, AwsIniKind kind) -> Result<AwsIni> {
    if (!path || !read_file) return AwsIni{};
    std::optional<std::string> text = read_file(*path);
    if (!text) return AwsIni{};
    Result<AwsIni> ini = parse_aws_ini(*text, kind);
    if (!ini.ok()) return ini.status().annotate("AWS file " + printable(*path));
    return ini;
  };
  CKPTIO_ASSIGN_OR_RETURN(src.config_ini, load(config_path, AwsIniKind::kConfig));
  CKPTIO_ASSIGN_OR_RETURN(src.creds_ini, load(creds_path, AwsIniKind::kCredentials));
  bool profile_found = false;
  if (auto it = src.config_ini.find(src.profile); it != src.config_ini.end()) {
    src.prof = it->second;
    profile_found = true;
  }
  if (auto it = src.creds_ini.find(src.profile); it != src.creds_ini.end()) {
    for (const auto& [k, v] : it->second) src.prof[k] = v;
    profile_found = true;
  }
  if (named_profile && !profile_found)
    return invalid_argument("AWS profile '" + printable(src.profile) + "' not found in " +
                            (creds_path ? printable(*creds_path) : std::string("(no credentials file)")) +
                            " or " + (config_path ? printable(*config_path) : std::string("(no config file)")));
  // Paths and profile names come from the environment: printable in messages.
  src.profile_source = "profile " + printable(src.profile);
  return src;
}

}  // namespace config_internal
}  // namespace ckptio::s3
