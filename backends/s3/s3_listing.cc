// Listing and deleting: list() (ListObjectsV2, paged), remove() and
// remove_prefix() (DeleteObjects in batches), and multipart uploads that were
// never completed nor aborted (a writer that crashed): list_unfinished()
// (ListMultipartUploads, ListParts) and abort_unfinished().
#include <openssl/evp.h>

#include <algorithm>
#include <map>

#include "backends/s3/s3_storage_internal.h"
#include "backends/s3/s3_xml.h"
#include "src/util/printable.h"

namespace ckptio::s3::storage_internal {
namespace {

constexpr size_t kDeleteBatch = 1000;

std::string md5_base64(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_md5(), nullptr);
  std::string out(4 * ((n + 2) / 3) + 1, '\0');
  int len = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), md, static_cast<int>(n));
  out.resize(static_cast<size_t>(len));
  return out;
}

}  // namespace

Result<ListResult> S3StorageImpl::list(const std::string& prefix, bool delimiter) {
  CKPTIO_RETURN_IF_ERROR(check_storage_prefix(prefix));
  ListResult out;
  const std::string root = where_.prefix.empty() ? "" : where_.prefix + "/";
  std::string token;
  for (int page = 0;; ++page) {
    S3Op op;
    op.method = "GET";
    op.query = {{"list-type", "2"}, {"prefix", root + prefix}};
    if (delimiter) op.query.emplace_back("delimiter", "/");
    if (!token.empty()) op.query.emplace_back("continuation-token", token);
    auto [st, resp] = client_.execute_sync(std::move(op));
    if (!st.ok()) return st.annotate("list " + describe() + "/" + prefix);
    auto parsed = parse_list_objects_v2(resp.body);
    if (!parsed.ok()) return parsed.status().annotate("list " + describe() + "/" + prefix);
    for (auto& o : parsed->objects) {
      if (o.key.compare(0, root.size(), root) != 0) continue;
      out.objects.push_back({o.key.substr(root.size()), o.size, o.modified_unix_ns});
    }
    for (auto& p : parsed->common_prefixes) {
      if (p.compare(0, root.size(), root) != 0) continue;
      out.prefixes.push_back(p.substr(root.size()));
    }
    if (!parsed->truncated) break;
    if (parsed->next_continuation_token.empty() || parsed->next_continuation_token == token)
      return io_error("list " + describe() + "/" + prefix + ": truncated page without a new token");
    token = parsed->next_continuation_token;
  }
  // S3 lists in UTF-8 byte order; some servers (s3rver) do not. The
  // contract is S3's, so sort here: it costs little next to the requests.
  std::sort(out.objects.begin(), out.objects.end(),
            [](const ListEntry& a, const ListEntry& b) { return a.key < b.key; });
  std::sort(out.prefixes.begin(), out.prefixes.end());
  out.prefixes.erase(std::unique(out.prefixes.begin(), out.prefixes.end()), out.prefixes.end());
  return out;
}

Status S3StorageImpl::remove(const std::string& key) {
  CKPTIO_RETURN_IF_ERROR(check_storage_key(key));
  S3Op op;
  op.method = "DELETE";
  op.key = full(key);
  Status st = client_.execute_sync(std::move(op)).first;
  return st.code() == Code::kNotFound ? Status::OK() : st;
}

Status S3StorageImpl::remove_prefix(const std::string& prefix) {
  CKPTIO_RETURN_IF_ERROR(check_storage_prefix(prefix));
  CKPTIO_ASSIGN_OR_RETURN(ListResult all, list(prefix, false));
  for (size_t i = 0; i < all.objects.size(); i += kDeleteBatch) {
    std::vector<std::string> keys;
    for (size_t j = i; j < std::min(all.objects.size(), i + kDeleteBatch); ++j)
      keys.push_back(full(all.objects[j].key));
    CKPTIO_RETURN_IF_ERROR(delete_batch(keys));
  }
  return Status::OK();
}

Status S3StorageImpl::delete_batch(const std::vector<std::string>& keys) {
  std::string xml = build_delete_objects(keys, /*quiet=*/true);
  S3Op op;
  op.method = "POST";
  op.query = {{"delete", ""}};
  op.headers = {{"content-md5", md5_base64(xml)}, {"content-type", "application/xml"}};
  op.body = as_bytes(xml);
  auto [st, resp] = client_.execute_sync(std::move(op));
  if (!st.ok()) return st.annotate("DeleteObjects");
  auto res = parse_delete_objects(resp.body);
  if (!res.ok()) return res.status().annotate("DeleteObjects " + describe());
  for (const auto& [key, err] : res->errors) {
    if (err.code == "NoSuchKey") continue;
    return io_error("DeleteObjects " + client_.describe(printable(key, 1024)) + ": " + printable(err.code, 128) + ": " +
                    printable(err.message, 512));
  }
  return Status::OK();
}

Result<std::vector<ListEntry>> S3StorageImpl::list_unfinished(const std::string& prefix) {
  CKPTIO_RETURN_IF_ERROR(check_storage_prefix(prefix));
  // key -> the newest change of its uploads: when one began, or when a
  // part of it landed (ListParts), whichever is later. Initiated alone would
  // make a long upload still sending parts look old (and some servers,
  // moto among them, answer a fixed Initiated).
  std::map<std::string, int64_t> newest;
  const std::string root = where_.prefix.empty() ? "" : where_.prefix + "/";
  std::string key_marker, id_marker;
  for (;;) {
    S3Op op;
    op.method = "GET";
    op.query = {{"uploads", ""}, {"prefix", root + prefix}};
    if (!key_marker.empty()) op.query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) op.query.emplace_back("upload-id-marker", id_marker);
    auto [st, resp] = client_.execute_sync(std::move(op));
    if (!st.ok()) return st.annotate("ListMultipartUploads");
    auto page = parse_list_multipart_uploads(resp.body);
    if (!page.ok()) return page.status().annotate("ListMultipartUploads " + describe());
    for (const auto& u : page->uploads) {
      if (u.key.compare(0, root.size(), root) != 0) continue;
      auto parts = newest_part(u.key, u.upload_id);
      if (parts.status().code() == Code::kNotFound) continue;  // finished or aborted meanwhile
      if (!parts.ok()) return parts.status();
      const int64_t t = std::max(u.initiated_unix_ns, *parts);
      auto [it, fresh] = newest.emplace(u.key.substr(root.size()), t);
      if (!fresh) it->second = std::max(it->second, t);
    }
    if (!page->truncated) break;
    if (page->next_key_marker == key_marker && page->next_upload_id_marker == id_marker)
      return io_error("ListMultipartUploads " + describe() + ": truncated page without new markers");
    key_marker = page->next_key_marker;
    id_marker = page->next_upload_id_marker;
  }
  std::vector<ListEntry> out;
  for (auto& [key, t] : newest) out.push_back(ListEntry{key, 0, t});
  return out;
}

// The newest LastModified of the parts of upload `id` of `full_key` (0 if
// it has none or the server gives no times); kNotFound if the upload is gone.
Result<int64_t> S3StorageImpl::newest_part(const std::string& full_key, const std::string& id) {
  int64_t newest = 0;
  std::string marker;
  for (;;) {
    S3Op op;
    op.method = "GET";
    op.key = full_key;
    op.query = {{"uploadId", id}};
    if (!marker.empty()) op.query.emplace_back("part-number-marker", marker);
    auto [st, resp] = client_.execute_sync(std::move(op));
    if (!st.ok()) return st.annotate("ListParts");
    auto page = parse_list_parts(resp.body);
    if (!page.ok()) return page.status().annotate("ListParts " + client_.describe(full_key));
    for (const PartEntry& p : page->parts) newest = std::max(newest, p.modified_unix_ns);
    if (!page->truncated) return newest;
    if (page->next_part_number_marker == marker)
      return io_error("ListParts " + client_.describe(full_key) + ": truncated page without a new marker");
    marker = page->next_part_number_marker;
  }
}

// Every page of the key's uploads (ListMultipartUploads answers at most
// 1,000 a page), as list_unfinished reads them; each one listed is aborted
// before the next page is asked for (the markers name the last upload
// listed, so aborting those before them changes nothing ahead).
Status S3StorageImpl::abort_unfinished(const std::string& key) {
  CKPTIO_RETURN_IF_ERROR(check_storage_key(key));
  return abort_uploads(full(key), "");
}

Status S3StorageImpl::abort_uploads(const std::string& full_key, const std::string& keep) {
  Status first;
  std::string key_marker, id_marker;
  for (;;) {
    S3Op op;
    op.method = "GET";
    op.query = {{"uploads", ""}, {"prefix", full_key}};
    if (!key_marker.empty()) op.query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) op.query.emplace_back("upload-id-marker", id_marker);
    auto [st, resp] = client_.execute_sync(std::move(op));
    if (!st.ok()) return st.annotate("ListMultipartUploads");
    auto page = parse_list_multipart_uploads(resp.body);
    if (!page.ok()) return page.status().annotate("ListMultipartUploads " + client_.describe(full_key));
    for (const auto& u : page->uploads) {
      if (u.key != full_key || u.upload_id == keep) continue;
      S3Op del;
      del.method = "DELETE";
      del.key = u.key;
      del.query = {{"uploadId", u.upload_id}};
      Status d = client_.execute_sync(std::move(del)).first;
      if (!d.ok() && d.code() != Code::kNotFound && first.ok()) first = d;
    }
    if (!page->truncated) break;
    if (page->next_key_marker == key_marker && page->next_upload_id_marker == id_marker)
      return io_error("ListMultipartUploads " + client_.describe(full_key) + ": truncated page without new markers");
    key_marker = page->next_key_marker;
    id_marker = page->next_upload_id_marker;
  }
  return first;
}

}  // namespace ckptio::s3::storage_internal
