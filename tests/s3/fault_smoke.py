#!/usr/bin/env python3
"""Smoke test of tests/s3/fault-proxy (stdlib only; ctest s3_*_faulty_smoke).

  fault_smoke.py --env STATE/server.env

STATE/server.env is a proxy's (fault-proxy start), in front of a running test
server. Checks, through the proxy: that it forwards transparently (put, get,
range, head, list, delete, chunked and 100-continue uploads, multipart) over
ONE kept-alive client connection although moto closes every connection; that
a request reaches the upstream byte for byte (Host included) and an unframed
upstream response comes back re-framed (with a private upstream and a second
proxy run by this script); then each fault kind through the control API:
503 SlowDown and 500 InternalError with S3 XML bodies, a 500 after the
upstream did the work, skip/count, truncation, resets (before and midway
through a body), a graceful close, a stall, a slow close, a 200 with an
<Error> for CompleteMultipartUpload, latency, a bandwidth cap, the range
modifier, a body damaged on the way and checked as S3 checks it, seeded
probabilities, faults per connection (per=connection within=N), bad rules (400), the stats; and transparency again after a
reset. Exit 1 on any failure, 77 (skip) when the server is not installed
(1 when CI=true).
"""
import argparse
import base64
import hashlib
import importlib.machinery
import importlib.util
import http.client
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, HERE)
import s3lib  # noqa: E402

# The proxy's own crc32c, checked against the standard check value below.
_loader = importlib.machinery.SourceFileLoader("fault_proxy", os.path.join(HERE, "fault-proxy"))
fault_proxy = importlib.util.module_from_spec(importlib.util.spec_from_loader("fault_proxy", _loader))
_loader.exec_module(fault_proxy)

PROXY = os.path.join(HERE, "fault-proxy")
CHECKS = []


def fail(msg):
    print(f"fault_smoke: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def xml_text(body, tag):
    root = ET.fromstring(body)
    for e in root.iter():
        if e.tag.split("}")[-1] == tag:
            return e.text or ""
    return None


class Proxy:
    """The proxy under test: its env, S3 requests through it, the control API."""

    def __init__(self, env):
        self.env = env
        u = urllib.parse.urlsplit(env["endpoint"])
        self.host, self.port, self.netloc = u.hostname, u.port, u.netloc
        c = urllib.parse.urlsplit(env["control"])
        self.control_path = c.path
        self.b = env["bucket"]

    # -- control API --
    def ctl(self, method, path, body=b"", expect=200):
        c = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            c.request(method, self.control_path + path, body=body or None,
                      headers={"Content-Type": "application/json"} if body else {})
            r = c.getresponse()
            data = r.read()
        finally:
            c.close()
        check(r.status == expect, f"control {method} {path}: HTTP {r.status} (expected {expect}): "
                                  f"{data[:300]!r}")
        return data

    def rules(self, rules, seed=None):
        body = {"rules": rules} if seed is None else {"rules": rules, "seed": seed}
        return json.loads(self.ctl("POST", "/rules", json.dumps(body).encode()))

    def reset(self, seed=None):
        return json.loads(self.ctl("POST", "/reset" + (f"?seed={seed}" if seed is not None else "")))

    def stats(self):
        return json.loads(self.ctl("GET", "/stats"))

    # -- S3 through the proxy --
    def req(self, method, key, conn=None, **kw):
        path = f"/{self.b}/{key}" if key is not None else f"/{self.b}"
        return s3lib.request(self.env, method, path, conn=conn, **kw)

    def raw_send(self, method, key, body=b"", headers=None, query=None, sock=None, timeout=10,
                 extra=()):
        """Sends a signed request on a raw socket; returns the socket."""
        path = f"/{self.b}/{key}"
        h = s3lib.sign_v4(method, self.netloc, path, query, headers or {},
                          hashlib.sha256(body).hexdigest(), self.env["access_key"],
                          self.env["secret_key"], self.env["region"])
        target = s3lib.uri_encode(path, True)
        if query:
            target += "?" + s3lib.canonical_query(query)
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.netloc}"]
        lines += [f"{k}: {v}" for k, v in h.items()] + list(extra)
        if method in ("PUT", "POST") and not any(x.lower().startswith("transfer-encoding")
                                                 for x in extra):
            lines.append(f"Content-Length: {len(body)}")
        s = sock or socket.create_connection((self.host, self.port), timeout=timeout)
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        return s


def read_response(sock, method="GET"):
    """Reads one response from a raw socket. Returns (status, headers, body);
    raises what http.client raises (IncompleteRead, ConnectionResetError...)."""
    r = http.client.HTTPResponse(sock, method=method)
    r.begin()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()


def recv_all(sock, limit=1 << 24):
    """Everything until EOF (or an exception: returned as the second value)."""
    data = b""
    try:
        while len(data) < limit:
            c = sock.recv(1 << 20)
            if not c:
                return data, None
            data += c
    except OSError as e:
        return data, e
    return data, None


def ok(name):
    CHECKS.append(name)
    print(f"fault_smoke: ok: {name}")


# ---- transparency ----------------------------------------------------------------

def transparency(p, prefix, data, label):
    key = prefix + "obj.bin"
    conn = http.client.HTTPConnection(p.host, p.port, timeout=30)
    try:
        r = p.req("PUT", key, conn=conn, body=data)
        check(r.status == 200, f"{label}: PutObject: HTTP {r.status} {r.body[:300]!r}")
        sock0 = conn.sock
        check(sock0 is not None, f"{label}: the proxy closed the connection after a PUT "
                                 "(keep-alive broken)")
        steps = [("GET", {}, 200, data), ("GET", {"Range": "bytes=10-19"}, 206, data[10:20]),
                 ("HEAD", {}, 200, b""), ("GET", {"Range": "bytes=-7"}, 206, data[-7:])]
        for method, hdrs, want, body in steps:
            r = p.req(method, key, conn=conn, headers=hdrs)
            check(r.status == want and r.body == body,
                  f"{label}: {method} {hdrs}: HTTP {r.status}, {len(r.body)} bytes (want {want}, "
                  f"{len(body)})")
            check((r.header("Connection") or "").lower() != "close",
                  f"{label}: the proxy passed on Connection: close")
            check(conn.sock is sock0, f"{label}: {method}: the client connection was not kept "
                                      "alive (http.client reconnected)")
        r = p.req("GET", None, conn=conn, query={"list-type": "2", "prefix": prefix})
        check(r.status == 200 and xml_text(r.body, "Key") == key,
              f"{label}: ListObjectsV2: HTTP {r.status} {r.body[:300]!r}")
        r = p.req("DELETE", key, conn=conn)
        check(r.status in (200, 204), f"{label}: DeleteObject: HTTP {r.status}")
        r = p.req("HEAD", key, conn=conn)
        check(r.status == 404, f"{label}: HEAD after delete: HTTP {r.status}")
        check(conn.sock is sock0, f"{label}: the client connection was not kept alive")
    finally:
        conn.close()
    ok(f"{label}: put/get/range/head/list/delete over one kept-alive connection")


def uploads(p, prefix):
    # chunked request body (no Content-Length), then 100-continue, on one socket
    key = prefix + "chunked.bin"
    data = os.urandom(300_000)
    body = b"".join(b"%x\r\n" % len(data[i:i + 65536]) + data[i:i + 65536] + b"\r\n"
                    for i in range(0, len(data), 65536)) + b"0\r\n\r\n"
    path = f"/{p.b}/{key}"
    h = s3lib.sign_v4("PUT", p.netloc, path, None, {}, s3lib.UNSIGNED_PAYLOAD, p.env["access_key"],
                      p.env["secret_key"], p.env["region"])
    head = [f"PUT {s3lib.uri_encode(path, True)} HTTP/1.1", f"Host: {p.netloc}",
            "Transfer-Encoding: chunked"] + [f"{k}: {v}" for k, v in h.items()]
    s = socket.create_connection((p.host, p.port), timeout=30)
    try:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        st, hd, _ = read_response(s, "PUT")
        check(st == 200, f"chunked PUT: HTTP {st}")
        key2 = prefix + "expect.bin"
        data2 = os.urandom(2 << 20)
        path2 = f"/{p.b}/{key2}"
        h = s3lib.sign_v4("PUT", p.netloc, path2, None, {}, s3lib.UNSIGNED_PAYLOAD,
                          p.env["access_key"], p.env["secret_key"], p.env["region"])
        head = [f"PUT {s3lib.uri_encode(path2, True)} HTTP/1.1", f"Host: {p.netloc}",
                f"Content-Length: {len(data2)}", "Expect: 100-continue"] + \
            [f"{k}: {v}" for k, v in h.items()]
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        first = s.recv(25)
        check(first == b"HTTP/1.1 100 Continue\r\n\r\n", f"Expect: 100-continue: got {first!r}")
        s.sendall(data2)
        st, hd, _ = read_response(s, "PUT")
        check(st == 200, f"100-continue PUT: HTTP {st}")
    finally:
        s.close()
    r = p.req("GET", key)
    check(r.status == 200 and r.body == data, f"GET after chunked PUT: HTTP {r.status}, "
                                             f"{len(r.body)} bytes, equal {r.body == data}")
    r = p.req("GET", key2)
    check(r.status == 200 and r.body == data2, "GET after 100-continue PUT: wrong data")
    ok("chunked and 100-continue uploads forwarded")


def byte_for_byte():
    """A private upstream that records what it receives and answers without
    framing (body until EOF, Connection: close), behind a second proxy."""
    got = []
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    up_port = lsock.getsockname()[1]

    def upstream():
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            with c:
                buf = b""
                while b"\r\n\r\n" not in buf:
                    buf += c.recv(65536)
                head = buf[:buf.index(b"\r\n\r\n") + 4]
                if b"\r\nx-early: 1\r\n" in head.lower():
                    # answer at once, read none of the body, hold the connection
                    c.sendall(b"HTTP/1.1 413 Too Large\r\nContent-Length: 5\r\n"
                              b"Connection: close\r\n\r\nearly")
                    time.sleep(4)
                    continue
                n = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        n = int(line.split(b":")[1])
                while len(buf) < len(head) + n:
                    buf += c.recv(65536)
                got.append(buf)
                c.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nX-Echo: yes\r\n\r\n"
                          + b"echo:" + buf[len(head):])

    t = threading.Thread(target=upstream, daemon=True)
    t.start()
    tmp = tempfile.mkdtemp(prefix="fault-smoke-")
    port_file = os.path.join(tmp, "port")
    logf = open(os.path.join(tmp, "proxy.log"), "wb")
    proc = subprocess.Popen([sys.executable, PROXY, "serve", "--upstream",
                             f"http://127.0.0.1:{up_port}", "--port-file", port_file, "--seed", "1",
                             "--max-seconds", "120"],
                            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)
    try:
        deadline = time.monotonic() + 15
        while not os.path.exists(port_file):
            check(proc.poll() is None and time.monotonic() < deadline,
                  "second proxy (fault-proxy serve) did not start")
            time.sleep(0.05)
        with open(port_file) as f:
            port = int(f.read())
        reqs = [
            b"PUT /b/k%20%C3%BC?x-id=PutObject&a=%2F HTTP/1.1\r\n"
            b"Host: example.test:1234\r\n"
            b"X-Odd-Case:   two  spaces \r\n"
            b"x-dup: 1\r\nX-Dup: 2\r\n"
            b"X-Bytes: \xe9\xff\r\n"
            b"Authorization: AWS4-HMAC-SHA256 Credential=x/20260101/us-east-1/s3/aws4_request, "
            b"SignedHeaders=host, Signature=00\r\n"
            b"Content-Length: 11\r\n\r\nhello world",
            b"GET /b/k HTTP/1.1\r\nHost: 127.0.0.1\r\nRange: bytes=0-1\r\n\r\n",
        ]
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        with s:
            for i, rq in enumerate(reqs):
                s.sendall(rq)
                st, hd, body = read_response(s, rq.split()[0].decode())
                body_sent = rq[rq.index(b"\r\n\r\n") + 4:]
                check(st == 200 and body == b"echo:" + body_sent,
                      f"unframed upstream response: HTTP {st}, body {body!r}")
                check(hd.get("transfer-encoding") == "chunked" and "connection" not in hd
                      and hd.get("x-echo") == "yes",
                      f"response to a kept-alive client should be re-framed chunked: {hd}")
                check(len(got) == i + 1 and got[i] == rq,
                      f"the upstream did not get the request byte for byte:\n sent {rq!r}\n "
                      f"got  {got[i] if len(got) > i else None!r}")
            # an upstream that answers before reading a 16 MiB body, and stops reading:
            # the proxy must pass the answer on (not block sending), and read the
            # client's body to its end so that the connection stays usable
            big = os.urandom(16 << 20)
            t0 = time.monotonic()
            s.sendall(b"PUT /b/big HTTP/1.1\r\nHost: h\r\nX-Early: 1\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(big) + big)
            st, hd, body = read_response(s, "PUT")
            dt = time.monotonic() - t0
            check(st == 413 and body == b"early" and dt < 3,
                  f"early upstream answer: HTTP {st} {body!r} after {dt:.2f} s")
            s.sendall(reqs[1])
            st, hd, body = read_response(s, "GET")
            check(st == 200, f"after an early answer the connection should still work: HTTP {st}")
    finally:
        proc.terminate()
        proc.wait(10)
        logf.close()
        lsock.close()
    ok("requests reach the upstream byte for byte (Host too); unframed responses re-framed; "
       "an early upstream answer is passed on")


# ---- faults ----------------------------------------------------------------------

def faults(p, prefix):
    key = prefix + "f.bin"
    data = os.urandom(200_000)
    r = p.req("PUT", key, body=data)
    check(r.status == 200, f"PUT for the fault checks: HTTP {r.status}")
    kp = "/" + p.b + "/" + key   # the raw path regex of this object
    kre = kp.replace(".", r"\.")

    # 503 SlowDown once (count=1), on a kept-alive connection, then a pass
    p.reset()
    p.rules([f"status=503 op=GetObject path={kre} count=1"])
    conn = http.client.HTTPConnection(p.host, p.port, timeout=30)
    r = p.req("GET", key, conn=conn)
    check(r.status == 503 and xml_text(r.body, "Code") == "SlowDown"
          and xml_text(r.body, "Message") and xml_text(r.body, "RequestId")
          and r.header("x-amz-request-id") and r.header("Content-Type") == "application/xml",
          f"503 rule: HTTP {r.status} {r.body[:300]!r}")
    s0 = conn.sock
    r = p.req("GET", key, conn=conn)
    check(r.status == 200 and r.body == data and conn.sock is s0,
          f"after count=1: HTTP {r.status}, same connection {conn.sock is s0}")
    conn.close()
    ok("status=503: S3 XML SlowDown, count=1, connection kept")

    # 500 after the upstream did the work (when=response): the object exists
    p.rules(["fault=status status=500 op=PutObject when=response"])
    k500 = prefix + "after500.bin"
    r = p.req("PUT", k500, body=b"stored anyway")
    check(r.status == 500 and xml_text(r.body, "Code") == "InternalError",
          f"500 when=response: HTTP {r.status} {r.body[:200]!r}")
    p.rules([])
    r = p.req("GET", k500)
    check(r.status == 200 and r.body == b"stored anyway",
          f"500 when=response: the upstream should have stored the object: HTTP {r.status}")
    r = p.req("PUT", prefix + "x", body=b"1")
    check(r.status == 200, "rules=[]: PUT should pass")
    ok("status=500 when=response: InternalError, the upstream did the work")

    # truncation of the 2nd GET (skip=1 count=1)
    p.reset()
    p.rules([{"fault": "truncate", "op": "GetObject", "path": kre, "skip": 1, "count": 1,
              "body_frac": 0.25}])
    r = p.req("GET", key)
    check(r.status == 200 and r.body == data, "truncate skip=1: the 1st GET should pass")
    s = p.raw_send("GET", key)
    with s:
        got, err = recv_all(s)
    head, _, body = got.partition(b"\r\n\r\n")
    check(head.startswith(b"HTTP/1.1 200") and f"Content-Length: {len(data)}".encode() in head
          and len(body) == len(data) // 4 and body == data[:len(body)] and err is None,
          f"truncate: head {head[:200]!r}, {len(body)} body bytes (want {len(data) // 4}), "
          f"ending {err!r}")
    r = p.req("GET", key)
    check(r.status == 200 and r.body == data, "truncate count=1: the 3rd GET should pass")
    st = p.stats()
    check(st["faults"]["truncate"] == 1 and st["rules"][0]["matched"] == 3
          and st["rules"][0]["injected"] == 1, f"stats after truncate: {st}")
    ok("truncate: the 2nd GET has full Content-Length and a quarter of the body, then FIN")

    # connection reset before any response byte, and midway through the body
    p.rules([f"fault=reset method=GET path={kre} count=1",
             f"fault=reset method=GET path={kre} body_bytes=1000 count=1"])
    s = p.raw_send("GET", key)
    with s:
        got, err = recv_all(s)
    check(got == b"" and isinstance(err, ConnectionResetError),
          f"reset: got {len(got)} bytes and {err!r}, want ECONNRESET and nothing")
    s = p.raw_send("GET", key)
    with s:
        got, err = recv_all(s)
    head, _, body = got.partition(b"\r\n\r\n")
    check(head.startswith(b"HTTP/1.1 200") and len(body) <= 1000
          and isinstance(err, ConnectionResetError),
          f"reset body_bytes=1000: head {head[:60]!r}, {len(body)} body bytes, {err!r}")
    ok("reset: RST before the response, and after 1000 body bytes")

    # graceful close (FIN, no response), then a stall past the client's timeout
    p.rules([f"fault=close method=GET path={kre} count=1",
             f"fault=stall delay=30 method=GET path={kre} count=1"])
    s = p.raw_send("GET", key)
    with s:
        got, err = recv_all(s)
    check(got == b"" and err is None, f"close: got {got[:100]!r}, {err!r}, want a plain EOF")
    s = p.raw_send("GET", key, timeout=0.5)
    t0 = time.monotonic()
    with s:
        got, err = recv_all(s)
        check(isinstance(err, socket.timeout) and got == b"",
              f"stall: got {got[:100]!r}, {err!r}, want a client timeout")
        p.reset()    # wakes the stall: the proxy closes the connection
        s.settimeout(5)
        got, err = recv_all(s)
        check(got == b"" and time.monotonic() - t0 < 10,
              f"stall after reset: {got[:100]!r} {err!r}")
    ok("close: EOF without a response; stall: silent past a timeout, ended by reset")

    # slow close: a complete response, then nothing more on that connection, then FIN
    p.rules([f"fault=slowclose delay=1 method=GET path={kre}"])
    s = p.raw_send("GET", key)
    with s:
        st, hd, body = read_response(s)
        check(st == 200 and body == data, f"slowclose: HTTP {st}, {len(body)} bytes")
        t0 = time.monotonic()
        p.raw_send("GET", key, sock=s)     # the reused connection: never answered
        got, err = recv_all(s)
        dt = time.monotonic() - t0
        check(got == b"" and err is None and 0.5 < dt < 5,
              f"slowclose: second request got {got[:80]!r} {err!r} after {dt:.2f} s")
    ok("slowclose: full response, then a reused connection gets EOF ~1 s later")

    # 200 with <Error> for CompleteMultipartUpload (the upload is not completed)
    p.reset()
    p.rules(["fault=error200 op=CompleteMultipartUpload code=InternalError count=1"])
    mkey = prefix + "mpu.bin"
    r = p.req("POST", mkey, query={"uploads": ""})
    check(r.status == 200, f"CreateMultipartUpload: HTTP {r.status} {r.body[:200]!r}")
    upload_id = xml_text(r.body, "UploadId")
    part = os.urandom(1000)
    r = p.req("PUT", mkey, query={"partNumber": "1", "uploadId": upload_id}, body=part)
    check(r.status == 200, f"UploadPart: HTTP {r.status}")
    etag = r.header("ETag")
    done = (f"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{etag}</ETag>"
            f"</Part></CompleteMultipartUpload>").encode()
    r = p.req("POST", mkey, query={"uploadId": upload_id}, body=done)
    check(r.status == 200 and ET.fromstring(r.body).tag == "Error"
          and xml_text(r.body, "Code") == "InternalError",
          f"error200: HTTP {r.status} {r.body[:300]!r}")
    r = p.req("POST", mkey, query={"uploadId": upload_id}, body=done)
    check(r.status == 200 and re.search(rb"<CompleteMultipartUpload(Result|Response)[ >]", r.body),
          f"Complete retried: HTTP {r.status} {r.body[:300]!r}")
    r = p.req("GET", mkey)
    check(r.status == 200 and r.body == part, "GET after the retried Complete: wrong data")
    ok("error200: CompleteMultipartUpload answers 200 with <Error>; a retry completes")

    # latency with jitter, and a bandwidth cap
    p.rules(["fault=latency delay=0.4 jitter=0.1 op=HeadObject",
             "fault=bandwidth rate=1MB dir=down op=GetObject"])
    t0 = time.monotonic()
    r = p.req("HEAD", key)
    dt = time.monotonic() - t0
    check(r.status == 200 and 0.28 <= dt < 3, f"latency 0.4±0.1 s: HTTP {r.status} in {dt:.3f} s")
    t0 = time.monotonic()
    r = p.req("GET", key)
    dt = time.monotonic() - t0
    check(r.status == 200 and r.body == data and dt >= 0.15,
          f"bandwidth 1 MB/s, 200 kB: HTTP {r.status} in {dt:.3f} s (want >= 0.15)")
    ok(f"latency 0.4±0.1 s on HEAD; bandwidth: {dt:.2f} s for 200 kB at 1 MB/s")

    # the Range header replaced, or dropped (a server that ignores Range)
    p.rules(["fault=range range=bytes=0-9 op=GetObject"])
    r = p.req("GET", key, headers={"Range": "bytes=100-109"})
    check(r.status == 206 and r.body == data[:10] and (r.header("Content-Range") or "").startswith("bytes 0-9/"),
          f"range replaced: HTTP {r.status} {r.header('Content-Range')} {r.body[:20]!r}")
    p.rules(["fault=range range= op=GetObject"])
    r = p.req("GET", key, headers={"Range": "bytes=100-109"})
    check(r.status == 200 and r.body == data, f"range dropped: HTTP {r.status}, {len(r.body)} bytes")
    ok("range: a ranged GET forwarded with another Range (206 of other bytes), or none (200)")

    # a body damaged on the way (corrupt), then checked as S3 checks it (checksum)
    kc = prefix + "checked.bin"
    body = os.urandom(3000)
    crc = base64.b64encode(struct.pack(">I", fault_proxy.crc32c(body))).decode()
    check(fault_proxy.crc32c(b"123456789") == 0xE3069283, "crc32c check value")
    p.rules(["fault=checksum op=PutObject", "fault=corrupt op=PutObject count=1 body_bytes=7"])
    hdr = {"x-amz-checksum-crc32c": crc}
    r = p.req("PUT", kc, body=body, headers=hdr, payload_hash=s3lib.UNSIGNED_PAYLOAD)
    check(r.status == 400 and xml_text(r.body, "Code") == "BadDigest",
          f"damaged body: HTTP {r.status} {r.body[:200]!r}")
    check(p.req("HEAD", kc).status == 404, "a refused body reached the server")
    r = p.req("PUT", kc, body=body, headers=hdr, payload_hash=s3lib.UNSIGNED_PAYLOAD)
    check(r.status == 200, f"intact body: HTTP {r.status} {r.body[:200]!r}")
    r = p.req("PUT", kc, body=body, headers={"x-amz-checksum-crc32c": "AAAAAA=="},
              payload_hash=s3lib.UNSIGNED_PAYLOAD)
    check(r.status == 400 and xml_text(r.body, "Code") == "BadDigest", f"wrong crc32c: HTTP {r.status}")
    r = p.req("PUT", kc, body=body, headers={"x-amz-checksum-crc32c": "zz"}, payload_hash=s3lib.UNSIGNED_PAYLOAD)
    check(r.status == 400 and xml_text(r.body, "Code") == "InvalidRequest", f"malformed crc32c: HTTP {r.status}")
    r = p.req("PUT", kc, body=body, headers={"Content-MD5": base64.b64encode(hashlib.md5(b"x").digest()).decode()})
    check(r.status == 400 and xml_text(r.body, "Code") == "BadDigest", f"wrong Content-MD5: HTTP {r.status}")
    r = p.req("PUT", kc, body=body, payload_hash=hashlib.sha256(b"x").hexdigest())
    check(r.status == 400 and xml_text(r.body, "Code") == "XAmzContentSHA256Mismatch",
          f"wrong signed payload hash: HTTP {r.status}")
    st = p.stats()
    check(st["checksums"].get("refused") == 5 and st["checksums"].get("crc32c") == 4,
          f"checksum counters: {st['checksums']}")
    r = p.req("GET", kc)
    check(r.status == 200 and r.body == body, f"stored body: HTTP {r.status}")
    p.rules([])
    ok("corrupt + checksum: a damaged body refused (BadDigest) and not forwarded; crc32c, "
       "Content-MD5 and signed payload hashes checked")

    # a seeded probability repeats itself
    patterns = []
    for _ in range(2):
        p.reset(seed=1234)
        p.rules([f"status=500 prob=0.5 op=HeadObject path={kre}"])
        conn = http.client.HTTPConnection(p.host, p.port, timeout=30)
        patterns.append("".join("x" if p.req("HEAD", key, conn=conn).status == 500 else "."
                                for _ in range(24)))
        conn.close()
    check(patterns[0] == patterns[1] and 0 < patterns[0].count("x") < 24,
          f"prob=0.5 with seed 1234: patterns {patterns}")
    st = p.stats()
    check(st["seed"] == 1234 and st["faults"]["status"] == patterns[0].count("x")
          and st["ops"].get("HeadObject") == 24 and st["statuses"].get("500", 0) > 0,
          f"stats: {st}")
    text = p.ctl("GET", "/stats?format=text").decode()
    check(f"faults.status {patterns[0].count('x')}" in text and "op.HeadObject 24" in text,
          f"stats?format=text: {text}")
    ok(f"prob=0.5 seed 1234 repeats: {patterns[0]}")

    # per=connection: the coin is tossed once per client connection, and a
    # chosen connection gets the fault at one of its first `within` matches
    p.reset(seed=99)
    p.rules([f"status=503 per=connection within=3 op=HeadObject path={kre}"])
    seen = []
    for _ in range(3):
        conn = http.client.HTTPConnection(p.host, p.port, timeout=30)
        seen.append("".join("x" if p.req("HEAD", key, conn=conn).status == 503 else "."
                            for _ in range(5)))
        conn.close()
    r0 = p.stats()["rules"][0]
    check(all(s.count("x") == 1 and "x" in s[:3] for s in seen)
          and r0["connections"] == 3 and r0["chosen"] == 3 and r0["injected"] == 3,
          f"per=connection within=3: {seen}, rule {r0}")
    p.reset(seed=99)
    p.rules([f"fault=reset per=connection prob=0.5 op=HeadObject path={kre}"])
    resets = 0
    for _ in range(24):
        conn = http.client.HTTPConnection(p.host, p.port, timeout=30)
        try:
            for _ in range(2):   # only a connection's first HEAD can be reset
                check(p.req("HEAD", key, conn=conn).status == 200, "per=connection: HEAD")
        except (ConnectionError, http.client.HTTPException):
            resets += 1
        conn.close()
    st = p.stats()
    r0 = st["rules"][0]
    check(st["connections"] == 24, f"stats: {st['connections']} connections, want 24 (control "
                                   "connections are not counted)")
    check(0 < resets < 24 and r0["connections"] == 24 and r0["chosen"] == resets
          and r0["injected"] == resets and r0["matched"] == 48 - resets,
          f"per=connection prob=0.5: {resets} of 24 connections reset, rule {r0}")
    text = p.ctl("GET", "/stats?format=text").decode()
    check(f"rule.0.chosen {resets}" in text and "rule.0.connections 24" in text,
          f"stats?format=text: {text}")
    ok(f"per=connection: one fault per chosen connection ({resets} of 24 reset at prob=0.5)")

    # bad rules are refused, text rules accepted, append works
    p.ctl("POST", "/rules", b'[{"fault": "explode"}]', expect=400)
    p.ctl("POST", "/rules", b"status=503 path=(", expect=400)
    p.ctl("POST", "/rules", b"status=503 bogus=1", expect=400)
    p.ctl("POST", "/rules", b"# comment\nstatus=503 op=UploadPart\n")
    p.ctl("POST", "/rules?append", b'["fault=latency delay=0.01"]')
    got = json.loads(p.ctl("GET", "/rules"))
    check([r["fault"] for r in got["rules"]] == ["status", "latency"], f"GET /rules: {got}")
    ok("control: bad rules get 400; text rules; append")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", required=True, help="the proxy's STATE/server.env")
    a = ap.parse_args()
    marker = os.path.join(os.path.dirname(os.path.abspath(a.env)), "unavailable")
    if not os.path.exists(a.env) and os.path.exists(marker):
        with open(marker) as f:
            why = f.read().strip()
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            fail(f"server not installed, and CI=true: {why}")
        print(f"fault_smoke: SKIPPED: {why}")
        sys.exit(77)
    try:
        env = s3lib.read_env(a.env)
    except (OSError, ValueError) as e:
        fail(f"cannot read {a.env}: {e} (did the s3_*_faulty_start fixture run?)")
    if not env.get("control"):
        fail(f"{a.env} has no control= line: not a fault-proxy server.env")
    p = Proxy(env)
    prefix = f"fault-smoke/{uuid.uuid4().hex}/"
    try:
        p.reset()
        transparency(p, prefix, os.urandom(300_000), "transparent")
        st = p.stats()
        check(st["faults_total"] == 0 and st["forwarded"] == st["requests"] == 8
              and st["upstream_errors"] == 0, f"stats after the transparent run: {st}")
        uploads(p, prefix)
        byte_for_byte()
        faults(p, prefix)
        p.reset()
        transparency(p, prefix + "again/", os.urandom(1 << 20), "after reset")
        st = p.stats()
        check(st["faults_total"] == 0 and st["rules"] == [], f"stats after reset: {st}")
    except (OSError, http.client.HTTPException) as e:
        fail(f"{env['endpoint']}: {type(e).__name__}: {e} (see {env.get('log', 'proxy.log')})")
    finally:
        try:
            p.reset()
            for key in ("f.bin", "after500.bin", "x", "mpu.bin", "chunked.bin", "expect.bin"):
                p.req("DELETE", prefix + key)
        except (OSError, http.client.HTTPException):
            pass
    print(f"fault_smoke: {env['endpoint']} -> {env.get('upstream')}: {len(CHECKS)} checks OK")


if __name__ == "__main__":
    main()
