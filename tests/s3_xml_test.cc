// S3 XML: the response bodies AWS documents for each operation (API reference
// "Examples" sections), hostile bodies (truncated, wrong root, huge numbers,
// missing elements, entities, nesting), and the request builders round-tripped
// through pugixml.
#include <gtest/gtest.h>

#include <pugixml.hpp>

#include <string>
#include <tuple>
#include <vector>

#include "backends/s3/s3_xml.h"

namespace ckptio::s3 {
namespace {

// ---- Error ---------------------------------------------------------------------

TEST(S3XmlError, DocumentedNoSuchKey) {
  const auto e = parse_error(R"(<?xml version="1.0" encoding="UTF-8"?>
<Error>
  <Code>NoSuchKey</Code>
  <Message>The resource you requested does not exist</Message>
  <Resource>/mybucket/myfoto.jpg</Resource>
  <RequestId>4442587FB7D0A2F9</RequestId>
</Error>)");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "NoSuchKey");
  EXPECT_EQ(e->message, "The resource you requested does not exist");
  EXPECT_EQ(e->resource, "/mybucket/myfoto.jpg");
  EXPECT_EQ(e->request_id, "4442587FB7D0A2F9");
  const Status st = status_from_s3_error(404, *e);
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_NE(st.message().find("NoSuchKey"), std::string::npos);
  EXPECT_NE(st.message().find("4442587FB7D0A2F9"), std::string::npos);
}

TEST(S3XmlError, NotAnErrorDocument) {
  for (const char* body : {"", "   ", "not xml", "<Error", "<ListBucketResult/>",
                           "<html><body>502 Bad Gateway</body></html>", "<Error/><Error/>"})
    EXPECT_FALSE(parse_error(body).has_value()) << body;
  // An <Error> with nothing in it is still an error document.
  const auto e = parse_error("<Error/>");
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->code.empty());
  EXPECT_EQ(status_from_s3_error(503, *e).code(), Code::kUnavailable);
  EXPECT_EQ(status_from_s3_error(200, *e).code(), Code::kIOError);  // never OK
}

TEST(S3XmlError, ServerTextInStatusIsBounded) {
  S3Error e{"SlowDown", std::string(100000, 'x') + "\x01", "", ""};
  const Status st = status_from_s3_error(503, e);
  EXPECT_EQ(st.code(), Code::kUnavailable);
  EXPECT_LT(st.message().size(), 1000u);
}

// ---- CreateMultipartUpload --------------------------------------------------------

TEST(S3XmlInitiate, Documented) {
  const auto id = parse_initiate_multipart(R"(<?xml version="1.0" encoding="UTF-8"?>
<InitiateMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>example-bucket</Bucket>
  <Key>example-object</Key>
  <UploadId>VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA</UploadId>
</InitiateMultipartUploadResult>)");
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  EXPECT_EQ(*id, "VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA");
}

TEST(S3XmlInitiate, Rejections) {
  for (const char* body :
       {"", "<InitiateMultipartUploadResult><Bucket>b</Bucket></InitiateMultipartUploadResult>",
        "<InitiateMultipartUploadResult><UploadId></UploadId></InitiateMultipartUploadResult>",
        "<InitiateMultipartUploadResult><UploadId>a</UploadId><UploadId>b</UploadId>"
        "</InitiateMultipartUploadResult>",
        "<InitiateMultipartUploadResult><UploadId><x/></UploadId></InitiateMultipartUploadResult>",
        "<InitiateMultipartUploadResult><UploadId>abc</UploadId>",
        "<CompleteMultipartUploadResult><UploadId>a</UploadId></CompleteMultipartUploadResult>"}) {
    const auto r = parse_initiate_multipart(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), Code::kIOError) << body;
    EXPECT_NE(r.status().message().find("CreateMultipartUpload"), std::string::npos);
  }
  const auto denied = parse_initiate_multipart(
      "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>");
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), Code::kPermissionDenied);
}

TEST(S3XmlInitiate, WhitespaceOnlyValueIsKept) {
  // pugixml drops whitespace-only text by default; a key or id of spaces is real.
  const auto id = parse_initiate_multipart(
      "<InitiateMultipartUploadResult><UploadId>  </UploadId></InitiateMultipartUploadResult>");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, "  ");
}

// ---- CompleteMultipartUpload --------------------------------------------------------

TEST(S3XmlComplete, Documented) {
  const auto r = parse_complete_multipart(R"(<?xml version="1.0" encoding="UTF-8"?>
<CompleteMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Location>http://Example-Bucket.s3.Region.amazonaws.com/Example-Object</Location>
  <Bucket>Example-Bucket</Bucket>
  <Key>Example-Object</Key>
  <ETag>"3858f62230ac3c915f300c664312c11f-9"</ETag>
</CompleteMultipartUploadResult>)");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->etag, "\"3858f62230ac3c915f300c664312c11f-9\"");
  // The same with the ETag's quotes as entities, as many servers write it.
  const auto q = parse_complete_multipart(
      "<CompleteMultipartUploadResult><ETag>&quot;3858f62230ac3c915f300c664312c11f-9&quot;</ETag>"
      "</CompleteMultipartUploadResult>");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->etag, r->etag);
}

// Ceph's radosgw 16.2 completes an upload with an empty <ETag> (captured from
// the ceph fixture, tests/s3/ceph-rgw): a success, not a malformed answer.
TEST(S3XmlComplete, CephsEmptyETagIsASuccess) {
  const auto r = parse_complete_multipart(
      R"(<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult )"
      R"(xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Location>http://127.0.0.1:56943/ckptio-test/mp1)"
      R"(</Location><Bucket>ckptio-test</Bucket><Key>mp1</Key><ETag></ETag></CompleteMultipartUploadResult>)");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->etag, "");
}

TEST(S3XmlComplete, ErrorInside200IsRetryable) {
  // The documented "200 OK with an error" response (note the blank line).
  const auto r = parse_complete_multipart(R"(<?xml version="1.0" encoding="UTF-8"?>

<Error>
  <Code>InternalError</Code>
  <Message>We encountered an internal error. Please try again.</Message>
  <RequestId>656c76696e6727732072657175657374</RequestId>
  <HostId>Uuag1LuByRx9e6j5Onimru9pO4ZVKnJ2Qz7/C1NPcfTWAtRPfTaOFg==</HostId>
</Error>)");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_TRUE(r.status().retryable());
  EXPECT_NE(r.status().message().find("InternalError"), std::string::npos);
  EXPECT_NE(r.status().message().find("We encountered an internal error"), std::string::npos);

  const auto slow = parse_complete_multipart(
      "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>");
  ASSERT_FALSE(slow.ok());
  EXPECT_EQ(slow.status().code(), Code::kUnavailable);

  const auto gone = parse_complete_multipart(
      "<Error><Code>NoSuchUpload</Code><Message>The specified upload does not exist.</Message></Error>");
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), Code::kNotFound);
  EXPECT_FALSE(gone.status().retryable());

  const auto small = parse_complete_multipart(
      "<Error><Code>EntityTooSmall</Code><Message>Your proposed upload is smaller than the minimum "
      "allowed object size.</Message><ProposedSize>1</ProposedSize></Error>");
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), Code::kInvalidArgument);
}

TEST(S3XmlComplete, Rejections) {
  for (const char* body :
       {"", "<CompleteMultipartUploadResult/>",
        "<CompleteMultipartUploadResult><ETag>\"a\"</ETag>",  // truncated
        "<?xml version=\"1.0\"?>"}) {
    const auto r = parse_complete_multipart(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), Code::kIOError);
  }
}

// ---- ListObjectsV2 -------------------------------------------------------------------

TEST(S3XmlList, DocumentedStartAfter) {
  const auto p = parse_list_objects_v2(R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>quotes</Name>
  <Prefix>E</Prefix>
  <StartAfter>ExampleGuide.pdf</StartAfter>
  <KeyCount>1</KeyCount>
  <MaxKeys>3</MaxKeys>
  <IsTruncated>false</IsTruncated>
  <Contents>
    <Key>ExampleObject.txt</Key>
    <LastModified>2013-09-17T18:07:53.000Z</LastModified>
    <ETag>"599bab3ed2c697f1d26842727561fd94"</ETag>
    <Size>857</Size>
    <StorageClass>REDUCED_REDUNDANCY</StorageClass>
  </Contents>
</ListBucketResult>)");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_FALSE(p->truncated);
  ASSERT_EQ(p->objects.size(), 1u);
  EXPECT_EQ(p->objects[0].key, "ExampleObject.txt");
  EXPECT_EQ(p->objects[0].size, 857u);
  EXPECT_EQ(p->objects[0].etag, "\"599bab3ed2c697f1d26842727561fd94\"");
  EXPECT_EQ(p->objects[0].modified_unix_ns, 1379441273'000000000);  // 2013-09-17T18:07:53.000Z
  EXPECT_TRUE(p->common_prefixes.empty());
  EXPECT_TRUE(p->next_continuation_token.empty());
}

TEST(S3XmlList, DocumentedDelimiter) {
  const auto p = parse_list_objects_v2(R"(<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>example-bucket</Name>
  <Prefix>photos/2006/</Prefix>
  <KeyCount>2</KeyCount>
  <MaxKeys>1000</MaxKeys>
  <Delimiter>/</Delimiter>
  <IsTruncated>false</IsTruncated>

  <CommonPrefixes>
    <Prefix>photos/2006/February/</Prefix>
  </CommonPrefixes>
  <CommonPrefixes>
    <Prefix>photos/2006/January/</Prefix>
  </CommonPrefixes>
</ListBucketResult>)");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE(p->objects.empty());
  EXPECT_EQ(p->common_prefixes,
            (std::vector<std::string>{"photos/2006/February/", "photos/2006/January/"}));
}

TEST(S3XmlList, DocumentedContinuationToken) {
  const auto p = parse_list_objects_v2(R"(<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>bucket</Name>
  <Prefix></Prefix>
  <NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>
  <KeyCount>1000</KeyCount>
  <MaxKeys>1000</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <Contents>
    <Key>happyface.jpg</Key>
    <LastModified>2014-11-21T19:40:05.000Z</LastModified>
    <ETag>"70ee1738b6b21e2c8a43f3a5ab0eee71"</ETag>
    <Size>11</Size>
    <StorageClass>STANDARD</StorageClass>
  </Contents>
</ListBucketResult>)");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE(p->truncated);
  EXPECT_EQ(p->next_continuation_token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
  ASSERT_EQ(p->objects.size(), 1u);
  EXPECT_EQ(p->objects[0].size, 11u);
}

TEST(S3XmlList, UrlEncodingType) {
  const auto p = parse_list_objects_v2(
      "<ListBucketResult><IsTruncated>false</IsTruncated><EncodingType>url</EncodingType>"
      "<Contents><Key>run-5/a+b%2Bc%20d%0A%E1%88%B4</Key><Size>1</Size></Contents>"
      "<CommonPrefixes><Prefix>dir%2Fwith+space/</Prefix></CommonPrefixes></ListBucketResult>");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->objects[0].key, "run-5/a b+c d\n\xE1\x88\xB4");
  EXPECT_EQ(p->common_prefixes[0], "dir/with space/");
  // Without the encoding type, the same text is taken literally.
  const auto lit = parse_list_objects_v2(
      "<ListBucketResult><IsTruncated>false</IsTruncated>"
      "<Contents><Key>a+b%2B</Key><Size>1</Size></Contents></ListBucketResult>");
  ASSERT_TRUE(lit.ok());
  EXPECT_EQ(lit->objects[0].key, "a+b%2B");
  for (const char* bad : {"a%", "a%2", "a%zz", "%G0"}) {
    const auto r = parse_list_objects_v2(
        std::string("<ListBucketResult><IsTruncated>false</IsTruncated><EncodingType>url</EncodingType>"
                    "<Contents><Key>") + bad + "</Key><Size>1</Size></Contents></ListBucketResult>");
    EXPECT_FALSE(r.ok()) << bad;
  }
  EXPECT_FALSE(parse_list_objects_v2("<ListBucketResult><IsTruncated>false</IsTruncated>"
                                     "<EncodingType>base64</EncodingType></ListBucketResult>").ok());
}

TEST(S3XmlList, SizesAreStrictUint64) {
  auto with_size = [](const std::string& size) {
    return parse_list_objects_v2("<ListBucketResult><IsTruncated>false</IsTruncated><Contents>"
                                 "<Key>k</Key><Size>" + size + "</Size></Contents></ListBucketResult>");
  };
  ASSERT_TRUE(with_size("0").ok());
  const auto max = with_size("18446744073709551615");
  ASSERT_TRUE(max.ok());
  EXPECT_EQ(max->objects[0].size, UINT64_MAX);
  for (const char* bad : {"18446744073709551616", "99999999999999999999999999", "-1", "+1", " 1",
                          "1 ", "1.0", "1e3", "0x10", "", "abc", "&#x31;x"}) {
    const auto r = with_size(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kIOError);
    EXPECT_NE(r.status().message().find("Size"), std::string::npos);
  }
  // Character references decode before the digit check.
  const auto ref = with_size("&#x31;2");
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref->objects[0].size, 12u);
}

TEST(S3XmlList, Rejections) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty"},
      {"<ListBucketResult>", "truncated"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k</Key>", "truncated"},
      {"<ListAllMyBucketsResult/>", "wrong root"},
      {"<ListBucketResult/>", "missing IsTruncated"},
      {"<ListBucketResult><IsTruncated>maybe</IsTruncated></ListBucketResult>", "bad bool"},
      {"<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>", "truncated, no token"},
      {"<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken/></ListBucketResult>",
       "empty token"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated><IsTruncated>true</IsTruncated>"
       "</ListBucketResult>", "repeated IsTruncated"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Size>1</Size></Contents>"
       "</ListBucketResult>", "missing Key"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k</Key></Contents>"
       "</ListBucketResult>", "missing Size"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k</Key><Size>1</Size>"
       "<Size>2</Size></Contents></ListBucketResult>", "repeated Size"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated><CommonPrefixes/></ListBucketResult>",
       "prefix without Prefix"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult><Extra/>", "two roots"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>trailing", "text after root"},
      {"junk<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>", "text before root"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult><![CDATA[x]]>",
       "CDATA after root"},
      {std::string("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>") + '\0' +
           "<x",
       "NUL byte after the root"},
      {std::string("<ListBucketResult><IsTruncated>fa") + '\0' + "lse</IsTruncated></ListBucketResult>",
       "NUL byte inside"},
  };
  for (const auto& [body, why] : cases) {
    const auto r = parse_list_objects_v2(body);
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_EQ(r.status().code(), Code::kIOError) << why;
    EXPECT_NE(r.status().message().find("ListObjectsV2"), std::string::npos) << why;
  }
}

TEST(S3XmlList, EntitiesNeverExpand) {
  // No DTD processing: an undefined entity reference stays literal text (as
  // pugixml leaves it), and a billion-laughs DOCTYPE expands nothing.
  const auto undefined = parse_list_objects_v2(
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>&undefined;</Key>"
      "<Size>1</Size></Contents></ListBucketResult>");
  ASSERT_TRUE(undefined.ok()) << undefined.status().to_string();
  EXPECT_EQ(undefined->objects[0].key, "&undefined;");

  std::string bomb = "<?xml version=\"1.0\"?><!DOCTYPE lolz [<!ENTITY lol0 \"lol\">";
  for (int i = 1; i < 10; ++i) {
    std::string ten;
    for (int j = 0; j < 10; ++j) ten += "&lol" + std::to_string(i - 1) + ";";
    bomb += "<!ENTITY lol" + std::to_string(i) + " \"" + ten + "\">";
  }
  bomb += "]><ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>&lol9;</Key>"
          "<Size>1</Size></Contents></ListBucketResult>";
  const auto r = parse_list_objects_v2(bomb);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->objects[0].key, "&lol9;");

  // Predefined entities, character references and CDATA do decode.
  const auto ok = parse_list_objects_v2(
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a&amp;b&lt;c&gt;d&quot;e&apos;"
      "f&#x41;&#66;&#13;<![CDATA[<&>]]></Key><Size>1</Size></Contents></ListBucketResult>");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->objects[0].key, "a&b<c>d\"e'fAB\r<&>");
}

TEST(S3XmlList, HostileShapesAreTotal) {
  // Deep nesting, many elements, long text: bounded work, no crash.
  std::string deep = "<ListBucketResult><IsTruncated>false</IsTruncated>";
  for (int i = 0; i < 100000; ++i) deep += "<a>";
  for (int i = 0; i < 100000; ++i) deep += "</a>";
  deep += "</ListBucketResult>";
  EXPECT_TRUE(parse_list_objects_v2(deep).ok());
  std::string unclosed = "<ListBucketResult>";
  for (int i = 0; i < 100000; ++i) unclosed += "<Contents>";
  EXPECT_FALSE(parse_list_objects_v2(unclosed).ok());
  std::string many = "<ListBucketResult><IsTruncated>false</IsTruncated>";
  for (int i = 0; i < 20000; ++i)
    many += "<Contents><Key>k" + std::to_string(i) + "</Key><Size>" + std::to_string(i) + "</Size></Contents>";
  many += "</ListBucketResult>";
  const auto m = parse_list_objects_v2(many);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->objects.size(), 20000u);
  EXPECT_EQ(m->objects.back().size, 19999u);
  const std::string huge(kMaxXmlBody + 1, ' ');
  const auto h = parse_list_objects_v2(huge);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), Code::kIOError);
  // Every prefix of a valid document is answered without crashing.
  const std::string doc =
      "<?xml version=\"1.0\"?><ListBucketResult><IsTruncated>true</IsTruncated><EncodingType>url"
      "</EncodingType><NextContinuationToken>t</NextContinuationToken><Contents><Key>a%20b</Key>"
      "<Size>12</Size><ETag>&quot;e&quot;</ETag></Contents><CommonPrefixes><Prefix>p/</Prefix>"
      "</CommonPrefixes></ListBucketResult>";
  for (size_t n = 0; n < doc.size(); ++n) (void)parse_list_objects_v2(doc.substr(0, n));
  EXPECT_TRUE(parse_list_objects_v2(doc).ok());
  // Arbitrary bytes.
  std::string noise;
  uint32_t x = 12345;
  for (int i = 0; i < 4096; ++i) {
    x = x * 1103515245 + 12345;
    noise.push_back(static_cast<char>("<>/&;#x ListBucketResultIsTruncatedContents\"'![]?="[(x >> 16) % 48]));
    (void)parse_list_objects_v2(noise);
  }
}

// ---- ListMultipartUploads ----------------------------------------------------------

TEST(S3XmlUploads, Documented) {
  const auto p = parse_list_multipart_uploads(R"(<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>bucket</Bucket>
  <KeyMarker></KeyMarker>
  <UploadIdMarker></UploadIdMarker>
  <NextKeyMarker>my-movie.m2ts</NextKeyMarker>
  <NextUploadIdMarker>YW55IGlkZWEgd2h5IGVsdmluZydzIHVwbG9hZCBmYWlsZWQ</NextUploadIdMarker>
  <MaxUploads>3</MaxUploads>
  <IsTruncated>true</IsTruncated>
  <Upload>
    <Key>my-divisor</Key>
    <UploadId>XMgbGlrZSBlbHZpbmcncyBub3QgaGF2aW5nIG11Y2ggbHVjaw</UploadId>
    <Initiator>
      <ID>arn:aws:iam::111122223333:user/user1-11111a31-17b5-4fb7-9df5-b111111f13de</ID>
      <DisplayName>user1-11111a31-17b5-4fb7-9df5-b111111f13de</DisplayName>
    </Initiator>
    <Owner>
      <ID>75aa57f09aa0c8caeab4f8c24e99d10f8e7faeebf76c078efc7c6caea54ba06a</ID>
      <DisplayName>OwnerDisplayName</DisplayName>
    </Owner>
    <StorageClass>STANDARD</StorageClass>
    <Initiated>2010-11-10T20:48:33.000Z</Initiated>
  </Upload>
  <Upload>
    <Key>my-movie.m2ts</Key>
    <UploadId>VXBsb2FkIElEIGZvciBlbHZpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA</UploadId>
    <Initiator>
      <ID>b1d16700c70b0b05597d7acd6a3f92be</ID>
      <DisplayName>InitiatorDisplayName</DisplayName>
    </Initiator>
    <Owner>
      <ID>b1d16700c70b0b05597d7acd6a3f92be</ID>
      <DisplayName>OwnerDisplayName</DisplayName>
    </Owner>
    <StorageClass>STANDARD</StorageClass>
    <Initiated>2010-11-10T20:48:33.000Z</Initiated>
  </Upload>
  <Upload>
    <Key>my-movie.m2ts</Key>
    <UploadId>YW55IGlkZWEgd2h5IGVsdmluZydzIHVwbG9hZCBmYWlsZWQ</UploadId>
    <Initiator>
      <ID>arn:aws:iam::444455556666:user/user1-22222a31-17b5-4fb7-9df5-b222222f13de</ID>
      <DisplayName>user1-22222a31-17b5-4fb7-9df5-b222222f13de</DisplayName>
    </Initiator>
    <Owner>
      <ID>b1d16700c70b0b05597d7acd6a3f92be</ID>
      <DisplayName>OwnerDisplayName</DisplayName>
    </Owner>
    <StorageClass>STANDARD</StorageClass>
    <Initiated>2010-11-10T20:49:33.000Z</Initiated>
  </Upload>
</ListMultipartUploadsResult>)");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE(p->truncated);
  EXPECT_EQ(p->next_key_marker, "my-movie.m2ts");
  EXPECT_EQ(p->next_upload_id_marker, "YW55IGlkZWEgd2h5IGVsdmluZydzIHVwbG9hZCBmYWlsZWQ");
  ASSERT_EQ(p->uploads.size(), 3u);
  EXPECT_EQ(p->uploads[0].key, "my-divisor");
  EXPECT_EQ(p->uploads[0].upload_id, "XMgbGlrZSBlbHZpbmcncyBub3QgaGF2aW5nIG11Y2ggbHVjaw");
  EXPECT_EQ(p->uploads[2].key, "my-movie.m2ts");
  EXPECT_EQ(p->uploads[2].upload_id, "YW55IGlkZWEgd2h5IGVsdmluZydzIHVwbG9hZCBmYWlsZWQ");
  EXPECT_EQ(p->uploads[0].initiated_unix_ns, 1289422113'000000000);  // 2010-11-10T20:48:33.000Z
  EXPECT_EQ(p->uploads[2].initiated_unix_ns, 1289422173'000000000);  // 20:49:33
}

// ListParts: gc dates an unfinished upload by its newest part.
TEST(S3XmlParts, DocumentedMotoAndRejections) {
  const auto p = parse_list_parts(R"(<?xml version="1.0" encoding="UTF-8"?>
<ListPartsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>example-bucket</Bucket><Key>example-object</Key><UploadId>XXBsb2FkIElE</UploadId>
  <PartNumberMarker>1</PartNumberMarker><NextPartNumberMarker>3</NextPartNumberMarker>
  <MaxParts>2</MaxParts><IsTruncated>true</IsTruncated>
  <Part><PartNumber>2</PartNumber><LastModified>2010-11-10T20:48:34.000Z</LastModified>
    <ETag>"7778aef83f66abc1fa1e8477f296d394"</ETag><Size>10485760</Size></Part>
  <Part><PartNumber>3</PartNumber><LastModified>2010-11-10T20:48:33.000Z</LastModified>
    <ETag>"aaaa18db4cc2f85cedef654fccc4a4x8"</ETag><Size>10485760</Size></Part>
</ListPartsResult>)");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE(p->truncated);
  EXPECT_EQ(p->next_part_number_marker, "3");
  ASSERT_EQ(p->parts.size(), 2u);
  EXPECT_EQ(p->parts[0].number, 2u);
  EXPECT_EQ(p->parts[0].modified_unix_ns, 1289422114'000000000);
  // moto's root name, same children.
  const auto m = parse_list_parts(
      "<ListPartsResponse><IsTruncated>false</IsTruncated><Part><PartNumber>1</PartNumber>"
      "<LastModified>2026-11-23T18:13:08.000Z</LastModified></Part></ListPartsResponse>");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->parts.at(0).modified_unix_ns, 1795457588'000000000);
  for (const char* bad :
       {"<ListPartsResult><IsTruncated>true</IsTruncated></ListPartsResult>",
        "<ListPartsResult><IsTruncated>false</IsTruncated><Part><LastModified>2026-11-23T18:13:08Z</LastModified>"
        "</Part></ListPartsResult>",
        "<ListPartsResult><IsTruncated>false</IsTruncated><Part><PartNumber>1</PartNumber>"
        "<LastModified>soon</LastModified></Part></ListPartsResult>",
        "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>"}) {
    auto r = parse_list_parts(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kIOError) << bad;
  }
}

// S3's times, as gc reads them (LastModified, Initiated).
TEST(S3XmlTime, Iso8601UtcOnly) {
  constexpr int64_t kS = 1'000'000'000;
  EXPECT_EQ(parse_s3_timestamp("2026-11-23T17:50:30.000Z"), 1795456230 * kS);
  EXPECT_EQ(parse_s3_timestamp("2026-11-23T17:50:30Z"), 1795456230 * kS);
  EXPECT_EQ(parse_s3_timestamp("2026-11-23T17:50:30.5Z"), 1795456230 * kS + 500'000'000);
  EXPECT_EQ(parse_s3_timestamp("2026-11-23T17:50:30.123456789123Z"), 1795456230 * kS + 123456789);
  EXPECT_EQ(parse_s3_timestamp("2026-11-23T17:50:30+00:00"), 1795456230 * kS);
  EXPECT_EQ(parse_s3_timestamp("2000-02-29T00:00:00Z"), 951782400 * kS);
  EXPECT_EQ(parse_s3_timestamp("1970-01-01T00:00:00.000Z"), 0);
  EXPECT_EQ(parse_s3_timestamp("2261-12-31T23:59:59.999999999Z"), 9214646399 * kS + 999999999);
  EXPECT_EQ(parse_s3_timestamp("2262-04-11T23:47:16.854775807Z"), INT64_MAX);
  for (const char* bad : {"", "2026-11-23", "2026-11-23T17:50:30", "2026-11-23T17:50:30.Z",
                          "2026-11-23T17:50:30+01:00", "2026-13-01T00:00:00Z", "2026-02-29T00:00:00Z",
                          "2026-04-31T00:00:00Z", "2026-11-23T24:00:00Z", "1969-12-31T23:59:59Z",
                          "2026-11-23 17:50:30Z", "+2026-11-23T17:50:30Z", "2026-11-23T17:50:30ZZ",
                          "2026-1a-23T17:50:30Z", "Mon, 23 Nov 2026 17:50:30 GMT",
                          "2262-04-11T23:47:16.854775808Z", "2262-04-11T23:47:17Z", "9999-12-31T23:59:59Z",
                          "2026-11-23T17:50:30-00:00", "2026-11-23T17:50:30+00:01"})
    EXPECT_FALSE(parse_s3_timestamp(bad)) << bad;
  // In a listing, a time that is present must be one.
  const auto p = parse_list_objects_v2(
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k</Key><Size>1</Size>"
      "<LastModified>yesterday</LastModified></Contents></ListBucketResult>");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("<LastModified> is 'yesterday', expected an ISO 8601 UTC time"),
            std::string::npos) << p.status().message();
  // Absent: unknown (0).
  const auto q = parse_list_objects_v2(
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k</Key><Size>1</Size>"
      "</Contents></ListBucketResult>");
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->objects.at(0).modified_unix_ns, 0);
}

TEST(S3XmlUploads, EmptyUrlEncodedAndRejections) {
  const auto empty = parse_list_multipart_uploads(
      "<ListMultipartUploadsResult><Bucket>b</Bucket><IsTruncated>false</IsTruncated>"
      "</ListMultipartUploadsResult>");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->uploads.empty());
  const auto enc = parse_list_multipart_uploads(
      "<ListMultipartUploadsResult><EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>"
      "<NextKeyMarker>a%2Bb+c</NextKeyMarker><NextUploadIdMarker>id+1</NextUploadIdMarker>"
      "<Upload><Key>a%2Bb+c</Key><UploadId>id+1</UploadId></Upload></ListMultipartUploadsResult>");
  ASSERT_TRUE(enc.ok()) << enc.status().to_string();
  EXPECT_EQ(enc->uploads[0].key, "a+b c");
  EXPECT_EQ(enc->uploads[0].upload_id, "id+1");  // ids are never encoded
  EXPECT_EQ(enc->next_key_marker, "a+b c");
  EXPECT_EQ(enc->next_upload_id_marker, "id+1");
  for (const char* body :
       {"<ListMultipartUploadsResult><IsTruncated>true</IsTruncated></ListMultipartUploadsResult>",
        "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated><Upload><Key>k</Key></Upload>"
        "</ListMultipartUploadsResult>",
        "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated><Upload><UploadId>i</UploadId>"
        "</Upload></ListMultipartUploadsResult>",
        "<ListMultipartUploadsResult/>", "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>"}) {
    const auto r = parse_list_multipart_uploads(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), Code::kIOError);
  }
}

// ---- DeleteObjects ---------------------------------------------------------------------

TEST(S3XmlDelete, Documented) {
  const auto r = parse_delete_objects(R"(<?xml version="1.0" encoding="UTF-8"?>
<DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Deleted>
    <Key>sample1.txt</Key>
  </Deleted>
  <Error>
    <Key>sample2.txt</Key>
    <Code>AccessDenied</Code>
    <Message>Access Denied</Message>
  </Error>
</DeleteResult>)");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->deleted, std::vector<std::string>{"sample1.txt"});
  ASSERT_EQ(r->errors.size(), 1u);
  EXPECT_EQ(r->errors[0].first, "sample2.txt");
  EXPECT_EQ(r->errors[0].second.code, "AccessDenied");
  EXPECT_EQ(r->errors[0].second.message, "Access Denied");
}

TEST(S3XmlDelete, QuietVersionedAndRejections) {
  const auto quiet = parse_delete_objects(
      "<DeleteResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"></DeleteResult>");
  ASSERT_TRUE(quiet.ok());
  EXPECT_TRUE(quiet->deleted.empty());
  EXPECT_TRUE(quiet->errors.empty());
  const auto versioned = parse_delete_objects(
      "<DeleteResult><Deleted><Key>a</Key><DeleteMarker>true</DeleteMarker>"
      "<DeleteMarkerVersionId>v</DeleteMarkerVersionId></Deleted></DeleteResult>");
  ASSERT_TRUE(versioned.ok());
  EXPECT_EQ(versioned->deleted, std::vector<std::string>{"a"});
  for (const char* body : {"<DeleteResult><Deleted/></DeleteResult>",
                           "<DeleteResult><Error><Code>AccessDenied</Code></Error></DeleteResult>",
                           "<DeleteResult><Error><Key>k</Key></Error></DeleteResult>",
                           "<Delete><Object><Key>k</Key></Object></Delete>", "<DeleteResult>"}) {
    const auto r = parse_delete_objects(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), Code::kIOError) << body;
  }
  const auto whole = parse_delete_objects("<Error><Code>MalformedXML</Code><Message>m</Message></Error>");
  ASSERT_FALSE(whole.ok());
  EXPECT_EQ(whole.status().code(), Code::kInvalidArgument);
}

// ---- Builders -----------------------------------------------------------------------------

TEST(S3XmlBuild, CompleteMultipartRoundTrip) {
  const std::vector<CompletedPart> parts = {
      {3, "\"acbd18db4cc2f85cedef654fccc4a4d8\"", "4waSgw=="},
      {1, "\"a54357aff0632cce46d942af68356b38\"", "AAAAAA=="},
      {2, "\"0c78aef83f66abc1fa1e8477f296d394\"", ""},
      {4, "odd<&>'\"etag", "+/8="}};
  const std::string body = build_complete_multipart(parts);
  pugi::xml_document doc;
  ASSERT_TRUE(doc.load_string(body.c_str()));
  const pugi::xml_node root = doc.document_element();
  EXPECT_STREQ(root.name(), "CompleteMultipartUpload");
  EXPECT_STREQ(root.attribute("xmlns").value(), "http://s3.amazonaws.com/doc/2006-03-01/");
  std::vector<std::tuple<int, std::string, std::string>> back;
  for (pugi::xml_node p : root.children("Part")) {
    back.emplace_back(p.child("PartNumber").text().as_int(), p.child_value("ETag"), p.child_value("ChecksumCRC32C"));
    // No empty <ChecksumCRC32C/> for a part sent without one.
    EXPECT_EQ(!p.child("ChecksumCRC32C").empty(), !std::get<2>(back.back()).empty());
  }
  std::vector<std::tuple<int, std::string, std::string>> sorted;
  for (size_t i : {1, 2, 0, 3}) sorted.emplace_back(parts[i].number, parts[i].etag, parts[i].checksum_crc32c);
  EXPECT_EQ(back, sorted);
  EXPECT_EQ(build_complete_multipart({}),
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CompleteMultipartUpload "
            "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"></CompleteMultipartUpload>");
}

TEST(S3XmlBuild, DeleteObjectsRoundTrip) {
  const std::vector<std::string> keys = {"sample1.txt", "run-5/a&b<c>d\"e'f", "cr\rlf\nt\tab",
                                         "ключ/\xE1\x88\xB4", " spaced ", "]]>"};
  for (bool quiet : {false, true}) {
    const std::string body = build_delete_objects(keys, quiet);
    pugi::xml_document doc;
    ASSERT_TRUE(doc.load_string(body.c_str(), pugi::parse_default | pugi::parse_ws_pcdata_single));
    const pugi::xml_node root = doc.document_element();
    EXPECT_STREQ(root.name(), "Delete");
    EXPECT_EQ(root.child("Quiet").empty(), !quiet);
    if (quiet) {
      EXPECT_STREQ(root.child_value("Quiet"), "true");
    }
    std::vector<std::string> back;
    for (pugi::xml_node o : root.children("Object")) back.emplace_back(o.child_value("Key"));
    EXPECT_EQ(back, keys);
  }
  EXPECT_NE(build_delete_objects({"a\rb"}, false).find("a&#13;b"), std::string::npos);
  EXPECT_EQ(build_delete_objects({"sample1.txt", "sample2.txt"}, true),
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Delete xmlns=\"http://s3.amazonaws.com/doc/"
            "2006-03-01/\"><Quiet>true</Quiet><Object><Key>sample1.txt</Key></Object><Object><Key>"
            "sample2.txt</Key></Object></Delete>");
}

}  // namespace
}  // namespace ckptio::s3

namespace ckptio::s3 {
namespace {
// moto answers CompleteMultipartUpload with a differently named root.
TEST(S3XmlComplete, AcceptsMotoRootName) {
  auto r = parse_complete_multipart(
      R"(<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResponse xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Location>http://b/k</Location><Bucket>b</Bucket><Key>k</Key><ETag>"abc-2"</ETag></CompleteMultipartUploadResponse>)");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->etag, "\"abc-2\"");
  EXPECT_FALSE(parse_complete_multipart("<Other><ETag>x</ETag></Other>").ok());
}
}  // namespace
}  // namespace ckptio::s3
