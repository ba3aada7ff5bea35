"""backends/s3/iam-policy.json against the S3 requests ckptfs really sends.

moto accepts every request whatever IAM would say, so a policy that AWS refuses passed every
other test: HeadBucket is authorised by AWS as `s3:ListBucket` without an `s3:prefix` key, and
the policy's prefix condition then denies it (issue 11, item 10). Here every S3 request is
recorded by a reverse proxy on 127.0.0.1 that sits between botocore and the moto server, so what
is judged is the HTTP that left the client, not what the code meant to send. The library (commit,
load, a Worker under leases) and the real `ckptfs` executable (runs, show, verify, mirror,
restore, prune, config show --check) run in subprocesses through it; each recorded request is
then mapped to the authorizations AWS makes (`tests/iam_eval.py`) and evaluated against the
policy with BUCKET and PREFIX filled in as backends/s3/README.md says.

The negative cases pin the policy's least privilege: it must not pass by being widened to
`s3:*` on `*`.
"""

from __future__ import annotations

import fcntl
import http.client
import http.server
import json
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from iam_eval import (
    AuthzRequest,
    Decision,
    Policy,
    S3Call,
    Verdict,
    action_matches,
    authorizations,
    bucket_arn,
    condition_holds,
    instantiate,
    judge,
    object_arn,
    operation_from_http,
    resource_matches,
    string_like,
)

from backends.s3.embedded import FAKE_CREDENTIALS, EmbeddedS3

ROOT = Path(__file__).resolve().parent.parent
POLICY_FILE = ROOT / "backends" / "s3" / "iam-policy.json"
BUCKET = "ckptfs-test"
# one role, one copy of the policy per prefix it works on (attached policies simply add up):
# the primary store, the mirror, and a store restored from the mirror
PREFIXES = ("store", "mirror", "restored")
CKPTFS = str(Path(sys.executable).with_name("ckptfs"))
BIG_RESULT_BYTES = 9 * 1024 * 1024  # over s3fs's 8 MiB block: the artifact goes up in parts


def policy_for(*prefixes: str, bucket: str = BUCKET) -> Policy:
    template = json.loads(POLICY_FILE.read_text())
    policy = Policy.parse(instantiate(template, bucket, prefixes[0]))
    for p in prefixes[1:]:
        policy = policy + Policy.parse(instantiate(template, bucket, p))
    return policy


# ================================================================== the evaluator's own rules


def _policy(*statements: dict[str, Any]) -> Policy:
    return Policy.parse({"Version": "2012-10-17", "Statement": list(statements)})


LIST_UNDER_A = {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::b",
                "Condition": {"StringLike": {"s3:prefix": ["a/*"]}}}


def test_default_is_implicit_deny() -> None:
    assert _policy(LIST_UNDER_A).evaluate(AuthzRequest("s3:GetObject", "arn:aws:s3:::b/a/k")) \
        is Decision.IMPLICIT_DENY


def test_stringlike_on_an_absent_key_is_false() -> None:
    """The issue itself: HeadBucket has no s3:prefix, so a prefix-conditioned ListBucket denies it."""
    p = _policy(LIST_UNDER_A)
    assert p.evaluate(AuthzRequest("s3:ListBucket", "arn:aws:s3:::b")) is Decision.IMPLICIT_DENY
    assert p.evaluate(AuthzRequest("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": ["a/"]})).allowed
    assert not p.evaluate(AuthzRequest("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": ["b/"]})).allowed


def test_string_equals_on_an_absent_key_is_false_and_negated_operators_are_true() -> None:
    assert not condition_holds({"StringEquals": {"s3:prefix": ""}}, {})
    assert condition_holds({"StringNotEquals": {"s3:prefix": "x"}}, {})
    assert condition_holds({"StringNotLike": {"s3:prefix": "x*"}}, {})
    assert condition_holds({"StringNotEqualsIgnoreCase": {"s3:prefix": "x"}}, {})
    assert not condition_holds({"StringNotLike": {"s3:prefix": "x*"}}, {"s3:prefix": ["xy"]})
    assert condition_holds({"StringNotLike": {"s3:prefix": "x*"}}, {"s3:prefix": ["yx"]})
    assert condition_holds({"StringLikeIfExists": {"s3:prefix": "x*"}}, {})
    assert not condition_holds({"StringLikeIfExists": {"s3:prefix": "x*"}}, {"s3:prefix": ["y"]})


def test_null_and_bool() -> None:
    assert condition_holds({"Null": {"s3:prefix": "true"}}, {})
    assert not condition_holds({"Null": {"s3:prefix": "true"}}, {"s3:prefix": [""]})
    assert condition_holds({"Null": {"s3:prefix": "false"}}, {"s3:prefix": [""]})
    assert condition_holds({"Bool": {"aws:SecureTransport": True}}, {"aws:securetransport": ["true"]})
    assert not condition_holds({"Bool": {"aws:SecureTransport": "true"}}, {"aws:SecureTransport": ["false"]})
    assert not condition_holds({"Bool": {"aws:SecureTransport": "true"}}, {})  # absent: false


def test_set_qualifiers() -> None:
    tags = {"aws:TagKeys": ["team", "cost"]}
    assert condition_holds({"ForAllValues:StringEquals": {"aws:TagKeys": ["team", "cost", "x"]}}, tags)
    assert not condition_holds({"ForAllValues:StringEquals": {"aws:TagKeys": ["team"]}}, tags)
    assert condition_holds({"ForAllValues:StringEquals": {"aws:TagKeys": ["team"]}}, {})  # vacuous
    assert condition_holds({"ForAnyValue:StringLike": {"aws:TagKeys": ["co*"]}}, tags)
    assert not condition_holds({"ForAnyValue:StringLike": {"aws:TagKeys": ["co*"]}}, {})
    with pytest.raises(ValueError, match="multivalued"):
        condition_holds({"StringEquals": {"aws:TagKeys": "team"}}, tags)


def test_conditions_and_keys_and_values_combine_as_aws_says() -> None:
    block = {"StringLike": {"s3:prefix": ["a/*", "b/*"]}, "StringEquals": {"s3:delimiter": "/"}}
    assert condition_holds(block, {"s3:prefix": ["b/x"], "s3:delimiter": ["/"]})  # values: OR
    assert not condition_holds(block, {"s3:prefix": ["b/x"]})  # operators: AND
    assert condition_holds({"StringLike": {"S3:Prefix": "a/*"}}, {"s3:prefix": ["a/1"]})  # key names
    assert not condition_holds({"StringLike": {"s3:prefix": "A/*"}}, {"s3:prefix": ["a/1"]})  # values


def test_explicit_deny_beats_allow() -> None:
    p = _policy({"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
                {"Effect": "Deny", "Action": "s3:DeleteObject", "Resource": "arn:aws:s3:::b/keep/*"})
    assert p.evaluate(AuthzRequest("s3:DeleteObject", "arn:aws:s3:::b/keep/1")) is Decision.EXPLICIT_DENY
    assert p.evaluate(AuthzRequest("s3:DeleteObject", "arn:aws:s3:::b/other/1")).allowed


def test_not_action_and_not_resource() -> None:
    p = _policy({"Effect": "Allow", "NotAction": "s3:Delete*", "NotResource": "arn:aws:s3:::b/secret/*"})
    assert p.evaluate(AuthzRequest("s3:GetObject", "arn:aws:s3:::b/x")).allowed
    assert not p.evaluate(AuthzRequest("s3:DeleteObject", "arn:aws:s3:::b/x")).allowed
    assert not p.evaluate(AuthzRequest("s3:GetObject", "arn:aws:s3:::b/secret/x")).allowed


def test_wildcards() -> None:
    assert action_matches("s3:*", "s3:GetObject")
    assert action_matches("S3:getobject", "s3:GetObject")  # actions are case-insensitive
    assert action_matches("s3:Get*", "s3:GetBucketLocation")
    assert action_matches("s3:?etObject", "s3:GetObject")
    assert not action_matches("s3:Get*", "s3:PutObject")
    assert not action_matches("ec2:*", "s3:GetObject")
    assert resource_matches("*", "arn:aws:s3:::b")
    assert resource_matches("arn:aws:s3:::b/p/*", "arn:aws:s3:::b/p/runs/x/log/1.ckpt")
    assert not resource_matches("arn:aws:s3:::b/p/*", "arn:aws:s3:::b/p")  # the bucket-side ARN
    assert not resource_matches("arn:aws:s3:::b/p/*", "arn:aws:s3:::b/pq/x")
    assert not resource_matches("arn:aws:s3:::b/p/*", "arn:aws:s3:::B/p/x")  # ARNs: case-sensitive
    assert not resource_matches("arn:aws:s3:::b", "arn:aws:s3:::b/x")
    assert resource_matches("arn:aws:s3:::b?", "arn:aws:s3:::bc")
    assert not resource_matches("arn:aws:s3:::b?", "arn:aws:s3:::b")
    # a * inside a segment stays in it; a trailing * may run past the colons
    assert not resource_matches("arn:*s:s3:::b", "arn:aws:x:s3:::b")
    assert resource_matches("arn:aws:s3:*", "arn:aws:s3:::b/k")
    assert string_like("a/*", "a/") and string_like("a?c", "abc") and not string_like("a?c", "ac")


def test_unsupported_policy_language_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="not supported"):
        condition_holds({"NumericLessThan": {"s3:max-keys": "10"}}, {"s3:max-keys": ["5"]})
    with pytest.raises(ValueError, match="policy variables"):
        condition_holds({"StringLike": {"s3:prefix": "home/${aws:username}/*"}}, {})
    with pytest.raises(ValueError, match="Principal"):
        _policy({"Effect": "Allow", "Principal": "*", "Action": "s3:*", "Resource": "*"})
    with pytest.raises(ValueError, match="exactly one of Action"):
        _policy({"Effect": "Allow", "Resource": "*"})


def _http(method: str, target: str, status: int = 200, body: bytes = b"",
          headers: Mapping[str, str] | None = None) -> S3Call:
    return operation_from_http(method, target, headers or {}, body, status)


def test_http_requests_map_to_the_authorizations_aws_makes() -> None:
    head = authorizations(_http("HEAD", "/b"))
    assert head == [AuthzRequest("s3:ListBucket", "arn:aws:s3:::b")]  # no s3:prefix
    lst = authorizations(_http("GET", "/b?list-type=2&prefix=p%2Fruns%2F&delimiter=%2F&max-keys=1"))
    assert lst == [AuthzRequest("s3:ListBucket", "arn:aws:s3:::b",
                                {"s3:prefix": ["p/runs/"], "s3:delimiter": ["/"], "s3:max-keys": ["1"]})]
    assert [a.action for a in authorizations(_http("HEAD", "/b/p/k"))] == ["s3:GetObject"]
    missing = authorizations(_http("HEAD", "/b/p/k", status=404))
    assert missing[1] == AuthzRequest("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": ["p/k"]},
                                      why=missing[1].why)
    assert [a.action for a in authorizations(_http("PUT", "/b/p/k", headers={"If-None-Match": "*"}))] == \
        ["s3:PutObject"]
    assert [(a.action, a.resource) for a in authorizations(
        _http("PUT", "/b/p/dst", headers={"x-amz-copy-source": "/b/p/src"}))] == \
        [("s3:GetObject", "arn:aws:s3:::b/p/src"), ("s3:PutObject", "arn:aws:s3:::b/p/dst")]
    body = b"<Delete><Object><Key>p/1</Key></Object><Object><Key>q/2</Key></Object></Delete>"
    dels = authorizations(_http("POST", "/b?delete", body=body))
    assert [(a.action, a.resource) for a in dels] == [("s3:DeleteObject", "arn:aws:s3:::b/p/1"),
                                                      ("s3:DeleteObject", "arn:aws:s3:::b/q/2")]
    ops = [_http(m, t).operation for m, t in [
        ("POST", "/b/k?uploads"), ("PUT", "/b/k?partNumber=1&uploadId=u"), ("POST", "/b/k?uploadId=u"),
        ("DELETE", "/b/k?uploadId=u"), ("GET", "/b/k?uploadId=u"), ("GET", "/b?location"), ("GET", "/"),
        ("DELETE", "/b/k"), ("GET", "/b/k")]]
    assert ops == ["CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload",
                                  "AbortMultipartUpload", "ListParts", "GetBucketLocation", "ListBuckets",
                                  "DeleteObject", "GetObject"]
    parts, abort = (authorizations(_http(m, "/b/k?uploadId=u")) for m in ("GET", "DELETE"))
    assert [a.action for a in parts] == ["s3:ListMultipartUploadParts"]
    assert [a.action for a in abort] == ["s3:AbortMultipartUpload"]
    assert authorizations(_http("GET", "/")) == [AuthzRequest("s3:ListAllMyBuckets", "*")]
    with pytest.raises(ValueError, match="unrecognised"):
        _http("PUT", "/b/k?tagging")


# ============================================================== the policy file, request by request


def _allowed(policy: Policy, action: str, resource: str, prefix: str | None = None) -> bool:
    context = {} if prefix is None else {"s3:prefix": [prefix]}
    return policy.evaluate(AuthzRequest(action, resource, context)).allowed


def test_the_policy_grants_the_prefix_and_nothing_outside_it() -> None:
    """What the test of recorded traffic cannot show: the policy is not simply `s3:*` on `*`."""
    p = policy_for("store")
    b = bucket_arn(BUCKET)
    assert _allowed(p, "s3:ListBucket", b, prefix="store/")
    assert _allowed(p, "s3:ListBucket", b, prefix="store/runs/")
    assert _allowed(p, "s3:GetObject", object_arn(BUCKET, "store/runs/r/log/1.ckpt"))
    assert _allowed(p, "s3:PutObject", object_arn(BUCKET, "store/artifacts/sha256/aa/aa00"))
    assert _allowed(p, "s3:DeleteObject", object_arn(BUCKET, "store/runs/r/snap/1.ckpt"))
    assert _allowed(p, "s3:GetBucketLocation", b)
    denied = [
        ("s3:ListBucket", b, {}),  # bucket-wide listing (and HeadBucket)
        ("s3:ListBucket", b, {"s3:prefix": ""}),
        ("s3:ListBucket", b, {"s3:prefix": "other/"}),
        ("s3:ListBucket", b, {"s3:prefix": "store-other/"}),
        # the bare prefix: it would list keys of every sibling that merely starts with it
        ("s3:ListBucket", b, {"s3:prefix": "store"}),
        ("s3:ListBucket", bucket_arn("another-bucket"), {"s3:prefix": "store/"}),
        ("s3:GetObject", object_arn(BUCKET, "other/runs/r/log/1.ckpt"), {}),
        ("s3:GetObject", object_arn(BUCKET, "store-other/x"), {}),
        ("s3:GetObject", object_arn(BUCKET, "store"), {}),
        ("s3:GetObject", object_arn("another-bucket", "store/x"), {}),
        ("s3:PutObject", object_arn(BUCKET, "other/x"), {}),
        ("s3:DeleteObject", object_arn(BUCKET, "other/x"), {}),
        ("s3:ListAllMyBuckets", "*", {}),
        ("s3:PutBucketPolicy", b, {}),
        ("s3:PutObjectAcl", object_arn(BUCKET, "store/x"), {}),
        ("s3:DeleteObjectVersion", object_arn(BUCKET, "store/x"), {}),
        ("s3:PutLifecycleConfiguration", b, {}),
        ("s3:DeleteBucket", b, {}),
    ]
    for action, resource, ctx in denied:
        req = AuthzRequest(action, resource, {k: [v] for k, v in ctx.items()})
        assert not p.evaluate(req).allowed, f"policy allows {req.describe()}"


def test_requests_outside_the_prefix_are_denied_end_to_end() -> None:
    """The same, through the HTTP mapping: listing or reading another prefix is refused."""
    p = policy_for(*PREFIXES)
    outside = [
        _http("GET", f"/{BUCKET}?list-type=2&prefix=other%2F"),
        _http("GET", f"/{BUCKET}?list-type=2"),
        _http("GET", f"/{BUCKET}?list-type=2&prefix="),
        _http("HEAD", f"/{BUCKET}"),
        _http("GET", f"/{BUCKET}/other/runs/r/log/1.ckpt"),
        _http("HEAD", f"/{BUCKET}/other/x", status=404),
        _http("PUT", f"/{BUCKET}/other/x"),
        _http("PUT", f"/{BUCKET}/store/x", headers={"x-amz-copy-source": f"/{BUCKET}/other/x"}),
        _http("POST", f"/{BUCKET}?delete",
              body=b"<Delete><Object><Key>store/a</Key></Object><Object><Key>other/b</Key></Object></Delete>"),
        _http("GET", "/"),
    ]
    for verdict in judge(p, outside):
        assert not verdict.allowed, f"policy allows {verdict.call.describe()}"


# ================================================================ recording what goes over the wire


@dataclass(frozen=True)
class Recorded:
    """One relayed request, as the proxy saw it, and the command (`label`) that sent it."""

    label: str
    method: str
    target: str
    headers: Mapping[str, str]
    body: bytes
    status: int
    host: str

    def call(self) -> S3Call:
        return operation_from_http(self.method, self.target, self.headers, self.body, self.status)


_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
               "upgrade", "expect", "content-length"}
_KEPT_HEADERS = {"x-amz-copy-source", "x-amz-metadata-directive", "if-none-match", "if-match",
                 "x-amz-acl", "x-amz-server-side-encryption", "x-amz-storage-class", "range"}


class RecordingProxy:
    """A reverse proxy on 127.0.0.1 that forwards to moto and records each request it relays.

    It records the method, path and query string as sent, the headers that decide the operation or
    its permission, DeleteObjects' XML body (the keys it names), and moto's status (a 404 needs
    its own permission on AWS). `label` names the command running, set before each one starts.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.label = "setup"
        self.records: list[Recorded] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _relay(self) -> None:
                body = self._body()
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                try:
                    conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for k, v in self.headers.items():
                        if k.lower() not in _HOP_BY_HOP:
                            conn.putheader(k, v)
                    if body or self.command in ("PUT", "POST"):
                        conn.putheader("Content-Length", str(len(body)))
                    conn.endheaders(body or None)
                    resp = conn.getresponse()
                    data = resp.read()
                    status, reason, headers = resp.status, resp.reason, resp.getheaders()
                finally:
                    conn.close()
                kept = {k.lower(): v for k, v in self.headers.items() if k.lower() in _KEPT_HEADERS}
                keep_body = self.command == "POST" and "delete" in self.path.partition("?")[2]
                with proxy._lock:
                    proxy.records.append(Recorded(proxy.label, self.command, self.path, kept,
                                                  body if keep_body else b"", status,
                                                  self.headers.get("Host", "")))
                self.send_response_only(status, reason)
                length = None
                for k, v in headers:
                    if k.lower() == "content-length":
                        length = v
                    elif k.lower() not in _HOP_BY_HOP:
                        self.send_header(k, v)
                self.send_header("Content-Length",
                                 (length or "0") if self.command == "HEAD" else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="iam-proxy", daemon=True)

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# ======================================================================== driving ckptfs for real

COMMIT_SCRIPT = """
import json, sys
from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus
url, opts, big = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
# small thresholds: several snapshots and automatic retention (deletes) within a dozen commits
# fence_seconds=0: pruned journal records go at once (and each commit checks its base);
# superseded_grace=0: superseded snapshots too, so version 1 is gone for the load below
policy = CompactionPolicy(fanout=4, max_plan=3, min_snapshot_bytes=1, keep_last=2, fence_seconds=0,
                          superseded_grace=0)
store = CheckpointStore(url, opts, policy=policy)
run = AgentRun(goal="check the IAM policy")
for i in range(12):
    run.add_step(Step(id=f"s{i:02d}", title=f"step {i}"))
store.save_run(run)
for i in range(12):
    step = run.steps[f"s{i:02d}"]
    step.status = StepStatus.COMPLETED
    step.result = ("x" * 64 + str(i)) * (big // 64) if i == 3 else f"result {i}"
    store.commit(run, [step])
store.close()
print(json.dumps({"run": run.run_id}))
"""

LOAD_SCRIPT = """
import json, sys
from ckptfs import CheckpointStore, VersionNotFoundError
url, opts, run_id = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
store = CheckpointStore(url, opts)
run = store.load_run(run_id)
assert run is not None and all(s.status == "completed" for s in run.steps.values()), run
assert store.load_run(run_id, version=13) == run  # save_run is version 1, then 12 commits
try:
    store.load_run(run_id, version=1)  # retention (keep_last=2) removed it
    raise AssertionError("version 1 should be gone")
except VersionNotFoundError:
    pass
print(json.dumps({"resumable": len(store.find_resumable_runs())}))
store.close()
"""

WORKER_SCRIPT = """
import json, sys
from ckptfs import AgentRun, CheckpointStore, Step, Worker
url, opts = sys.argv[1], json.loads(sys.argv[2])
store = CheckpointStore(url, opts)
run = AgentRun(goal="shared by workers")
for i in range(3):
    run.add_step(Step(id=f"w{i}", title=f"work {i}"))
store.save_run(run)
worker = Worker(store, worker_id="iam-w1", lease_ttl=20, poll_interval=0.1)

def executor(step, prior):
    return worker.tools().run("paid", {"step": step.id}, lambda **_: "answer " + step.id)

report = worker.work(run.run_id, executor, idle_timeout=20)
store.close()
print(json.dumps({"run": run.run_id, "completed": report.completed, "status": report.run_status}))
"""


@dataclass
class Scenario:
    """Every command run, its exit code and output, and the requests each one sent."""

    proxy_endpoint: str
    results: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)
    records: list[Recorded] = field(default_factory=list)

    def calls(self, label: str) -> list[S3Call]:
        return [r.call() for r in self.records if r.label == label]


LABELS = ["library-commit", "library-load", "library-worker", "runs", "show", "verify", "mirror",
          "verify-mirror", "restore-s3", "restore-local", "prune", "config-show-check"]


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTFS_", "AWS_"))}
    env.update(FAKE_CREDENTIALS)
    env["AWS_DEFAULT_REGION"] = "us-east-1"
    # the subprocesses import the same ckptfs as this test, whatever the editable install says
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra or {})
    return env


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Scenario:
    """The recording of `_record_scenario`, made once per test session.

    Under pytest-xdist this module's tests are spread over the workers, and each worker would
    record the whole scenario again (about 15 s of subprocesses, the same requests): the first
    worker to get here records it and leaves it in the session's shared temporary directory, the
    others wait for it on a lock and read it back. The recording is the same data either way
    (what went over the wire); only who made it differs.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _record_scenario(request.getfixturevalue("s3_server"), tmp_path_factory)
    shared = tmp_path_factory.getbasetemp().parent  # one directory for every worker of this run
    done = shared / "iam-scenario.pickle"
    with open(shared / "iam-scenario.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if done.exists():
                loaded = pickle.loads(done.read_bytes())
                assert isinstance(loaded, Scenario)
                return loaded
            sc = _record_scenario(request.getfixturevalue("s3_server"), tmp_path_factory)
            tmp = done.with_suffix(".tmp")
            tmp.write_bytes(pickle.dumps(sc))
            tmp.replace(done)
            return sc
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _record_scenario(s3_server: EmbeddedS3, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    """Run the library and every command once over S3, through the recording proxy."""
    s3_server.reset()
    work = tmp_path_factory.mktemp("iam")
    with RecordingProxy(s3_server.port) as proxy:
        sc = Scenario(proxy.endpoint)
        opts = {"client_kwargs": {"endpoint_url": proxy.endpoint, "region_name": s3_server.region}}
        cli_opts = [f"client_kwargs.endpoint_url={proxy.endpoint}",
                    f"client_kwargs.region_name={s3_server.region}"]
        o = [a for v in cli_opts for a in ("-o", v)]
        mo = [a for v in cli_opts for a in ("--mirror-option", v)]
        frm = [a for v in cli_opts for a in ("--from-option", v)]  # restore names its two sides
        to = [a for v in cli_opts for a in ("--to-option", v)]
        url = {p: f"s3://{BUCKET}/{p}" for p in PREFIXES}

        def run(label: str, argv: list[str], env: Mapping[str, str] | None = None) -> str:
            proxy.label = label
            done = subprocess.run(argv, cwd=work, env=_env(env), capture_output=True, text=True,
                                  timeout=120)
            sc.results[label] = done
            return done.stdout

        def py(label: str, script: str, *args: str) -> dict[str, Any]:
            out = run(label, [sys.executable, "-c", script, *args])
            return dict(json.loads(out.splitlines()[-1])) if out.strip() else {}

        run_id = str(py("library-commit", COMMIT_SCRIPT, url["store"], json.dumps(opts),
                        str(BIG_RESULT_BYTES)).get("run", "missing"))
        py("library-load", LOAD_SCRIPT, url["store"], json.dumps(opts), run_id)
        py("library-worker", WORKER_SCRIPT, url["store"], json.dumps(opts))
        run("runs", [CKPTFS, "runs", url["store"], "--json", *o])
        run("show", [CKPTFS, "show", url["store"], run_id, "--json", *o])
        run("verify", [CKPTFS, "verify", url["store"], "--data", "--json", *o])
        run("mirror", [CKPTFS, "mirror", url["store"], url["mirror"], "--latest", "--json", "--no-progress",
                       *o, *mo])
        run("verify-mirror", [CKPTFS, "verify", url["mirror"], "--data", "--json", *o])
        run("restore-s3", [CKPTFS, "restore", url["mirror"], url["restored"], "--run", run_id, "--json",
                           "--no-progress", *frm, *to])
        run("restore-local", [CKPTFS, "restore", url["mirror"], str(work / "local"), "--json",
                              "--no-progress", *frm])
        run("prune", [CKPTFS, "prune", url["store"], "--keep-last", "1", "--superseded-grace", "0",
                      "--json", *o])
        both = json.dumps(opts)
        run("config-show-check", [CKPTFS, "config", "show", "--check", "--json"],
            env={"CKPTFS_URL": url["store"], "CKPTFS_STORAGE_OPTIONS": both,
                 "CKPTFS_MIRROR_URL": url["mirror"], "CKPTFS_MIRROR_STORAGE_OPTIONS": both})
        proxy.label = "after"
        sc.records = list(proxy.records)
    return sc


def test_every_command_ran_and_every_request_went_through_the_proxy(scenario: Scenario) -> None:
    """Against moto (which ignores IAM) each step must succeed, or the recording means nothing."""
    failed = {label: (r.returncode, r.stderr[-2000:]) for label, r in scenario.results.items()
              if r.returncode != 0}
    assert not failed, failed
    assert set(scenario.results) == set(LABELS)
    host = scenario.proxy_endpoint.removeprefix("http://")
    assert scenario.records and all(r.host == host for r in scenario.records)  # path-style, via us
    assert not [r for r in scenario.records if r.label not in LABELS]
    for label in LABELS:
        assert scenario.calls(label), f"{label} sent no S3 request through the proxy"


def test_the_traffic_exercises_what_the_policy_must_cover(scenario: Scenario) -> None:
    """Multipart uploads, conditional writes, deletes and 404s all happened, so they were judged."""
    ops = {c.operation for r in scenario.records for c in [r.call()]}
    assert {"PutObject", "GetObject", "HeadObject", "ListObjectsV2", "CreateMultipartUpload", "UploadPart",
            "CompleteMultipartUpload"} <= ops, ops
    assert ops & {"DeleteObject", "DeleteObjects"}, ops
    assert any(r.headers.get("if-none-match") == "*" for r in scenario.records)
    assert any("if-match" in r.headers for r in scenario.records)  # leases: compare-and-swap


def _report(verdicts: list[Verdict]) -> str:
    lines = []
    for v in verdicts:
        for req, decision in v.denied():
            lines.append(f"{v.call.describe()}: {decision.value}: {req.describe()}")
    return "\n".join(dict.fromkeys(lines))


@pytest.mark.parametrize("label", LABELS)
def test_every_request_of_the_command_is_allowed_by_the_policy(scenario: Scenario, label: str) -> None:
    """The check this file exists for: on AWS, with iam-policy.json attached, nothing is refused."""
    verdicts = judge(policy_for(*PREFIXES), scenario.calls(label))
    assert all(v.allowed for v in verdicts), f"{label}: denied on AWS:\n{_report(verdicts)}"
