// S3 configuration: s3:// URIs, the ~/.aws ini format, and resolution from
// overrides, environment and profile files (through fake lookups).
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backends/s3/s3_config.h"

namespace ckptio::s3 {
namespace {

// ---- s3:// URIs ------------------------------------------------------------------

TEST(S3Uri, Accepted) {
  struct Case { const char* uri; const char* bucket; const char* prefix; };
  for (const Case& c : {Case{"s3://bucket", "bucket", ""}, Case{"s3://bucket/", "bucket", ""},
                        Case{"s3://bucket/a/b", "bucket", "a/b"}, Case{"s3://bucket/a/b/", "bucket", "a/b"},
                        Case{"s3://my.bucket-1/ckpt", "my.bucket-1", "ckpt"},
                        Case{"s3://ceph_bucket/x y/z+1", "ceph_bucket", "x y/z+1"},
                        Case{"s3://abc/run-5.tmp-1/..a/a..", "abc", "run-5.tmp-1/..a/a.."},
                        Case{"s3://MinIOBucket/\xE1\x88\xB4", "MinIOBucket", "\xE1\x88\xB4"}}) {
    const auto r = parse_s3_uri(c.uri);
    ASSERT_TRUE(r.ok()) << c.uri << ": " << r.status().to_string();
    EXPECT_EQ(r->bucket, c.bucket) << c.uri;
    EXPECT_EQ(r->prefix, c.prefix) << c.uri;
  }
}

TEST(S3Uri, Rejected) {
  for (const std::string& uri : std::vector<std::string>{"", "bucket", "s3:/bucket", "S3://bucket", "file:///x", "s3://", "s3:///a", "s3://ab",
        std::string(68, 'a'), "s3://" + std::string(64, 'a'), "s3://-bucket", "s3://bucket-",
        "s3://.bucket", "s3://bu..cket", "s3://bu cket", "s3://bu\tcket", "s3://bu/cket//",
        "s3://bucket//", "s3://bucket//a", "s3://bucket/a//b", "s3://bucket/a/../b", "s3://bucket/./a",
        "s3://bucket/a/.", "s3://bucket/..", "s3://bucket/a\\b", "s3://bucket?x", "s3://bucket#x",
        "s3://bu:cket", "s3://user@bucket", std::string("s3://bucket/a\0b", 15), "s3://bucket/a\nb",
        "s3://bucket/a\x7f", "s3://buck\xC3\xA9t"}) {
    const auto r = parse_s3_uri(uri);
    ASSERT_FALSE(r.ok()) << uri;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << uri;
    EXPECT_NE(r.status().message().find("invalid S3 URI"), std::string::npos);
  }
  // The message names the URI, with control bytes made visible.
  EXPECT_NE(parse_s3_uri("s3://bucket/a\nb").status().message().find("s3://bucket/a\\x0Ab"),
            std::string::npos);
  EXPECT_EQ(parse_s3_uri("s3://" + std::string(63, 'a')).ok(), true);
}

// ---- ~/.aws ini files ------------------------------------------------------------------

TEST(S3Ini, ConfigFile) {
  const auto ini = parse_aws_ini(R"(# a comment
; another
[default]
region = us-west-2
output=json

[profile minio]
aws_access_key_id = AKIAMINIO
Region = eu-central-1   
endpoint_url = http://127.0.0.1:9000
s3 =
  endpoint_url = http://127.0.0.1:9001
  addressing_style = path
max_attempts = 3

[profile  spaced ]
region=ap-south-1
[sso-session corp]
sso_region = us-east-1
[notaprofile]
region = xx
)");
  ASSERT_TRUE(ini.ok()) << ini.status().to_string();
  const AwsIni& m = *ini;
  EXPECT_EQ(m.at("default").at("region"), "us-west-2");
  EXPECT_EQ(m.at("default").at("output"), "json");
  const auto& minio = m.at("minio");
  EXPECT_EQ(minio.at("aws_access_key_id"), "AKIAMINIO");
  EXPECT_EQ(minio.at("region"), "eu-central-1");
  EXPECT_EQ(minio.at("endpoint_url"), "http://127.0.0.1:9000");
  EXPECT_EQ(minio.at("s3.endpoint_url"), "http://127.0.0.1:9001");
  EXPECT_EQ(minio.at("s3.addressing_style"), "path");
  EXPECT_EQ(minio.at("max_attempts"), "3");
  EXPECT_EQ(m.at("spaced").at("region"), "ap-south-1");
  EXPECT_EQ(m.at("sso-session corp").at("sso_region"), "us-east-1");
  EXPECT_EQ(m.count("notaprofile"), 0u);  // the AWS CLI ignores it in the config file
}

TEST(S3Ini, CredentialsFile) {
  const auto ini = parse_aws_ini("[default]\r\naws_access_key_id=AKIA1\r\n"
                                 "aws_secret_access_key = se/cr+et#notacomment\r\n"
                                 "[ci]\naws_access_key_id: AKIA2\naws_secret_access_key = s2\n"
                                 "[profile x]\nregion = r\n",
                                 AwsIniKind::kCredentials);
  ASSERT_TRUE(ini.ok()) << ini.status().to_string();
  EXPECT_EQ(ini->at("default").at("aws_access_key_id"), "AKIA1");
  EXPECT_EQ(ini->at("default").at("aws_secret_access_key"), "se/cr+et#notacomment");
  EXPECT_EQ(ini->at("ci").at("aws_access_key_id"), "AKIA2");
  EXPECT_EQ(ini->at("ci").at("aws_secret_access_key"), "s2");
  EXPECT_EQ(ini->at("profile x").at("region"), "r");  // names are taken as written here
  // A line indented under a key with a value would continue that value
  // (configparser); we refuse rather than guess.
  EXPECT_FALSE(parse_aws_ini("[ci]\naws_access_key_id = A\n\taws_secret_access_key = s\n",
                             AwsIniKind::kCredentials).ok());
}

TEST(S3Ini, IndentationFollowsThePreviousKey) {
  const auto ini = parse_aws_ini("[default]\n  a = 1\n  b = 2\n", AwsIniKind::kCredentials);
  ASSERT_TRUE(ini.ok()) << ini.status().to_string();
  EXPECT_EQ(ini->at("default").at("a"), "1");
  EXPECT_EQ(ini->at("default").at("b"), "2");
}

TEST(S3Ini, EmptyAndRejections) {
  ASSERT_TRUE(parse_aws_ini("").ok());
  EXPECT_TRUE(parse_aws_ini("\n\n# only comments\n").value().empty());
  struct Case { std::string text; const char* line; };
  for (const Case& c : {Case{"region = x\n", "line 1:"},
                        Case{"[default]\njust words\n", "line 2:"},
                        Case{"[default\n", "line 1:"},
                        Case{"[]\n", "line 1:"},
                        Case{"[default]\n= v\n", "line 2:"},
                        Case{"[default]\na = 1\na = 2\n", "line 3:"},
                        Case{"[default]\nA = 1\na = 2\n", "line 3:"},
                        Case{"[default]\n[default]\n", "line 2:"},
                        Case{"[default]\n[profile default]\n", "line 2:"},
                        Case{"[default]\nregion = x\n  continued\n", "line 3:"},
                        Case{"[default]\ns3 =\n  no equals\n", "line 3:"},
                        Case{"[default]\ns3 =\n  a = 1\n  a = 2\n", "line 4:"},
                        Case{"[default]\na = x\x01y\n", "line 2:"},
                        Case{"[a]b]\n", "line 1:"}}) {
    const auto r = parse_aws_ini(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(r.status().message().rfind(c.line, 0), 0u) << r.status().message();
  }
  EXPECT_FALSE(parse_aws_ini(std::string((1 << 20) + 1, '#')).ok());
  // "[profile ]" is a bare "[profile]" section, which the AWS CLI ignores too.
  const auto bare = parse_aws_ini("[profile ]\nregion = x\n");
  ASSERT_TRUE(bare.ok());
  EXPECT_TRUE(bare->empty());
}

TEST(S3Ini, ErrorsNeverQuoteLineContents) {
  const auto r = parse_aws_ini("[default]\nwJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().find("wJalr"), std::string::npos);
  const auto dup = parse_aws_ini("[default]\naws_secret_access_key = s3cr3t\naws_secret_access_key = s3cr3t\n");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().message().find("s3cr3t"), std::string::npos);
}

TEST(S3Ini, TotalOnArbitraryBytes) {
  std::string text;
  uint32_t x = 7;
  for (int i = 0; i < 3000; ++i) {
    x = x * 1103515245 + 12345;
    text.push_back("[]=:#; \t\n\rabp\x01"[(x >> 16) % 15]);
    (void)parse_aws_ini(text);
    (void)parse_aws_ini(text, AwsIniKind::kCredentials);
  }
}

// ---- Resolution --------------------------------------------------------------------------

struct Fakes {
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> files;
  GetEnv getenv() const {
    return [this](const std::string& n) -> std::optional<std::string> {
      auto it = env.find(n);
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
  }
  ReadFile read_file() const {
    return [this](const std::string& p) -> std::optional<std::string> {
      auto it = files.find(p);
      if (it == files.end()) return std::nullopt;
      return it->second;
    };
  }
  Result<S3Config> resolve(const S3ConfigOverrides& o = {}) const {
    return resolve_s3_config(o, getenv(), read_file());
  }
};

TEST(S3Config, NothingConfiguredIsAnonymousAws) {
  Fakes f;
  const auto c = f.resolve();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->endpoint, "https://s3.us-east-1.amazonaws.com");
  EXPECT_EQ(c->region, "us-east-1");
  EXPECT_FALSE(c->path_style);  // virtual-hosted on AWS
  EXPECT_TRUE(c->anonymous);
  EXPECT_TRUE(c->creds.access_key_id.empty());
  EXPECT_EQ(c->max_connections, 32u);
  EXPECT_EQ(c->part_size, 16u << 20);
  EXPECT_EQ(c->retry.max_attempts, 10);
  EXPECT_NE(c->describe_redacted().find("credentials=anonymous"), std::string::npos);
}

TEST(S3Config, EnvironmentCredentialsAndEndpoint) {
  Fakes f;
  f.env = {{"AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE"},
           {"AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"},
           {"AWS_SESSION_TOKEN", "SESSIONTOKENVALUE"},
           {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000/"},
           {"AWS_DEFAULT_REGION", "eu-west-1"}};
  const auto c = f.resolve();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->anonymous);
  EXPECT_EQ(c->creds.access_key_id, "AKIAIOSFODNN7EXAMPLE");
  EXPECT_EQ(c->creds.session_token, "SESSIONTOKENVALUE");
  EXPECT_EQ(c->credentials_source, "environment");
  EXPECT_EQ(c->endpoint, "http://127.0.0.1:9000");
  EXPECT_TRUE(c->path_style);
  EXPECT_EQ(c->region, "eu-west-1");
  const std::string d = c->describe_redacted();
  EXPECT_EQ(d.find("wJalr"), std::string::npos);
  EXPECT_EQ(d.find("EXAMPLEKEY"), std::string::npos);
  EXPECT_EQ(d.find("SESSIONTOKENVALUE"), std::string::npos);
  EXPECT_EQ(d.find("AKIAIOSFODNN7"), std::string::npos);
  EXPECT_NE(d.find("****MPLE"), std::string::npos);
  EXPECT_NE(d.find("http://127.0.0.1:9000"), std::string::npos);
  // The S3-specific variable wins; AWS_REGION beats AWS_DEFAULT_REGION.
  f.env["AWS_ENDPOINT_URL_S3"] = "https://minio.local";
  f.env["AWS_REGION"] = "us-west-2";
  const auto c2 = f.resolve();
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(c2->endpoint, "https://minio.local");
  EXPECT_EQ(c2->region, "us-west-2");
}

TEST(S3Config, ProfileFromFiles) {
  Fakes f;
  f.env = {{"HOME", "/home/u"}, {"AWS_PROFILE", "minio"}};
  f.files["/home/u/.aws/config"] =
      "[default]\nregion = us-west-2\n[profile minio]\nregion = eu-central-1\n"
      "s3 =\n  endpoint_url = http://10.0.0.1:9000\n  addressing_style = virtual\nmax_attempts = 4\n";
  f.files["/home/u/.aws/credentials"] =
      "[minio]\naws_access_key_id = minioadmin\naws_secret_access_key = miniosecret\n";
  const auto c = f.resolve();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->region, "eu-central-1");
  EXPECT_EQ(c->endpoint, "http://10.0.0.1:9000");
  EXPECT_FALSE(c->path_style);  // the profile asked for virtual
  EXPECT_EQ(c->creds.access_key_id, "minioadmin");
  EXPECT_EQ(c->creds.secret_access_key, "miniosecret");
  EXPECT_EQ(c->credentials_source, "profile minio");
  EXPECT_EQ(c->retry.max_attempts, 4);
  EXPECT_EQ(c->describe_redacted().find("miniosecret"), std::string::npos);
}

TEST(S3Config, Precedence) {
  Fakes f;
  f.env = {{"HOME", "/h"}, {"AWS_REGION", "env-region"}, {"AWS_ENDPOINT_URL", "http://env:1"},
           {"AWS_ACCESS_KEY_ID", "ENVKEY12"}, {"AWS_SECRET_ACCESS_KEY", "envsecret"}};
  f.files["/h/.aws/config"] = "[default]\nregion = file-region\nendpoint_url = http://file:2\n";
  f.files["/h/.aws/credentials"] = "[default]\naws_access_key_id = FILEKEY1\naws_secret_access_key = fs\n";
  // Environment over profile.
  auto c = f.resolve();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->region, "env-region");
  EXPECT_EQ(c->endpoint, "http://env:1");
  EXPECT_EQ(c->creds.access_key_id, "ENVKEY12");
  // Override over environment.
  S3ConfigOverrides o;
  o.region = "override-region";
  o.endpoint = "HTTPS://override.example:8443";
  o.creds = Credentials{"OVERKEY1", "oversecret", ""};
  o.path_style = false;
  o.max_connections = 4;
  o.part_size = 8u << 20;
  o.retry = RetryPolicy{2, 0.0, 0.0};
  o.connect_timeout_s = 1.5;
  o.request_timeout_s = 7;
  c = f.resolve(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->region, "override-region");
  EXPECT_EQ(c->endpoint, "https://override.example:8443");
  EXPECT_EQ(c->creds.access_key_id, "OVERKEY1");
  EXPECT_EQ(c->credentials_source, "override");
  EXPECT_FALSE(c->path_style);
  EXPECT_EQ(c->max_connections, 4u);
  EXPECT_EQ(c->part_size, 8u << 20);
  EXPECT_EQ(c->retry.max_attempts, 2);
  EXPECT_EQ(c->connect_timeout_s, 1.5);
  EXPECT_EQ(c->request_timeout_s, 7);
  // Profile when the environment says nothing.
  f.env = {{"HOME", "/h"}};
  c = f.resolve();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->region, "file-region");
  EXPECT_EQ(c->endpoint, "http://file:2");
  EXPECT_TRUE(c->path_style);
  EXPECT_EQ(c->creds.access_key_id, "FILEKEY1");
  // Credentials never mix sources: an env key id with a file secret is refused.
  f.env["AWS_ACCESS_KEY_ID"] = "ENVONLY1";
  c = f.resolve();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find("AWS_SECRET_ACCESS_KEY"), std::string::npos);
}

TEST(S3Config, ExplicitProfileBeatsEnvironmentKeys) {
  Fakes f;
  f.env = {{"HOME", "/h"}, {"AWS_ACCESS_KEY_ID", "ENVKEY12"}, {"AWS_SECRET_ACCESS_KEY", "envsecret"}};
  f.files["/h/.aws/credentials"] =
      "[default]\naws_access_key_id = DEFAULT1\naws_secret_access_key = d\n"
      "[work]\naws_access_key_id = WORKKEY1\naws_secret_access_key = w\n";
  S3ConfigOverrides o;
  o.profile = "work";  // like `--profile work`
  auto c = f.resolve(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->creds.access_key_id, "WORKKEY1");
  EXPECT_EQ(c->credentials_source, "profile work");
  // AWS_PROFILE selects the profile, but environment keys still come first.
  f.env["AWS_PROFILE"] = "work";
  c = f.resolve();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->creds.access_key_id, "ENVKEY12");
}

TEST(S3Config, RegionDrivesTheDefaultEndpoint) {
  Fakes f;
  f.env = {{"AWS_REGION", "ap-northeast-1"}};
  const auto c = f.resolve();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->endpoint, "https://s3.ap-northeast-1.amazonaws.com");
  EXPECT_FALSE(c->path_style);
  // The China regions are another partition, under amazonaws.com.cn (S3 and
  // STS alike; s3.cn-north-1.amazonaws.com does not exist).
  f.env["AWS_REGION"] = "cn-north-1";
  const auto cn = f.resolve();
  ASSERT_TRUE(cn.ok()) << cn.status().to_string();
  EXPECT_EQ(cn->endpoint, "https://s3.cn-north-1.amazonaws.com.cn");
  EXPECT_EQ(aws_dns_suffix("cn-northwest-1"), "amazonaws.com.cn");
  EXPECT_EQ(aws_dns_suffix("us-gov-west-1"), "amazonaws.com");
  EXPECT_EQ(aws_dns_suffix("eu-central-1"), "amazonaws.com");
  f.env["AWS_REGION"] = "us-east-1/../evil";
  EXPECT_FALSE(f.resolve().ok());
}

// Addressing "auto" on AWS's default endpoint is virtual-hosted only for a
// bucket name that is a valid TLS host label: a dotted name
// (my.bucket.s3.us-east-1.amazonaws.com is not covered by the wildcard
// certificate), an uppercase one or one with '_' goes path style, as in
// botocore. An explicit "virtual" stays virtual.
TEST(S3Config, BucketsThatAreNotDnsNamesArePathStyleUnderAuto) {
  for (const std::string& b : {std::string("ckpt"), std::string("my-bucket-1"), std::string("a1b"),
                               std::string(63, 'x')})
    EXPECT_TRUE(dns_compatible_bucket(b)) << b;
  for (const char* b : {"my.bucket", "My-Bucket", "my_bucket", "ab", "-ab", "ab-", "a.b.c", ""})
    EXPECT_FALSE(dns_compatible_bucket(b)) << b;
  EXPECT_FALSE(dns_compatible_bucket(std::string(64, 'x')));

  Fakes f;
  S3ConfigOverrides o;
  o.bucket = "ckpt";
  auto c = f.resolve(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->endpoint, "https://s3.us-east-1.amazonaws.com");
  EXPECT_FALSE(c->path_style);
  for (const char* b : {"my.ckpt.bucket", "Ckpt", "ckpt_bucket"}) {
    o.bucket = b;
    c = f.resolve(o);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_TRUE(c->path_style) << b;
    EXPECT_NE(c->describe_redacted().find("addressing=path"), std::string::npos) << b;
  }
  // The profile's auto is the same; its virtual, or the override, wins.
  f.env = {{"HOME", "/h"}};
  f.files["/h/.aws/config"] = "[default]\ns3 =\n  addressing_style = auto\n";
  o.bucket = "my.ckpt.bucket";
  c = f.resolve(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->path_style);
  f.files["/h/.aws/config"] = "[default]\ns3 =\n  addressing_style = virtual\n";
  c = f.resolve(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->path_style);
  f.files.clear();
  o.path_style = false;
  c = f.resolve(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->path_style);
}

TEST(S3Config, FileLocationsFromEnvironment) {
  Fakes f;
  f.env = {{"HOME", "/home/u"}, {"AWS_CONFIG_FILE", "~/cfg"}, {"AWS_SHARED_CREDENTIALS_FILE", "/etc/creds"}};
  f.files["/home/u/cfg"] = "[default]\nregion = from-custom-config\n";
  f.files["/etc/creds"] = "[default]\naws_access_key_id = CUSTOMKEY\naws_secret_access_key = s\n";
  f.files["/home/u/.aws/config"] = "[default]\nregion = ignored\n";
  const auto c = f.resolve();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->region, "from-custom-config");
  EXPECT_EQ(c->creds.access_key_id, "CUSTOMKEY");
}

TEST(S3Config, Anonymous) {
  Fakes f;
  f.env = {{"AWS_ACCESS_KEY_ID", "K1234567"}, {"AWS_SECRET_ACCESS_KEY", "S"}, {"AWS_NO_SIGN_REQUEST", "TRUE"}};
  auto c = f.resolve();
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->anonymous);
  EXPECT_TRUE(c->creds.secret_access_key.empty());  // dropped, never sent or printed
  EXPECT_TRUE(c->credentials_source.empty());
  S3ConfigOverrides o;
  o.anonymous = false;
  c = f.resolve(o);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->anonymous);
  EXPECT_EQ(c->creds.access_key_id, "K1234567");
  // Signing demanded, nothing to sign with.
  Fakes empty;
  const auto e = empty.resolve(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), Code::kInvalidArgument);
  o.anonymous = true;
  o.creds = Credentials{"K", "S", ""};
  c = empty.resolve(o);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->anonymous);
}

TEST(S3Config, ProfilesThatDoNotExist) {
  Fakes f;
  f.env = {{"HOME", "/h"}, {"AWS_PROFILE", "nope"}};
  f.files["/h/.aws/config"] = "[default]\nregion = x\n[nope]\nregion = bare-section-is-not-a-profile\n";
  auto c = f.resolve();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find("'nope'"), std::string::npos);
  S3ConfigOverrides o;
  o.profile = "also-missing";
  EXPECT_FALSE(f.resolve(o).ok());
  // The implicit default profile may be absent.
  Fakes g;
  g.env = {{"HOME", "/h"}};
  EXPECT_TRUE(g.resolve().ok());
}

TEST(S3Config, MalformedFilesNameTheFileNotTheSecret) {
  Fakes f;
  f.env = {{"HOME", "/h"}};
  f.files["/h/.aws/credentials"] = "[default]\naws_secret_access_key = topsecret\nstray topsecret line\n";
  const auto c = f.resolve();
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/h/.aws/credentials"), std::string::npos);
  EXPECT_NE(c.status().message().find("line 3"), std::string::npos);
  EXPECT_EQ(c.status().message().find("topsecret"), std::string::npos);
  // A partial pair in the profile names the profile, not the value.
  f.files["/h/.aws/credentials"] = "[default]\naws_secret_access_key = topsecret\n";
  const auto p = f.resolve();
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message().find("topsecret"), std::string::npos);
  EXPECT_NE(p.status().message().find("profile default"), std::string::npos);
}

// Found by fuzz/aws_config_fuzz.cc (fuzz/corpus/aws_config/crash-*): file
// paths come from the environment (AWS_CONFIG_FILE, HOME) and went into
// messages raw, so a CR or LF in them could forge log lines.
TEST(S3Config, PathsAndProfilesInMessagesArePrintable) {
  Fakes f;
  f.env = {{"AWS_CONFIG_FILE", "/tmp/a\rb"}};
  f.files["/tmp/a\rb"] = "not ini\n";
  auto c = f.resolve();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().find_first_of("\r\n"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("/tmp/a\\x0Db"), std::string::npos) << c.status().message();

  Fakes g;
  g.env = {{"HOME", "/h\n"}, {"AWS_PROFILE", "evil\nname"}};
  c = g.resolve();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().find_first_of("\r\n"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("not found in /h\\x0A/.aws/credentials"), std::string::npos)
      << c.status().message();
}

TEST(S3Config, IgnoreConfiguredEndpoints) {
  Fakes f;
  f.env = {{"AWS_ENDPOINT_URL_S3", "http://local:9000"}, {"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true"},
           {"AWS_REGION", "eu-west-3"}};
  const auto c = f.resolve();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->endpoint, "https://s3.eu-west-3.amazonaws.com");
  S3ConfigOverrides o;
  o.endpoint = "http://still-wins:1";
  EXPECT_EQ(f.resolve(o)->endpoint, "http://still-wins:1");
}

TEST(S3Config, EndpointValidation) {
  for (const char* good : {"http://localhost:9000", "https://s3.example.com", "http://127.0.0.1:1",
                           "http://[::1]:9000", "https://[fd00::2]", "http://minio_1:65535/"}) {
    S3ConfigOverrides o;
    o.endpoint = good;
    EXPECT_TRUE(Fakes().resolve(o).ok()) << good;
  }
  for (const char* bad : {"localhost:9000", "ftp://x", "http://", "http://:9000", "http://host:",
                          "http://host:0", "http://host:65536", "http://host:12ab", "http://host/path",
                          "http://host?x=1", "http://host#f", "http://ho st", "http://[::1",
                          "http://[::1]x", "http://ho\nst", "http://h\x01"}) {
    S3ConfigOverrides o;
    o.endpoint = bad;
    const auto r = Fakes().resolve(o);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  }
  for (const auto& [in, out] : std::vector<std::pair<std::string, std::string>>{
           {"https://s3.example.com:443/", "https://s3.example.com"},
           {"http://h:80", "http://h"},
           {"http://h:443", "http://h:443"},
           {"https://[::1]:443", "https://[::1]"},
           {"HTTP://Mixed.Case:9000", "http://Mixed.Case:9000"}}) {
    S3ConfigOverrides o;
    o.endpoint = in;
    const auto r = Fakes().resolve(o);
    ASSERT_TRUE(r.ok()) << in;
    EXPECT_EQ(r->endpoint, out);
  }
  S3ConfigOverrides o;
  o.endpoint = "http://user:hunter2@host:9000";
  const auto r = Fakes().resolve(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().find("hunter2"), std::string::npos);
}

// A part size that is not a multiple of 4096 would make every staging chunk
// lcm(part, 4096) bytes: 1.5 GiB for --s3-part-size 100MB. Refused, naming
// the multiples of 4096 on either side.
TEST(S3Config, PartSizeMustBeAMultipleOf4096) {
  S3ConfigOverrides o;
  o.part_size = 100'000'000;  // 100MB
  const auto r = Fakes().resolve(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  for (const char* want : {"100000000", "multiple of 4096", "99999744", "100003840"})
    EXPECT_NE(r.status().message().find(want), std::string::npos) << want << " not in " << r.status().to_string();
  for (uint64_t ok : {uint64_t{100} << 20, uint64_t{99'999'744}, uint64_t{100'003'840}, (uint64_t{5} << 20) + 4096}) {
    o.part_size = ok;
    const auto c = Fakes().resolve(o);
    ASSERT_TRUE(c.ok()) << ok << ": " << c.status().to_string();
    EXPECT_EQ(c->part_size, ok);
  }
  // Near the limits the neighbours stay within them.
  o.part_size = (5ull << 20) + 1;
  const auto low = Fakes().resolve(o);
  ASSERT_FALSE(low.ok());
  EXPECT_NE(low.status().message().find(std::to_string(5ull << 20) + " and " + std::to_string((5ull << 20) + 4096)),
            std::string::npos) << low.status().to_string();
  // make_s3_storage, for a config made by hand, refuses it too.
  EXPECT_EQ(check_part_size(100'000'000).code(), Code::kInvalidArgument);
  EXPECT_TRUE(check_part_size(16u << 20).ok());
}

TEST(S3Config, LimitsValidation) {
  auto fails = [](auto set) {
    S3ConfigOverrides o;
    set(o);
    const auto r = Fakes().resolve(o);
    return !r.ok() && r.status().code() == Code::kInvalidArgument;
  };
  EXPECT_TRUE(fails([](S3ConfigOverrides& o) { o.max_connections = 0; }));
  EXPECT_TRUE(fails([](S3ConfigOverrides& o) { o.part_size = (5u << 20) - 1; }));
  EXPECT_TRUE(fails([](S3ConfigOverrides& o) { o.part_size = (5ull << 30) + 1; }));
  EXPECT_FALSE(fails([](S3ConfigOverrides& o) { o.part_size = 5u << 20; }));
  EXPECT_FALSE(fails([](S3ConfigOverrides& o) { o.part_size = 5ull << 30; }));
  EXPECT_TRUE(fails([](S3ConfigOverrides& o) { o.part_size = (8u << 20) + 1; }));
  EXPECT_TRUE(fails([](S3ConfigOverrides& o) { o.retry = RetryPolicy{0, 0.1, 20}; }));
  EXPECT_TRUE(fails([](S3ConfigOverrides& o) { o.retry = RetryPolicy{3, -0.1, 20}; }));
  EXPECT_TRUE(fails([](S3ConfigOverrides& o) { o.retry = RetryPolicy{3, 0.1, std::numeric_limits<double>::infinity()}; }));
  EXPECT_TRUE(fails([](S3ConfigOverrides& o) { o.connect_timeout_s = 0; }));
  EXPECT_TRUE(fails([](S3ConfigOverrides& o) { o.request_timeout_s = -1; }));
  EXPECT_TRUE(fails([](S3ConfigOverrides& o) { o.creds = Credentials{"K", "", ""}; }));
  EXPECT_TRUE(fails([](S3ConfigOverrides& o) { o.region = ""; }));
  Fakes f;
  f.env = {{"AWS_MAX_ATTEMPTS", "zero"}};
  EXPECT_FALSE(f.resolve().ok());
  f.env = {{"AWS_MAX_ATTEMPTS", "0"}};
  EXPECT_FALSE(f.resolve().ok());
  f.env = {{"AWS_MAX_ATTEMPTS", "5"}};
  EXPECT_EQ(f.resolve()->retry.max_attempts, 5);
}

TEST(S3Config, PayloadSigning) {
  S3ConfigOverrides o;
  o.endpoint = "http://127.0.0.1:9000";
  EXPECT_TRUE(Fakes().resolve(o)->sign_payloads);  // plain http: the hash is the integrity check
  o.endpoint = "https://minio.example";
  EXPECT_FALSE(Fakes().resolve(o)->sign_payloads);  // TLS protects the bytes
  EXPECT_FALSE(Fakes().resolve()->sign_payloads);  // AWS default endpoint is https
  o.sign_payloads = true;
  EXPECT_TRUE(Fakes().resolve(o)->sign_payloads);
  Fakes f;
  f.env = {{"HOME", "/h"}};
  f.files["/h/.aws/config"] = "[default]\ns3 =\n  payload_signing_enabled = true\n";
  EXPECT_TRUE(f.resolve()->sign_payloads);
  f.files["/h/.aws/config"] = "[default]\ns3 =\n  payload_signing_enabled = maybe\n";
  EXPECT_FALSE(f.resolve().ok());
}

TEST(S3Config, UploadChecksums) {
  EXPECT_TRUE(Fakes().resolve()->checksums);  // on, as in the AWS SDKs
  Fakes f;
  f.env = {{"HOME", "/h"}, {"AWS_REQUEST_CHECKSUM_CALCULATION", "WHEN_REQUIRED"}};
  EXPECT_FALSE(f.resolve()->checksums);
  f.env["AWS_REQUEST_CHECKSUM_CALCULATION"] = "when_supported";
  EXPECT_TRUE(f.resolve()->checksums);
  f.env["AWS_REQUEST_CHECKSUM_CALCULATION"] = "never";
  EXPECT_FALSE(f.resolve().ok());
  f.env.erase("AWS_REQUEST_CHECKSUM_CALCULATION");
  f.files["/h/.aws/config"] = "[default]\nrequest_checksum_calculation = when_required\n";
  EXPECT_FALSE(f.resolve()->checksums);
  S3ConfigOverrides o;
  o.checksums = true;  // the caller's setting wins
  EXPECT_TRUE(f.resolve(o)->checksums);
  EXPECT_NE(f.resolve()->describe_redacted().find("checksums=off"), std::string::npos);
}

TEST(S3Config, EmptyVariablesAreUnset) {
  Fakes f;
  f.env = {{"AWS_REGION", ""}, {"AWS_ACCESS_KEY_ID", ""}, {"AWS_ENDPOINT_URL", ""}, {"AWS_PROFILE", ""}};
  const auto c = f.resolve();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->region, "us-east-1");
  EXPECT_TRUE(c->anonymous);
}

TEST(S3Config, RealEnvironmentConvenience) {
  // Only checks that it runs and answers with a value or a clean error.
  const auto c = resolve_s3_config(S3ConfigOverrides{});
  if (c.ok()) {
    EXPECT_FALSE(c->endpoint.empty());
  } else {
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  }
}

}  // namespace
}  // namespace ckptio::s3
