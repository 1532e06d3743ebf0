#!/usr/bin/env python3
"""What an S3 test server really does, checked against what AWS S3 does.

  probe.py --env STATE/server.env --quick
      smoke test (put, get, list, delete one object; stdlib only). Exit 1 on
      any failure, including a server that is down. Used by ctest s3_*_smoke.
  probe.py --env A/server.env [--env B/server.env ...] [--markdown]
      the capability table (needs boto3), one column per server.
  probe.py --env A/server.env --bench [--bench-mib 64] [--bench-n 8]
      8 parallel curl PUTs, then GETs, of 64 MiB objects; prints MB/s.
  probe.py --env A/server.env --latency
      ms per 3 KB GET on one keep-alive connection and on new connections.
  probe.py --env A/server.env [--env B/server.env ...] --checksums
      which upload integrity headers the server checks: x-amz-checksum-crc32c
      on PutObject and UploadPart (the algorithm declared on
      CreateMultipartUpload, the parts' <ChecksumCRC32C> in Complete),
      Content-MD5 and a signed x-amz-content-sha256, each right and wrong
      (stdlib only; docs/s3.md, "Upload checksums").

Servers are started with tests/s3/s3-server. Everything here uses path-style
URLs (http://127.0.0.1:PORT/BUCKET/KEY), as the C++ backend does.
"""
import argparse
import base64
import hashlib
import http.client
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
import xml.etree.ElementTree as ET

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s3lib  # noqa: E402

MiB = 1 << 20


def xml_texts(body, tag):
    root = ET.fromstring(body)
    return [e.text or "" for e in root.iter() if e.tag.split("}")[-1] == tag]


def fail(msg):
    print(f"probe: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


# ---- smoke test (stdlib only) ------------------------------------------------

def quick(env_path):
    marker = os.path.join(os.path.dirname(os.path.abspath(env_path)), "unavailable")
    if not os.path.exists(env_path) and os.path.exists(marker):
        with open(marker) as f:
            why = f.read().strip()
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            fail(f"server not installed, and CI=true: {why}")
        print(f"probe: SKIPPED: server not installed: {why}")
        sys.exit(77)
    try:
        env = s3lib.read_env(env_path)
    except (OSError, ValueError) as e:
        fail(f"cannot read server env {env_path}: {e} (did the s3_*_start fixture run?)")
    b = env["bucket"]
    sigv4 = env.get("checks_sigv4") == "true"
    # moto-sigv4 rejects any percent-encoded query value, so no "/" in its prefix
    key = f"smoke-{uuid.uuid4().hex}.bin" if sigv4 else f"smoke/{uuid.uuid4().hex}/obj.bin"
    prefix = key[:-4] if sigv4 else key.rsplit("/", 1)[0] + "/"
    data = os.urandom(100_000)
    try:
        r = s3lib.request(env, "PUT", f"/{b}/{key}", body=data)
        if r.status != 200:
            fail(f"PutObject: HTTP {r.status} {r.body[:300]!r}")
        r = s3lib.request(env, "GET", f"/{b}/{key}")
        if r.status != 200 or r.body != data:
            fail(f"GetObject: HTTP {r.status}, {len(r.body)} bytes, equal={r.body == data}")
        r = s3lib.request(env, "GET", f"/{b}/{key}", headers={"Range": "bytes=10-19"})
        if r.status != 206 or r.body != data[10:20]:
            fail(f"ranged GetObject: HTTP {r.status}, body {r.body[:40]!r}")
        r = s3lib.request(env, "GET", f"/{b}", query={"list-type": "2", "prefix": prefix})
        if r.status != 200 or xml_texts(r.body, "Key") != [key]:
            fail(f"ListObjectsV2: HTTP {r.status} {r.body[:300]!r}")
        r = s3lib.request(env, "DELETE", f"/{b}/{key}")
        if r.status not in (200, 204):
            fail(f"DeleteObject: HTTP {r.status} {r.body[:300]!r}")
        r = s3lib.request(env, "HEAD", f"/{b}/{key}")
        if r.status != 404:
            fail(f"HeadObject after delete: HTTP {r.status}, expected 404")
        if sigv4:
            r = s3lib.request(env, "GET", f"/{b}/{key}", secret_key="wrong")
            if r.status != 403:
                fail(f"GetObject signed with a wrong secret: HTTP {r.status}, expected 403")
    except (OSError, http.client.HTTPException) as e:
        fail(f"{env['endpoint']}: {type(e).__name__}: {e} (is the server up? see {env.get('log', 'server.log')})")
    print(f"probe: {env.get('kind', '?')} at {env['endpoint']}: put/get/range/list/delete"
          f"{'/wrong-secret 403' if sigv4 else ''} OK")


# ---- the capability table ------------------------------------------------------

class Probe:
    def __init__(self, env):
        import boto3
        from botocore.config import Config
        self.env = env
        self.b = env["bucket"]
        self.prefix = f"probe-{uuid.uuid4().hex[:8]}/"
        kw = dict(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1})
        try:  # boto3 >= 1.36 would otherwise send aws-chunked bodies with CRC trailers
            cfg = Config(request_checksum_calculation="when_required",
                         response_checksum_validation="when_required", **kw)
        except TypeError:
            cfg = Config(**kw)
        self.s3 = boto3.client("s3", endpoint_url=env["endpoint"], region_name=env["region"],
                               aws_access_key_id=env["access_key"],
                               aws_secret_access_key=env["secret_key"], config=cfg)
        self.boto3 = boto3

    def raw(self, method, key, **kw):
        path = f"/{self.b}/{key}" if key is not None else f"/{self.b}"
        return s3lib.request(self.env, method, path, **kw)

    def k(self, name):
        return self.prefix + name

    def raw_socket(self, head_lines, body_parts, wait_100=None):
        """Sends a hand-made request; returns (got_100, status, response_text)."""
        u = urllib.parse.urlsplit(self.env["endpoint"])
        s = socket.create_connection((u.hostname, u.port), timeout=10)
        try:
            s.sendall(("\r\n".join(head_lines) + "\r\n\r\n").encode())
            got_100 = None
            if wait_100 is not None:
                s.settimeout(wait_100)
                try:
                    first = s.recv(65536)
                    got_100 = first.startswith(b"HTTP/1.1 100")
                    pending = b"" if got_100 else first
                except socket.timeout:
                    got_100, pending = False, b""
                s.settimeout(10)
                if pending:  # a final answer before the body: do not send it
                    return got_100, int(pending.split()[1]), pending.decode("latin-1")
            for p in body_parts:
                s.sendall(p)
            buf = b""
            while b"\r\n\r\n" not in buf:
                c = s.recv(65536)
                if not c:
                    break
                buf += c
            # skip interim 100s that arrive late
            while buf.startswith(b"HTTP/1.1 100"):
                buf = buf.split(b"\r\n\r\n", 1)[1]
                while b"\r\n\r\n" not in buf:
                    c = s.recv(65536)
                    if not c:
                        break
                    buf += c
            status = int(buf.split()[1]) if buf else 0
            return got_100, status, buf.decode("latin-1")
        finally:
            s.close()

    def signed_head(self, method, key, headers, payload_hash, unsigned=None):
        """Request head lines; `headers` are signed, `unsigned` are sent as is
        (as curl sends Expect, Transfer-Encoding and Content-Length)."""
        u = urllib.parse.urlsplit(self.env["endpoint"])
        path = f"/{self.b}/{key}"
        h = s3lib.sign_v4(method, u.netloc, path, None, headers, payload_hash,
                          self.env["access_key"], self.env["secret_key"], self.env["region"])
        h.update(unsigned or {})
        return [f"{method} {s3lib.uri_encode(path, True)} HTTP/1.1", f"Host: {u.netloc}"] + \
            [f"{k}: {v}" for k, v in h.items()]

    # Each check returns (verdict, note). verdict: "yes" (as on S3), "no", or "partial".

    def path_style(self):
        r = self.raw("PUT", self.k("ps"), body=b"x")
        g = self.raw("GET", self.k("ps"))
        ok = r.status == 200 and g.status == 200 and g.body == b"x"
        return ("yes" if ok else "no"), f"PUT {r.status}, GET {g.status}"

    def sigv4(self):
        good = self.raw("GET", None, query={"list-type": "2", "max-keys": "1"})
        bad_secret = self.raw("GET", None, query={"list-type": "2"}, secret_key="wrong" + self.env["secret_key"])
        bad_key = self.raw("GET", None, query={"list-type": "2"}, access_key="AKIAXXXXXXXXXXXXXXXX")
        unsigned = self.raw("GET", None, query={"list-type": "2"}, sign=False)
        bad_body = self.raw("PUT", self.k("sha"), body=b"abc", payload_hash=hashlib.sha256(b"xyz").hexdigest())
        ok = good.status == 200 and bad_secret.status == 403 and bad_key.status == 403
        note = (f"good {good.status}; wrong secret {bad_secret.status}; wrong key id {bad_key.status}; "
                f"no auth {unsigned.status}; body != x-amz-content-sha256 {bad_body.status} (S3: 400)")
        return ("yes" if ok and bad_body.status == 400 else "partial" if ok else "no"), note

    def special_keys(self):
        bad = []
        for ch in [" ", "+", "=", ":", "(", "!", "*", "'", ",", "@", "$", "&", ";", "%", "ü", "~"]:
            key = self.k(f"sp/a{ch}b")
            r = self.raw("PUT", key, body=b"1")
            g = self.raw("GET", key)
            if r.status != 200 or g.status != 200 or g.body != b"1":
                bad.append(repr(ch))
        return ("yes" if not bad else "partial"), ("all round-trip" if not bad else
                                                   "fail (HTTP 403/404): " + " ".join(bad))

    def put(self):
        data = os.urandom(1000)
        r = self.raw("PUT", self.k("put"), body=data)
        etag = r.header("ETag", "")
        ok = r.status == 200 and etag.strip('"') == hashlib.md5(data).hexdigest()
        z = self.raw("PUT", self.k("zero"), body=b"")
        zg = self.raw("GET", self.k("zero"))
        return ("yes" if ok and z.status == 200 and zg.status == 200 and zg.body == b"" else "no"), \
            f"{r.status}, ETag=md5 {ok}; 0-byte put/get {z.status}/{zg.status}"

    def range_get(self):
        data = os.urandom(1000)
        self.raw("PUT", self.k("rng"), body=data)
        notes, ok = [], True
        for rng, exp, exp_cr in [("bytes=10-19", data[10:20], "bytes 10-19/1000"),
                                 ("bytes=990-", data[990:], "bytes 990-999/1000"),
                                 ("bytes=-10", data[-10:], "bytes 990-999/1000"),
                                 ("bytes=995-2000", data[995:], "bytes 995-999/1000")]:
            r = self.raw("GET", self.k("rng"), headers={"Range": rng})
            good = r.status == 206 and r.body == exp and r.header("Content-Range") == exp_cr
            ok &= good
            notes.append(f"{rng}: {r.status}{'' if good else ' WRONG ' + repr(r.header('Content-Range')) + f' {len(r.body)}B'}")
        r = self.raw("GET", self.k("rng"), headers={"Range": "bytes=1000-"})
        notes.append(f"bytes=1000- (past end): {r.status} (S3: 416)")
        ok_basic = "bytes=10-19: 206" in notes[0]
        return ("yes" if ok and r.status == 416 else "partial" if ok_basic else "no"), "; ".join(notes)

    def if_match(self):
        data = os.urandom(100)
        etag = self.raw("PUT", self.k("im"), body=data).header("ETag")
        m = self.raw("GET", self.k("im"), headers={"If-Match": etag})
        mr = self.raw("GET", self.k("im"), headers={"If-Match": etag, "Range": "bytes=0-9"})
        n = self.raw("GET", self.k("im"), headers={"If-Match": '"0123456789abcdef0123456789abcdef"'})
        nr = self.raw("GET", self.k("im"), headers={"If-Match": '"0123456789abcdef0123456789abcdef"',
                                                   "Range": "bytes=0-9"})
        ok = m.status == 200 and mr.status == 206 and n.status == 412 and nr.status == 412
        return ("yes" if ok else "no"), f"match {m.status}, match+range {mr.status}, " \
                                        f"mismatch {n.status}, mismatch+range {nr.status}"

    def conditional_put(self):
        self.raw("PUT", self.k("cp"), body=b"a")
        r = self.raw("PUT", self.k("cp"), body=b"b", headers={"If-None-Match": "*"})
        g = self.raw("GET", self.k("cp"))
        ok = r.status == 412 and g.body == b"a"
        return ("yes" if ok else "no"), f"PUT If-None-Match:* on existing key: {r.status} " \
                                        f"(S3 since 2024: 412), object now {g.body!r}"

    def head(self):
        data = os.urandom(1234)
        etag = self.raw("PUT", self.k("hd"), body=data).header("ETag")
        h = self.raw("HEAD", self.k("hd"))
        m = self.raw("HEAD", self.k("missing"))
        gm = self.raw("GET", self.k("missing"))
        ok = (h.status == 200 and h.header("Content-Length") == "1234" and h.header("ETag") == etag
              and m.status == 404 and gm.status == 404 and b"NoSuchKey" in gm.body)
        return ("yes" if ok else "no"), f"HEAD {h.status} len {h.header('Content-Length')}; " \
                                        f"missing: HEAD {m.status}, GET {gm.status} NoSuchKey={b'NoSuchKey' in gm.body}"

    def _mpu(self, key, sizes, unsigned=False):
        up = self.s3.create_multipart_upload(Bucket=self.b, Key=key)["UploadId"]
        parts, blobs = [], []
        for i, n in enumerate(sizes, 1):
            blob = os.urandom(n)
            blobs.append(blob)
            if unsigned:
                r = self.raw("PUT", key, body=blob, payload_hash=s3lib.UNSIGNED_PAYLOAD,
                             query={"partNumber": str(i), "uploadId": up})
                if r.status != 200:
                    return up, None, f"UploadPart UNSIGNED-PAYLOAD: {r.status} {r.body[:200]!r}", blobs
                etag = r.header("ETag")
            else:
                etag = self.s3.upload_part(Bucket=self.b, Key=key, UploadId=up, PartNumber=i,
                                           Body=blob)["ETag"]
            parts.append({"PartNumber": i, "ETag": etag})
        try:
            res = self.s3.complete_multipart_upload(Bucket=self.b, Key=key, UploadId=up,
                                                    MultipartUpload={"Parts": parts})
            return up, res, None, blobs
        except self.boto3.exceptions.botocore.exceptions.ClientError as e:
            return up, None, f"{e.response['Error']['Code']} ({e.response['ResponseMetadata']['HTTPStatusCode']})", blobs

    def multipart(self):
        key = self.k("mpu")
        up, res, err, blobs = self._mpu(key, [5 * MiB, 5 * MiB, 1 * MiB])
        if err:
            return "no", f"complete failed: {err}"
        body = self.s3.get_object(Bucket=self.b, Key=key)["Body"].read()
        want = b"".join(blobs)
        md5s = b"".join(hashlib.md5(b).digest() for b in blobs)
        s3etag = f'"{hashlib.md5(md5s).hexdigest()}-3"'
        ok = body == want
        notes = [f"5+5+1 MiB: content {'OK' if ok else 'WRONG'}, ETag {'= S3 form md5(md5s)-N' if res['ETag'] == s3etag else res['ETag']}"]
        # a part below 5 MiB that is not the last
        _, res2, err2, _ = self._mpu(self.k("mpu-small"), [1 * MiB, 1 * MiB])
        notes.append(f"1+1 MiB parts: {'accepted' if res2 else 'rejected ' + err2} (S3: EntityTooSmall 400)")
        small_ok = bool(err2 and "EntityTooSmall" in err2)
        # abort
        up3 = self.s3.create_multipart_upload(Bucket=self.b, Key=self.k("mpu-abort"))["UploadId"]
        self.s3.upload_part(Bucket=self.b, Key=self.k("mpu-abort"), UploadId=up3, PartNumber=1, Body=b"x")
        a = self.raw("DELETE", self.k("mpu-abort"), query={"uploadId": up3})
        after = self.raw("PUT", self.k("mpu-abort"), body=b"y", query={"partNumber": "2", "uploadId": up3})
        obj = self.raw("HEAD", self.k("mpu-abort"))
        notes.append(f"abort {a.status}, UploadPart after abort {after.status} (S3: 404 NoSuchUpload), "
                     f"object after abort {obj.status}")
        # complete with a wrong part ETag
        up4 = self.s3.create_multipart_upload(Bucket=self.b, Key=self.k("mpu-bad"))["UploadId"]
        self.s3.upload_part(Bucket=self.b, Key=self.k("mpu-bad"), UploadId=up4, PartNumber=1, Body=b"x")
        try:
            self.s3.complete_multipart_upload(Bucket=self.b, Key=self.k("mpu-bad"), UploadId=up4, MultipartUpload={
                "Parts": [{"PartNumber": 1, "ETag": '"0123456789abcdef0123456789abcdef"'}]})
            bad = "accepted"
        except self.boto3.exceptions.botocore.exceptions.ClientError as e:
            bad = e.response["Error"]["Code"]
        notes.append(f"complete with wrong part ETag: {bad} (S3: InvalidPart)")
        abort_ok = a.status == 204 and after.status == 404 and obj.status == 404
        verdict = "yes" if ok and small_ok and abort_ok and bad == "InvalidPart" else "partial" if ok else "no"
        return verdict, "; ".join(notes)

    def unsigned_payload(self):
        _, res, err, blobs = self._mpu(self.k("mpu-unsigned"), [5 * MiB, 1000], unsigned=True)
        if err:
            return "no", err
        body = self.s3.get_object(Bucket=self.b, Key=self.k("mpu-unsigned"))["Body"].read()
        p = self.raw("PUT", self.k("put-unsigned"), body=b"abc", payload_hash=s3lib.UNSIGNED_PAYLOAD)
        ok = body == b"".join(blobs) and p.status == 200
        return ("yes" if ok else "no"), f"UploadPart ok, content {'OK' if body == b''.join(blobs) else 'WRONG'}; PutObject {p.status}"

    def list_v2(self):
        pre = self.k("ls/")
        keys = [pre + k for k in ["a/1", "a/2", "b/1", "c", "d", "e/f/g"]]
        for k in keys:
            self.raw("PUT", k, body=b"1")
        r = self.s3.list_objects_v2(Bucket=self.b, Prefix=pre, Delimiter="/")
        got_c = [c["Prefix"] for c in r.get("CommonPrefixes", [])]
        got_k = [c["Key"] for c in r.get("Contents", [])]
        want_c = [pre + "a/", pre + "b/", pre + "e/"]
        delim_ok = got_c == want_c and got_k == [pre + "c", pre + "d"]
        missing = [c[len(pre):] for c in want_c if c not in got_c]
        notes = [f"delimiter: {'OK' if delim_ok else 'CommonPrefixes lack ' + ' '.join(missing) + ' (holds only e/f/g)' if missing and got_k == [pre + 'c', pre + 'd'] else f'prefixes {got_c} keys {got_k}'}"]
        # pagination, no delimiter
        seen, tok, pages, truncs, kc_ok = [], None, 0, [], True
        while True:
            kw = dict(Bucket=self.b, Prefix=pre, MaxKeys=2)
            if tok:
                kw["ContinuationToken"] = tok
            r = self.s3.list_objects_v2(**kw)
            pages += 1
            page = [c["Key"] for c in r.get("Contents", [])]
            kc_ok &= r.get("KeyCount") == len(page)
            seen += page
            truncs.append(r["IsTruncated"])
            tok = r.get("NextContinuationToken")
            if not r["IsTruncated"] or pages > 10:
                break
        page_ok = seen == sorted(keys) and pages == 3 and kc_ok
        notes.append(f"max-keys=2 pages: {pages}, keys {'OK' if seen == sorted(keys) else seen}, KeyCount {'OK' if kc_ok else 'WRONG'}")
        # pagination with delimiter: common prefixes count against max-keys
        seen2, tok, pages2 = [], None, 0
        while True:
            kw = dict(Bucket=self.b, Prefix=pre, Delimiter="/", MaxKeys=2)
            if tok:
                kw["ContinuationToken"] = tok
            r = self.s3.list_objects_v2(**kw)
            pages2 += 1
            seen2 += [c["Prefix"] for c in r.get("CommonPrefixes", [])] + [c["Key"] for c in r.get("Contents", [])]
            tok = r.get("NextContinuationToken")
            if not r["IsTruncated"] or pages2 > 10:
                break
        want2 = [pre + "a/", pre + "b/", pre + "c", pre + "d", pre + "e/"]
        d_ok = sorted(seen2) == sorted(want2) and pages2 == 3
        notes.append(f"delimiter+max-keys=2: {pages2} pages, "
                     f"{'OK' if d_ok else ' '.join(x[len(pre):] for x in sorted(seen2))}")
        r = self.raw("GET", None, query={"list-type": "2", "prefix": pre, "start-after": pre + "c"})
        sa = xml_texts(r.body, "Key")
        notes.append(f"start-after: {'OK' if sa == [pre + 'd', pre + 'e/f/g'] else sa}")
        ok = delim_ok and page_ok and d_ok
        return ("yes" if ok else "partial" if delim_ok or page_ok else "no"), "; ".join(notes)

    def delete_objects(self):
        keys = [self.k(f"del/{i}") for i in range(3)]
        for k in keys:
            self.raw("PUT", k, body=b"1")
        body = ("<Delete><Quiet>false</Quiet>" + "".join(f"<Object><Key>{k}</Key></Object>" for k in keys + [self.k("del/none")])
                + "</Delete>").encode()
        md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
        r = self.raw("POST", None, query={"delete": ""}, body=body, headers={"Content-MD5": md5})
        deleted = xml_texts(r.body, "Key") if r.status == 200 else []
        left = [k for k in keys if self.raw("HEAD", k).status != 404]
        nomd5 = self.raw("POST", None, query={"delete": ""},
                         body=b"<Delete><Object><Key>" + self.k("del/x").encode() + b"</Key></Object></Delete>")
        ok = r.status == 200 and not left and set(keys) <= set(deleted)
        return ("yes" if ok else "no"), (f"{r.status}, {len(set(deleted))} reported deleted (incl. missing key: "
                                         f"{self.k('del/none') in deleted}), left {len(left)}; "
                                         f"without Content-MD5: {nomd5.status} (S3: 400 unless x-amz-checksum-*)")

    def list_uploads(self):
        key = self.k("lmu/obj")
        up = self.s3.create_multipart_upload(Bucket=self.b, Key=key)["UploadId"]
        r = self.raw("GET", None, query={"uploads": "", "prefix": self.k("lmu/")})
        ids = xml_texts(r.body, "UploadId") if r.status == 200 else []
        self.raw("DELETE", key, query={"uploadId": up})
        ok = r.status == 200 and up in ids
        return ("yes" if ok else "no"), f"{r.status}, upload listed: {up in ids}"

    def expect_100(self):
        data = os.urandom(64 * 1024)
        head = self.signed_head("PUT", self.k("e100"), {}, hashlib.sha256(data).hexdigest(),
                                {"Content-Length": str(len(data)), "Expect": "100-continue"})
        got_100, status, _ = self.raw_socket(head, [data], wait_100=2.0)
        g = self.raw("GET", self.k("e100"))
        ok = got_100 and status == 200 and g.body == data
        return ("yes" if ok else "partial" if status == 200 else "no"), \
            f"100 Continue {'sent' if got_100 else 'NOT sent within 2 s'}; final {status}; stored {'OK' if g.body == data else 'WRONG'}"

    def content_md5(self):
        data = b"hello world"
        good = base64.b64encode(hashlib.md5(data).digest()).decode()
        badv = base64.b64encode(hashlib.md5(b"other").digest()).decode()
        r1 = self.raw("PUT", self.k("md5ok"), body=data, headers={"Content-MD5": good})
        r2 = self.raw("PUT", self.k("md5bad"), body=data, headers={"Content-MD5": badv})
        stored = self.raw("HEAD", self.k("md5bad")).status
        ok = r1.status == 200 and r2.status == 400
        return ("yes" if ok else "no"), f"right {r1.status}; wrong {r2.status} (S3: 400 BadDigest), object stored on wrong: {stored == 200}"

    def chunked(self):
        data = os.urandom(300_000)
        chunks = [data[i:i + 65536] for i in range(0, len(data), 65536)]
        parts = [f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks] + [b"0\r\n\r\n"]
        head = self.signed_head("PUT", self.k("chunked"), {}, s3lib.UNSIGNED_PAYLOAD,
                                {"Transfer-Encoding": "chunked"})
        _, status, text = self.raw_socket(head, parts)
        g = self.raw("GET", self.k("chunked"))
        stored = g.status == 200 and g.body == data
        return ("no" if stored else "yes"), (f"PUT without Content-Length: {status}, "
                                             f"{'stored correctly' if stored else 'not stored'} "
                                             f"(S3: 411 MissingContentLength; 'yes' = refuses like S3)")

    def aws_chunked_trailer(self):
        import boto3
        from botocore.config import Config
        try:
            cfg = Config(s3={"addressing_style": "path"}, request_checksum_calculation="when_supported")
        except TypeError:
            return "n/a", "boto3 too old to send checksum trailers"
        c = boto3.client("s3", endpoint_url=self.env["endpoint"], region_name=self.env["region"],
                         aws_access_key_id=self.env["access_key"], aws_secret_access_key=self.env["secret_key"],
                         config=cfg)
        data = os.urandom(10_000)
        try:
            c.put_object(Bucket=self.b, Key=self.k("trailer"), Body=data)
        except Exception as e:  # noqa: BLE001
            return "no", f"boto3 default PutObject (aws-chunked + CRC32 trailer): {str(e)[:100]}"
        g = self.raw("GET", self.k("trailer"))
        ok = g.body == data
        return ("yes" if ok else "no"), f"stored {'OK' if ok else f'WRONG ({len(g.body)} bytes for {len(data)})'}"

    def keep_alive(self):
        u = urllib.parse.urlsplit(self.env["endpoint"])
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        socks, conn_hdr = [], None
        try:
            for i in range(3):
                r = s3lib.request(self.env, "PUT", f"/{self.b}/{self.k('ka')}", body=b"x" * 100, conn=conn)
                conn_hdr = r.header("Connection")
                socks.append(id(conn.sock) if conn.sock else None)
        finally:
            conn.close()
        reused = socks[0] is not None and len(set(socks)) == 1
        ka = r.header("Keep-Alive")
        return ("yes" if reused else "no"), (f"Connection: {conn_hdr}" + (f", Keep-Alive: {ka}" if ka else "")
                                             + f"; one connection for 3 requests: {reused}")

    CHECKS = [
        ("path-style addressing", "path_style"),
        ("SigV4 checked (wrong secret → 403)", "sigv4"),
        ("keys with special characters (signed)", "special_keys"),
        ("PutObject (ETag = MD5)", "put"),
        ("GetObject Range (206, Content-Range)", "range_get"),
        ("GetObject If-Match (200/206, mismatch 412)", "if_match"),
        ("PutObject If-None-Match: * (create-only)", "conditional_put"),
        ("HeadObject, missing key 404", "head"),
        ("multipart create/part/complete/abort", "multipart"),
        ("UploadPart/PutObject with UNSIGNED-PAYLOAD", "unsigned_payload"),
        ("ListObjectsV2 prefix/delimiter/max-keys/token", "list_v2"),
        ("DeleteObjects (batch)", "delete_objects"),
        ("ListMultipartUploads", "list_uploads"),
        ("Expect: 100-continue", "expect_100"),
        ("Content-MD5 verified", "content_md5"),
        ("PUT with chunked Transfer-Encoding refused", "chunked"),
        ("aws-chunked + checksum trailer (boto3 ≥1.36 default)", "aws_chunked_trailer"),
        ("HTTP keep-alive", "keep_alive"),
    ]

    def run(self):
        out = {}
        for title, fn in self.CHECKS:
            try:
                out[title] = getattr(self, fn)()
            except Exception as e:  # noqa: BLE001 - a crash is a finding, not the end
                out[title] = ("error", f"{type(e).__name__}: {str(e)[:200]}")
        return out


def capability_table(env_paths, markdown):
    cols = []
    for p in env_paths:
        env = s3lib.read_env(p)
        cols.append((env.get("kind", p), Probe(env).run()))
    titles = [t for t, _ in Probe.CHECKS]
    if markdown:
        print("| capability | " + " | ".join(k for k, _ in cols) + " |")
        print("|---|" + "---|" * len(cols))
        for t in titles:
            print(f"| {t} | " + " | ".join(f"**{r[t][0]}**: {r[t][1]}" for _, r in cols) + " |")
    else:
        for kind, res in cols:
            print(f"== {kind}")
            for t in titles:
                v, note = res[t]
                print(f"  {v:8} {t}\n           {note}")


# ---- throughput --------------------------------------------------------------

def bench(env_path, mib, n):
    env = s3lib.read_env(env_path)
    u = urllib.parse.urlsplit(env["endpoint"])
    tmp = tempfile.mkdtemp(prefix="s3bench-")
    src = os.path.join(tmp, "src.bin")
    with open(src, "wb") as f:
        f.write(os.urandom(mib * MiB))
    prefix = f"bench-{uuid.uuid4().hex[:8]}/"

    def curl_cmd(method, key, extra):
        path = f"/{env['bucket']}/{prefix}{key}"
        h = s3lib.sign_v4(method, u.netloc, path, None, {}, s3lib.UNSIGNED_PAYLOAD,
                          env["access_key"], env["secret_key"], env["region"])
        cmd = ["curl", "-sS", "-f", "-o", "/dev/null", "-X", method]
        for k, v in h.items():
            cmd += ["-H", f"{k}: {v}"]
        return cmd + extra + [env["endpoint"] + s3lib.uri_encode(path, True)]

    res = {}
    for method in ("PUT", "GET"):
        cmds = [curl_cmd(method, f"o{i}", ["-T", src, "-H", "Expect:"] if method == "PUT" else [])
                for i in range(n)]
        t0 = time.monotonic()
        procs = [subprocess.Popen(c) for c in cmds]
        rcs = [p.wait() for p in procs]
        dt = time.monotonic() - t0
        if any(rcs):
            fail(f"bench {method}: curl exit codes {rcs}")
        res[method] = n * mib * MiB / dt / 1e6
    for i in range(n):
        s3lib.request(env, "DELETE", f"/{env['bucket']}/{prefix}o{i}")
    os.unlink(src)
    os.rmdir(tmp)
    print(f"{env.get('kind', '?')}: {n} parallel curl x {mib} MiB: PUT {res['PUT']:.0f} MB/s, GET {res['GET']:.0f} MB/s")


def latency(env_path, n=20, size=3000):
    """Milliseconds per small ranged GET, on one keep-alive connection and on
    a new connection each: a server that delays small responses on reused
    connections (Nagle's algorithm against the client's delayed ACK) shows
    ~40 ms in the first figure only."""
    env = s3lib.read_env(env_path)
    key = f"/{env['bucket']}/probe-latency-{uuid.uuid4().hex}"
    r = s3lib.request(env, "PUT", key, body=b"x" * size)
    if r.status != 200:
        fail(f"PUT {key}: HTTP {r.status}")
    u = urllib.parse.urlparse(env["endpoint"])
    out = {}
    for mode in ("keep-alive", "new connection"):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30) if mode == "keep-alive" else None
        t = time.monotonic()
        for _ in range(n):
            r = s3lib.request(env, "GET", key, headers={"Range": f"bytes=0-{size - 1}"}, conn=conn)
            if r.status != 206:
                fail(f"GET {key}: HTTP {r.status}")
        out[mode] = (time.monotonic() - t) / n * 1000
    s3lib.request(env, "DELETE", key)
    print(f"{env.get('kind', '?')}: {n} GETs of {size} bytes: {out['keep-alive']:.1f} ms each on one keep-alive "
          f"connection, {out['new connection']:.1f} ms each on a new connection")


def checksums(env_path):
    """Sends each integrity header right and wrong; prints what the server
    answered and whether a wrong one was stored anyway."""
    import struct
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)

    def crc(data):
        c = 0xFFFFFFFF
        for b in data:
            c = table[(c ^ b) & 0xFF] ^ (c >> 8)
        return base64.b64encode(struct.pack(">I", c ^ 0xFFFFFFFF)).decode()

    def md5(data):
        return base64.b64encode(hashlib.md5(data).digest()).decode()

    env = s3lib.read_env(env_path)
    b = env["bucket"]
    pfx = f"/{b}/probe-checksums-{uuid.uuid4().hex[:8]}/"
    body, other = os.urandom(1000), os.urandom(1000)
    part1 = os.urandom(5 * MiB)
    unsigned = s3lib.UNSIGNED_PAYLOAD
    print(f"{env.get('kind', '?')} at {env['endpoint']}:")

    def show(what, r, key=None):
        code = xml_texts(r.body, "Code") if r.status >= 300 and r.body.startswith(b"<") else []
        stored = ""
        if key is not None and r.status == 200:
            stored = " (stored)"
        elif key is not None:
            stored = " (stored anyway)" if s3lib.request(env, "HEAD", pfx + key).status == 200 else " (not stored)"
        print(f"  {what:58s} {r.status} {code[0] if code else ''}{stored}")

    def put(what, key, headers, payload_hash=unsigned):
        show(what, s3lib.request(env, "PUT", pfx + key, headers=headers, body=body,
                                 payload_hash=payload_hash), key)

    put("PutObject, no header", "a", {})
    put("PutObject, x-amz-checksum-crc32c right", "b", {"x-amz-checksum-crc32c": crc(body)})
    put("PutObject, x-amz-checksum-crc32c wrong", "c", {"x-amz-checksum-crc32c": crc(other)})
    put("PutObject, x-amz-checksum-crc32c malformed", "d", {"x-amz-checksum-crc32c": "zz"})
    put("PutObject, Content-MD5 right", "e", {"Content-MD5": md5(body)})
    put("PutObject, Content-MD5 wrong", "f", {"Content-MD5": md5(other)})
    put("PutObject, signed x-amz-content-sha256 right", "g", {}, hashlib.sha256(body).hexdigest())
    put("PutObject, signed x-amz-content-sha256 wrong", "h", {}, hashlib.sha256(other).hexdigest())

    def upload(key, parts, complete_checksums):
        r = s3lib.request(env, "POST", pfx + key, query={"uploads": ""},
                          headers={"x-amz-checksum-algorithm": "CRC32C"})
        ids = xml_texts(r.body, "UploadId") if r.status == 200 else []
        if not ids:
            show("CreateMultipartUpload, x-amz-checksum-algorithm: CRC32C", r)
            return None, None
        uid, etags = ids[0], []
        uploads.append((key, uid))  # aborted at the end, completed or not
        for n, (data, hdrs, what) in enumerate(parts, 1):
            r = s3lib.request(env, "PUT", pfx + key, query={"partNumber": str(n), "uploadId": uid},
                              headers=hdrs, body=data, payload_hash=unsigned)
            if what:
                show(what, r)
            etags.append(r.header("ETag"))
        xml = "<CompleteMultipartUpload>" + "".join(
            f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag>"
            + (f"<ChecksumCRC32C>{c}</ChecksumCRC32C>" if c else "") + "</Part>"
            for n, (e, c) in enumerate(zip(etags, complete_checksums), 1)) + "</CompleteMultipartUpload>"
        r = s3lib.request(env, "POST", pfx + key, query={"uploadId": uid}, body=xml.encode())
        return uid, r

    uploads = []
    ok1 = (part1, {"x-amz-checksum-crc32c": crc(part1)}, "")
    uid, r = upload("m1", [ok1, (body, {"x-amz-checksum-crc32c": crc(other)},
                                 "UploadPart, x-amz-checksum-crc32c wrong")], [None, None])
    uid, r = upload("m2", [ok1, (body, {"Content-MD5": md5(other)}, "UploadPart, Content-MD5 wrong")],
                    [None, None])
    uid, r = upload("m3", [ok1, (body, {"x-amz-checksum-crc32c": crc(body)},
                                 "UploadPart, x-amz-checksum-crc32c right")], [crc(part1), crc(body)])
    if r is not None:
        show("CompleteMultipartUpload, right <ChecksumCRC32C> per part", r)
        got = s3lib.request(env, "GET", pfx + "m3")
        print(f"  {'  the object read back':58s} {'intact' if got.body == part1 + body else 'DIFFERENT'}")
    uid, r = upload("m4", [ok1, (body, {"x-amz-checksum-crc32c": crc(body)}, "")], [crc(other), crc(other)])
    if r is not None:
        show("CompleteMultipartUpload, wrong <ChecksumCRC32C> per part", r)
    uid, r = upload("m5", [ok1, (body, {"x-amz-checksum-crc32c": crc(body)}, "")], [None, None])
    if r is not None:
        show("CompleteMultipartUpload, no <ChecksumCRC32C>", r)
    for key in "abcdefgh":
        s3lib.request(env, "DELETE", pfx + key)
    for key, uid in uploads:
        s3lib.request(env, "DELETE", pfx + key, query={"uploadId": uid})
        s3lib.request(env, "DELETE", pfx + key)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", action="append", required=True, help="STATE_DIR/server.env (repeatable)")
    ap.add_argument("--quick", action="store_true", help="smoke test only (stdlib)")
    ap.add_argument("--markdown", action="store_true", help="capability table as markdown")
    ap.add_argument("--bench", action="store_true", help="curl throughput")
    ap.add_argument("--bench-mib", type=int, default=64)
    ap.add_argument("--bench-n", type=int, default=8)
    ap.add_argument("--latency", action="store_true",
                    help="ms per small GET, on one keep-alive connection and on new connections")
    ap.add_argument("--checksums", action="store_true",
                    help="which upload integrity headers the server checks (stdlib)")
    a = ap.parse_args()
    if a.quick:
        for p in a.env:
            quick(p)
    elif a.bench:
        for p in a.env:
            bench(p, a.bench_mib, a.bench_n)
    elif a.latency:
        for p in a.env:
            latency(p)
    elif a.checksums:
        for p in a.env:
            checksums(p)
    else:
        try:
            import boto3  # noqa: F401
        except ImportError:
            fail("the capability probe needs boto3 (Debian: apt-get install python3-boto3)")
        capability_table(a.env, a.markdown)


if __name__ == "__main__":
    main()
