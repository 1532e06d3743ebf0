#include "backends/s3/s3_xml.h"

#include <pugixml.hpp>

#include <algorithm>
#include <charconv>

#include "backends/s3/retry.h"
#include "src/util/iso8601.h"
#include "src/util/printable.h"

namespace ckptio::s3 {
namespace {

constexpr std::string_view kS3Namespace = "http://s3.amazonaws.com/doc/2006-03-01/";
// Server text copied into Status messages is cut here: an error page is not a log.
constexpr size_t kMaxQuoted = 256;

// "ns:Name" -> "Name". S3 uses a default namespace, but a prefix is legal XML.
std::string_view local_name(const pugi::xml_node& n) {
  std::string_view name = n.name();
  const size_t colon = name.rfind(':');
  return colon == std::string_view::npos ? name : name.substr(colon + 1);
}

// Server-supplied text for a message: bounded and printable.
std::string quoted(std::string_view s) { return printable(s, kMaxQuoted); }

Status malformed(std::string_view op, const std::string& what) {
  return io_error(std::string(op) + " response: " + what);
}

// Parses `body` into `doc` and returns its single root element. Rejects NUL
// bytes (pugixml would stop at one and accept a truncated document), more than
// one root element, and text outside the root (parse_fragment keeps top-level
// text as nodes so that it can be seen; otherwise pugixml drops it silently).
Result<pugi::xml_node> load(pugi::xml_document& doc, std::string_view body, std::string_view op) {
  if (body.size() > kMaxXmlBody)
    return malformed(op, "body of " + std::to_string(body.size()) + " bytes exceeds the limit");
  if (body.find('\0') != std::string_view::npos) return malformed(op, "NUL byte in XML body");
  pugi::xml_parse_result r;
  try {
    r = doc.load_buffer(body.data(), body.size(),
                        pugi::parse_default | pugi::parse_ws_pcdata_single | pugi::parse_fragment,
                        pugi::encoding_utf8);
  } catch (...) {  // pugixml reports failures by value; belt and braces for bad_alloc
    return malformed(op, "XML parser failed");
  }
  if (!r) {
    if (body.empty()) return malformed(op, "empty body, expected an XML document");
    return malformed(op, std::string("not well-formed XML (") + r.description() + " at offset " +
                             std::to_string(r.offset) + ")");
  }
  pugi::xml_node root;
  for (pugi::xml_node n : doc.children()) {
    switch (n.type()) {
      case pugi::node_element:
        if (root) return malformed(op, "more than one root element");
        root = n;
        break;
      case pugi::node_pcdata:
        if (std::string_view(n.value()).find_first_not_of(" \t\r\n") != std::string_view::npos)
          return malformed(op, "text outside the root element");
        break;
      case pugi::node_cdata:
        return malformed(op, "CDATA outside the root element");
      default:
        break;  // declaration, comments, processing instructions, doctype
    }
  }
  if (!root) return malformed(op, "no root element");
  return root;
}

// The children of `parent` named `name`.
std::vector<pugi::xml_node> children_named(const pugi::xml_node& parent, std::string_view name) {
  std::vector<pugi::xml_node> out;
  for (pugi::xml_node n : parent.children())
    if (n.type() == pugi::node_element && local_name(n) == name) out.push_back(n);
  return out;
}

// The text content of an element that must contain only text (and comments).
Result<std::string> text_of(const pugi::xml_node& e, std::string_view op) {
  std::string out;
  for (pugi::xml_node n : e.children()) {
    if (n.type() == pugi::node_pcdata || n.type() == pugi::node_cdata)
      out += n.value();
    else if (n.type() == pugi::node_element)
      return malformed(op, "<" + std::string(local_name(e)) + "> contains an element, expected text");
  }
  return out;
}

// The text of the at most one child `name`: nullopt when absent, an error
// when repeated (which value would be the real one?).
Result<std::optional<std::string>> optional_text(const pugi::xml_node& parent,
                                                 std::string_view name, std::string_view op) {
  const auto found = children_named(parent, name);
  if (found.empty()) return std::optional<std::string>();
  if (found.size() > 1) return malformed(op, "repeated <" + std::string(name) + ">");
  CKPTIO_ASSIGN_OR_RETURN(std::string t, text_of(found[0], op));
  return std::optional<std::string>(std::move(t));
}

Result<std::string> required_text(const pugi::xml_node& parent, std::string_view name,
                                  std::string_view op, bool allow_empty = false) {
  CKPTIO_ASSIGN_OR_RETURN(auto t, optional_text(parent, name, op));
  if (!t) return malformed(op, "missing <" + std::string(name) + "> in <" +
                                   std::string(local_name(parent)) + ">");
  if (t->empty() && !allow_empty) return malformed(op, "empty <" + std::string(name) + ">");
  return std::move(*t);
}

Result<bool> required_bool(const pugi::xml_node& parent, std::string_view name, std::string_view op) {
  CKPTIO_ASSIGN_OR_RETURN(std::string t, required_text(parent, name, op));
  if (t == "true") return true;
  if (t == "false") return false;
  return malformed(op, "<" + std::string(name) + "> is '" + quoted(t) + "', expected true or false");
}

Result<uint64_t> parse_u64(std::string_view s, std::string_view name, std::string_view op) {
  uint64_t v = 0;
  const bool digits =
      !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (digits && ec == std::errc() && ptr == s.data() + s.size()) return v;
  // Appended piecewise: GCC 12 warns falsely (-Wrestrict) on a chain of operator+.
  std::string what = "<";
  what.append(name).append("> is '").append(quoted(s)).append("', expected an unsigned 64-bit decimal");
  return malformed(op, what);
}

}  // namespace

std::optional<int64_t> parse_s3_timestamp(std::string_view s) {
  const std::optional<int64_t> ns = parse_iso8601_ns(s, TimeZones::kUtc);
  if (!ns || *ns < 0) return std::nullopt;
  return ns;
}

namespace {

Result<int64_t> optional_timestamp(const pugi::xml_node& parent, std::string_view name, std::string_view op) {
  CKPTIO_ASSIGN_OR_RETURN(auto t, optional_text(parent, name, op));
  if (!t) return int64_t{0};
  if (auto ns = parse_s3_timestamp(*t)) return *ns;
  std::string what = "<";
  what.append(name).append("> is '").append(quoted(*t)).append("', expected an ISO 8601 UTC time");
  return malformed(op, what);
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// S3's encoding-type=url is form encoding: '+' for space, %XX for other bytes
// (a literal '+' arrives as %2B). botocore decodes it with unquote_plus.
Result<std::string> url_decode(std::string_view s, std::string_view op) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%') {
      const int hi = s.size() - i >= 3 ? hex_value(s[i + 1]) : -1;
      const int lo = s.size() - i >= 3 ? hex_value(s[i + 2]) : -1;
      if (hi < 0 || lo < 0)
        return malformed(op, "bad %-escape in URL-encoded name '" + quoted(s) + "'");
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// Reads <EncodingType>: "" (plain) or "url"; anything else we cannot decode.
Result<bool> url_encoded(const pugi::xml_node& root, std::string_view op) {
  CKPTIO_ASSIGN_OR_RETURN(auto enc, optional_text(root, "EncodingType", op));
  if (!enc || enc->empty()) return false;
  if (*enc == "url") return true;
  return malformed(op, "unsupported <EncodingType> '" + quoted(*enc) + "'");
}

Result<std::string> maybe_decode(std::string s, bool encoded, std::string_view op) {
  if (!encoded) return s;
  return url_decode(s, op);
}

// Lenient field read for <Error> documents: whatever is there, first wins.
std::string first_text(const pugi::xml_node& parent, std::string_view name) {
  for (pugi::xml_node n : parent.children())
    if (n.type() == pugi::node_element && local_name(n) == name) {
      std::string out;
      for (pugi::xml_node t : n.children())
        if (t.type() == pugi::node_pcdata || t.type() == pugi::node_cdata) out += t.value();
      return out;
    }
  return {};
}

S3Error error_from(const pugi::xml_node& root) {
  return S3Error{first_text(root, "Code"), first_text(root, "Message"),
                 first_text(root, "Resource"), first_text(root, "RequestId")};
}

// The root of a result document, or the Status for an <Error> or another root.
Result<pugi::xml_node> result_root(pugi::xml_document& doc, std::string_view body,
                                   std::string_view op, std::string_view expected_root) {
  CKPTIO_ASSIGN_OR_RETURN(pugi::xml_node root, load(doc, body, op));
  if (local_name(root) == "Error")
    return status_from_s3_error(200, error_from(root)).annotate(std::string(op));
  if (local_name(root) != expected_root)
    return malformed(op, "expected <" + std::string(expected_root) + ">, got <" +
                             quoted(local_name(root)) + ">");
  return root;
}

void append_escaped(std::string& out, std::string_view s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (u < 0x20) {  // CR, LF, tab and the rest: a raw CR would be normalized away
          out += "&#";
          out += std::to_string(u);
          out += ';';
        } else {
          out.push_back(c);
        }
    }
  }
}

}  // namespace

std::optional<S3Error> parse_error(std::string_view body) {
  pugi::xml_document doc;
  auto root = load(doc, body, "error");
  if (!root.ok() || local_name(*root) != "Error") return std::nullopt;
  return error_from(*root);
}

Status status_from_s3_error(long status, const S3Error& e) {
  std::string msg = "S3 ";
  msg += e.code.empty() ? "HTTP " + std::to_string(status) : quoted(e.code);
  if (!e.message.empty()) msg += ": " + quoted(e.message);
  if (!e.resource.empty()) msg += " (resource " + quoted(e.resource) + ")";
  if (!e.request_id.empty()) msg += " (request id " + quoted(e.request_id) + ")";
  Code code = code_for_http(status, e.code);
  if (code == Code::kOk) code = Code::kIOError;  // an <Error> is never success
  return Status(code, std::move(msg));
}

Result<StsCredentials> parse_sts_credentials(std::string_view body) {
  constexpr std::string_view op = "STS";
  pugi::xml_document doc;
  CKPTIO_ASSIGN_OR_RETURN(pugi::xml_node root, load(doc, body, op));
  if (local_name(root) == "ErrorResponse" || local_name(root) == "Error") {
    pugi::xml_node err = root;
    if (local_name(root) == "ErrorResponse") {
      auto errs = children_named(root, "Error");
      if (errs.size() != 1) return malformed(op, "<ErrorResponse> without exactly one <Error>");
      err = errs.front();
    }
    const std::string code = first_text(err, "Code");
    const std::string message = first_text(err, "Message");
    Code c = Code::kIOError;
    if (code == "Throttling" || code == "IDPCommunicationError" || code == "ServiceUnavailable" ||
        code == "InternalFailure")
      c = Code::kUnavailable;
    else if (code == "InvalidIdentityToken" || code == "ExpiredTokenException" ||
             code == "AccessDenied" || code == "IDPRejectedClaim" || code == "InvalidClientTokenId" ||
             code == "RegionDisabledException")
      c = Code::kPermissionDenied;
    return Status(c, std::string(op) + ": " + (code.empty() ? "error" : quoted(code)) +
                         (message.empty() ? "" : ": " + quoted(message)));
  }
  const std::string_view name = local_name(root);
  if (name != "AssumeRoleWithWebIdentityResponse" && name != "AssumeRoleResponse")
    return malformed(op, "expected <AssumeRoleWithWebIdentityResponse> or <AssumeRoleResponse>, got <" +
                             quoted(name) + ">");
  auto results = children_named(root, "AssumeRoleWithWebIdentityResult");
  if (results.empty()) results = children_named(root, "AssumeRoleResult");
  if (results.size() != 1) return malformed(op, "expected one <AssumeRole[WithWebIdentity]Result>");
  auto creds = children_named(results.front(), "Credentials");
  if (creds.size() != 1) return malformed(op, "expected one <Credentials>");
  StsCredentials out;
  CKPTIO_ASSIGN_OR_RETURN(out.access_key_id, required_text(creds.front(), "AccessKeyId", op));
  CKPTIO_ASSIGN_OR_RETURN(out.secret_access_key, required_text(creds.front(), "SecretAccessKey", op));
  CKPTIO_ASSIGN_OR_RETURN(out.session_token, required_text(creds.front(), "SessionToken", op));
  // They go into HTTP headers (and the signature): a line break or other
  // control byte (raw, or as a character reference) is refused, by name.
  for (const auto& [field, v] : {std::pair<const char*, const std::string*>{"AccessKeyId", &out.access_key_id},
                                 {"SecretAccessKey", &out.secret_access_key},
                                 {"SessionToken", &out.session_token}})
    if (has_control_byte(*v)) return malformed(op, "<" + std::string(field) + "> contains a control character");
  CKPTIO_ASSIGN_OR_RETURN(std::string exp, required_text(creds.front(), "Expiration", op));
  const std::optional<int64_t> ns = parse_s3_timestamp(exp);
  if (!ns) return malformed(op, "<Expiration> is '" + quoted(exp) + "', expected an ISO 8601 UTC time");
  out.expiration_unix_ns = *ns;
  return out;
}

Result<std::string> parse_initiate_multipart(std::string_view body) {
  constexpr std::string_view op = "CreateMultipartUpload";
  pugi::xml_document doc;
  CKPTIO_ASSIGN_OR_RETURN(pugi::xml_node root,
                          result_root(doc, body, op, "InitiateMultipartUploadResult"));
  return required_text(root, "UploadId", op);
}

Result<CompleteResult> parse_complete_multipart(std::string_view body) {
  constexpr std::string_view op = "CompleteMultipartUpload";
  pugi::xml_document doc;
  // moto names the root CompleteMultipartUploadResponse; AWS, MinIO and Ceph
  // CompleteMultipartUploadResult. Both carry the same children.
  auto root = result_root(doc, body, op, "CompleteMultipartUploadResult");
  if (!root.ok() && root.status().code() != Code::kUnavailable && !doc.empty() &&
      local_name(doc.document_element()) == "CompleteMultipartUploadResponse")
    root = doc.document_element();
  if (!root.ok()) return root.status();
  // Ceph's radosgw (16.2, and later releases until fixed upstream) answers
  // a successful Complete with <ETag></ETag>: the object is whole (HEAD gives
  // its "md5-N" ETag). The element must be there; its text may be empty.
  CKPTIO_ASSIGN_OR_RETURN(std::string etag, required_text(*root, "ETag", op, /*allow_empty=*/true));
  return CompleteResult{std::move(etag)};
}

Result<ListPage> parse_list_objects_v2(std::string_view body) {
  constexpr std::string_view op = "ListObjectsV2";
  pugi::xml_document doc;
  CKPTIO_ASSIGN_OR_RETURN(pugi::xml_node root, result_root(doc, body, op, "ListBucketResult"));
  ListPage page;
  CKPTIO_ASSIGN_OR_RETURN(page.truncated, required_bool(root, "IsTruncated", op));
  CKPTIO_ASSIGN_OR_RETURN(const bool encoded, url_encoded(root, op));
  for (const pugi::xml_node& c : children_named(root, "Contents")) {
    ObjectEntry e;
    CKPTIO_ASSIGN_OR_RETURN(std::string key, required_text(c, "Key", op));
    CKPTIO_ASSIGN_OR_RETURN(e.key, maybe_decode(std::move(key), encoded, op));
    CKPTIO_ASSIGN_OR_RETURN(std::string size, required_text(c, "Size", op));
    CKPTIO_ASSIGN_OR_RETURN(e.size, parse_u64(size, "Size", op));
    CKPTIO_ASSIGN_OR_RETURN(auto etag, optional_text(c, "ETag", op));
    if (etag) e.etag = std::move(*etag);
    CKPTIO_ASSIGN_OR_RETURN(e.modified_unix_ns, optional_timestamp(c, "LastModified", op));
    page.objects.push_back(std::move(e));
  }
  for (const pugi::xml_node& p : children_named(root, "CommonPrefixes")) {
    CKPTIO_ASSIGN_OR_RETURN(std::string prefix, required_text(p, "Prefix", op));
    CKPTIO_ASSIGN_OR_RETURN(prefix, maybe_decode(std::move(prefix), encoded, op));
    page.common_prefixes.push_back(std::move(prefix));
  }
  CKPTIO_ASSIGN_OR_RETURN(auto token, optional_text(root, "NextContinuationToken", op));
  if (token) page.next_continuation_token = std::move(*token);
  if (page.truncated && page.next_continuation_token.empty())
    return malformed(op, "IsTruncated is true but NextContinuationToken is missing");
  return page;
}

Result<UploadsPage> parse_list_multipart_uploads(std::string_view body) {
  constexpr std::string_view op = "ListMultipartUploads";
  pugi::xml_document doc;
  CKPTIO_ASSIGN_OR_RETURN(pugi::xml_node root,
                          result_root(doc, body, op, "ListMultipartUploadsResult"));
  UploadsPage page;
  CKPTIO_ASSIGN_OR_RETURN(page.truncated, required_bool(root, "IsTruncated", op));
  CKPTIO_ASSIGN_OR_RETURN(const bool encoded, url_encoded(root, op));
  for (const pugi::xml_node& u : children_named(root, "Upload")) {
    UploadEntry e;
    CKPTIO_ASSIGN_OR_RETURN(std::string key, required_text(u, "Key", op));
    CKPTIO_ASSIGN_OR_RETURN(e.key, maybe_decode(std::move(key), encoded, op));
    CKPTIO_ASSIGN_OR_RETURN(e.upload_id, required_text(u, "UploadId", op));
    CKPTIO_ASSIGN_OR_RETURN(e.initiated_unix_ns, optional_timestamp(u, "Initiated", op));
    page.uploads.push_back(std::move(e));
  }
  CKPTIO_ASSIGN_OR_RETURN(auto key_marker, optional_text(root, "NextKeyMarker", op));
  if (key_marker) {
    CKPTIO_ASSIGN_OR_RETURN(page.next_key_marker, maybe_decode(std::move(*key_marker), encoded, op));
  }
  CKPTIO_ASSIGN_OR_RETURN(auto id_marker, optional_text(root, "NextUploadIdMarker", op));
  if (id_marker) page.next_upload_id_marker = std::move(*id_marker);
  if (page.truncated && page.next_key_marker.empty())
    return malformed(op, "IsTruncated is true but NextKeyMarker is missing");
  return page;
}

Result<PartsPage> parse_list_parts(std::string_view body) {
  constexpr std::string_view op = "ListParts";
  pugi::xml_document doc;
  // moto names the root ListPartsResponse; AWS ListPartsResult. Both carry
  // the same children.
  auto found = result_root(doc, body, op, "ListPartsResult");
  if (!found.ok() && found.status().code() == Code::kIOError && !doc.empty() &&
      local_name(doc.document_element()) == "ListPartsResponse")
    found = doc.document_element();
  CKPTIO_ASSIGN_OR_RETURN(pugi::xml_node root, std::move(found));
  PartsPage page;
  CKPTIO_ASSIGN_OR_RETURN(page.truncated, required_bool(root, "IsTruncated", op));
  for (const pugi::xml_node& p : children_named(root, "Part")) {
    PartEntry e;
    CKPTIO_ASSIGN_OR_RETURN(std::string number, required_text(p, "PartNumber", op));
    CKPTIO_ASSIGN_OR_RETURN(e.number, parse_u64(number, "PartNumber", op));
    CKPTIO_ASSIGN_OR_RETURN(e.modified_unix_ns, optional_timestamp(p, "LastModified", op));
    page.parts.push_back(e);
  }
  CKPTIO_ASSIGN_OR_RETURN(auto marker, optional_text(root, "NextPartNumberMarker", op));
  if (marker) page.next_part_number_marker = std::move(*marker);
  if (page.truncated && page.next_part_number_marker.empty())
    return malformed(op, "IsTruncated is true but NextPartNumberMarker is missing");
  return page;
}

Result<DeleteResult> parse_delete_objects(std::string_view body) {
  constexpr std::string_view op = "DeleteObjects";
  pugi::xml_document doc;
  CKPTIO_ASSIGN_OR_RETURN(pugi::xml_node root, result_root(doc, body, op, "DeleteResult"));
  DeleteResult out;
  for (const pugi::xml_node& d : children_named(root, "Deleted")) {
    CKPTIO_ASSIGN_OR_RETURN(std::string key, required_text(d, "Key", op));
    out.deleted.push_back(std::move(key));
  }
  for (const pugi::xml_node& e : children_named(root, "Error")) {
    CKPTIO_ASSIGN_OR_RETURN(std::string key, required_text(e, "Key", op));
    S3Error err;
    CKPTIO_ASSIGN_OR_RETURN(err.code, required_text(e, "Code", op));
    CKPTIO_ASSIGN_OR_RETURN(auto message, optional_text(e, "Message", op));
    if (message) err.message = std::move(*message);
    out.errors.emplace_back(std::move(key), std::move(err));
  }
  return out;
}

std::string build_complete_multipart(const std::vector<CompletedPart>& parts) {
  std::vector<CompletedPart> sorted = parts;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.number < b.number; });
  std::string out = R"(<?xml version="1.0" encoding="UTF-8"?>)";
  out += "\n<CompleteMultipartUpload xmlns=\"";
  out += kS3Namespace;
  out += "\">";
  for (const CompletedPart& p : sorted) {
    out += "<Part><PartNumber>";
    out += std::to_string(p.number);
    out += "</PartNumber><ETag>";
    append_escaped(out, p.etag);
    out += "</ETag>";
    if (!p.checksum_crc32c.empty()) {
      out += "<ChecksumCRC32C>";
      append_escaped(out, p.checksum_crc32c);
      out += "</ChecksumCRC32C>";
    }
    out += "</Part>";
  }
  out += "</CompleteMultipartUpload>";
  return out;
}

std::string build_delete_objects(const std::vector<std::string>& keys, bool quiet) {
  std::string out = R"(<?xml version="1.0" encoding="UTF-8"?>)";
  out += "\n<Delete xmlns=\"";
  out += kS3Namespace;
  out += "\">";
  if (quiet) out += "<Quiet>true</Quiet>";
  for (const std::string& key : keys) {
    out += "<Object><Key>";
    append_escaped(out, key);
    out += "</Key></Object>";
  }
  out += "</Delete>";
  return out;
}

}  // namespace ckptio::s3
