"""Shared helpers for the S3 test servers: server.env parsing, a stdlib-only
AWS Signature V4 signer and a tiny raw HTTP client.

Stdlib only on purpose: tests/s3/s3-server and `probe.py --quick` must run on
any python3 >= 3.9, with or without boto3.
"""
import datetime
import hashlib
import hmac
import http.client
import urllib.parse

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"


def read_env(path):
    """Parses a server.env file (key=value lines) into a dict."""
    env = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            k, v = line.split("=", 1)
            env[k.strip()] = v.strip()
    for k in ("endpoint", "bucket", "access_key", "secret_key", "region"):
        if not env.get(k):
            raise ValueError(f"{path}: missing '{k}='")
    return env


def uri_encode(s, keep_slash):
    # RFC 3986 unreserved characters stay; everything else is %XX (uppercase).
    return urllib.parse.quote(s, safe="-_.~" + ("/" if keep_slash else ""))


def canonical_query(query):
    """query: list of (name, value) pairs, or a dict, unencoded."""
    items = query.items() if isinstance(query, dict) else (query or [])
    enc = sorted((uri_encode(k, False), uri_encode(v or "", False)) for k, v in items)
    return "&".join(f"{k}={v}" for k, v in enc)


def sign_v4(method, host, path, query, headers, payload_hash, access_key,
            secret_key, region, service="s3", now=None):
    """Returns headers (a new dict) with x-amz-date, x-amz-content-sha256 and
    Authorization added. `path` is the unencoded path ("/bucket/key"); S3
    encodes each segment once. `headers` must not contain Host (added here)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    date = amz_date[:8]
    out = dict(headers or {})
    out["x-amz-date"] = amz_date
    out["x-amz-content-sha256"] = payload_hash
    signed = {k.lower(): " ".join(str(v).split()) for k, v in out.items()}
    signed["host"] = host
    names = sorted(signed)
    canonical = "\n".join([
        method,
        uri_encode(path, True) if service == "s3" else uri_encode(uri_encode(path, True), True),
        canonical_query(query),
        "".join(f"{n}:{signed[n]}\n" for n in names),
        ";".join(names),
        payload_hash,
    ])
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret_key).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
                            f"SignedHeaders={';'.join(names)}, Signature={sig}")
    return out


class Response:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def header(self, name, default=None):
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return default

    def __repr__(self):
        return f"<{self.status} {self.body[:200]!r}>"


def request(env, method, path, query=None, headers=None, body=b"",
            payload_hash=None, sign=True, service="s3", conn=None, timeout=30,
            secret_key=None, access_key=None, target=None):
    """One signed request to env['endpoint'] (path-style). Returns Response.
    Pass `conn` (an http.client.HTTPConnection) to reuse a connection, and
    `target` to send a request target other than the canonical encoding."""
    u = urllib.parse.urlsplit(env["endpoint"])
    host = u.netloc
    own = conn is None
    if own:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    if payload_hash is None:
        payload_hash = hashlib.sha256(body).hexdigest()
    hdrs = dict(headers or {})
    if sign:
        hdrs = sign_v4(method, host, path, query, hdrs, payload_hash,
                       access_key or env["access_key"], secret_key or env["secret_key"],
                       env["region"], service)
    url = uri_encode(path, True)
    q = canonical_query(query)
    if q:
        url += "?" + q
    if target is not None:  # the request line as given (signature still over path/query)
        url = target
    try:
        conn.request(method, url, body=body if body or method in ("PUT", "POST") else None,
                     headers=hdrs)
        r = conn.getresponse()
        data = r.read()
        return Response(r.status, r.getheaders(), data)
    finally:
        if own:
            conn.close()
