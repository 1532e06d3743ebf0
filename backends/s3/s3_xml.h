// S3's XML response bodies, parsed with pugixml, and the two request bodies
// the backend sends. Pure functions; safe from any thread.
//
// Strict and total: every parser accepts any byte string (truncated, hostile,
// gigantic, wrong document) and answers with a value or a Status; nothing
// throws or crashes. A body that is not what the operation promised is
// Code::kIOError naming the operation and what was expected (not kDataLoss:
// the server's answer is garbled, no stored bytes are known to be damaged).
// Bodies larger than kMaxXmlBody are refused unparsed.
//
// An <Error> document where a result was expected (S3 returns one inside a 200
// for CompleteMultipartUpload) becomes an error Status whose message carries
// the S3 code and message, and whose code is code_for_http(200, <Code>): for
// example kUnavailable (retryable) for InternalError and SlowDown.
//
// Unknown elements are ignored, so newer servers' additions do not break us.
// The DTD is never processed: only the five predefined entities and numeric
// character references are expanded, so entity bombs cannot grow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckptio/status.h"

namespace ckptio::s3 {

inline constexpr size_t kMaxXmlBody = 64u << 20;
// DeleteObjects takes at most this many keys per request.
inline constexpr size_t kMaxDeleteKeys = 1000;

struct S3Error {
  std::string code;        // "NoSuchKey", "SlowDown", ...
  std::string message;
  std::string resource;
  std::string request_id;
};

// The <Error> document of a failed request; nullopt when `body` is not one
// (empty, not XML, another root). Missing fields are left empty.
std::optional<S3Error> parse_error(std::string_view body);

// The Status for an S3 error answered with HTTP `status`: code_for_http(status,
// e.code), message "S3 <code>: <message> (resource <r>, request id <id>)",
// with the server's text truncated to a sane length.
Status status_from_s3_error(long status, const S3Error& e);

// STS AssumeRoleWithWebIdentity and AssumeRole: the temporary credentials
// under <...Result><Credentials>, all four fields required. An STS
// <ErrorResponse><Error><Code>..</Code><Message>..</Message></Error> becomes an
// error: kPermissionDenied for the identity and access codes
// (InvalidIdentityToken, ExpiredTokenException, AccessDenied, ...),
// kUnavailable for throttling and IDPCommunicationError, else kIOError.
struct StsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;
  int64_t expiration_unix_ns = 0;
};
Result<StsCredentials> parse_sts_credentials(std::string_view body);

// CreateMultipartUpload (POST ?uploads): the UploadId, non-empty.
Result<std::string> parse_initiate_multipart(std::string_view body);

struct CompleteResult {
  std::string etag;  // as returned, quotes included: "\"3858f...-9\""; may be empty
};
// CompleteMultipartUpload: the final ETag (the element is required; Ceph's
// radosgw 16 sends it empty). An <Error> body inside a 200 comes back as an
// error Status (see above).
Result<CompleteResult> parse_complete_multipart(std::string_view body);

struct ObjectEntry {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // may be empty if the server omits it
  int64_t modified_unix_ns = 0;  // LastModified; 0 if the server omits it
};
struct ListPage {
  std::vector<ObjectEntry> objects;
  std::vector<std::string> common_prefixes;
  bool truncated = false;
  std::string next_continuation_token;  // non-empty whenever truncated
};
// S3's times ("2026-11-23T17:50:30.000Z": ISO 8601, UTC, optional fraction;
// "+00:00" for Z accepted) as ns since the Unix epoch; nullopt for anything
// else (other zones, out-of-range fields, times before 1970 or after
// 2262-04-11T23:47:16Z, which int64 nanoseconds cannot hold). The reader is
// src/util/iso8601.h's.
std::optional<int64_t> parse_s3_timestamp(std::string_view s);

// ListObjectsV2 (GET ?list-type=2). Required: IsTruncated; per object Key and
// Size (decimal digits only, fits uint64); optional LastModified (a time as
// above, else an error); per common prefix Prefix; and
// NextContinuationToken when IsTruncated is true (else pagination could stop
// silently or loop). With <EncodingType>url</EncodingType>, keys and prefixes
// are URL-decoded ('+' is a space, %XX a byte), as S3 encodes them.
Result<ListPage> parse_list_objects_v2(std::string_view body);

struct UploadEntry {
  std::string key, upload_id;
  int64_t initiated_unix_ns = 0;  // Initiated; 0 if the server omits it
};
struct UploadsPage {
  std::vector<UploadEntry> uploads;
  bool truncated = false;
  std::string next_key_marker, next_upload_id_marker;  // key marker non-empty when truncated
};
// ListMultipartUploads (GET ?uploads). Required: IsTruncated, per upload Key
// and UploadId, NextKeyMarker when truncated; optional Initiated (a time).
// EncodingType=url as above.
Result<UploadsPage> parse_list_multipart_uploads(std::string_view body);

struct PartEntry {
  uint64_t number = 0;
  int64_t modified_unix_ns = 0;  // LastModified; 0 if the server omits it
};
struct PartsPage {
  std::vector<PartEntry> parts;
  bool truncated = false;
  std::string next_part_number_marker;  // non-empty when truncated
};
// ListParts (GET key?uploadId=ID; root ListPartsResult, or moto's
// ListPartsResponse). Required: IsTruncated, per part
// PartNumber (decimal), NextPartNumberMarker when truncated; optional
// LastModified (a time). gc reads it: an upload is as recent as its newest
// part.
Result<PartsPage> parse_list_parts(std::string_view body);

struct DeleteResult {
  std::vector<std::string> deleted;
  std::vector<std::pair<std::string, S3Error>> errors;  // key, its error (code, message)
};
// DeleteObjects (POST ?delete). In quiet mode `deleted` is empty: S3 reports
// only the failures.
Result<DeleteResult> parse_delete_objects(std::string_view body);

struct CompletedPart {
  int number = 0;
  std::string etag;             // as UploadPart returned it, quotes included
  std::string checksum_crc32c;  // x-amz-checksum-crc32c as sent with the part; "" for none
};

// The CompleteMultipartUpload request body. Parts are emitted sorted by part
// number, as S3 requires, each with its <ChecksumCRC32C> when it has one (S3
// requires them for an upload created with x-amz-checksum-algorithm). Text is
// XML-escaped.
std::string build_complete_multipart(const std::vector<CompletedPart>& parts);

// The DeleteObjects request body. Precondition: keys.size() <= kMaxDeleteKeys
// (S3 rejects larger requests with MalformedXML; callers batch). Keys are
// XML-escaped, with CR, LF and other control characters written as numeric
// character references so they survive XML line-end normalization. The
// request also needs a Content-MD5 (or x-amz-checksum-*) header of this body.
std::string build_delete_objects(const std::vector<std::string>& keys, bool quiet);

}  // namespace ckptio::s3
