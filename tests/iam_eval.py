"""A small IAM policy evaluator and an S3 request-to-permission map, for testing iam-policy.json.

moto does not enforce IAM, so a policy that AWS would refuse passes every test that only talks to
moto. This module decides, offline, what AWS would decide for the subset of the policy language
that `backends/s3/iam-policy.json` can reasonably use, and refuses (ValueError) anything outside
that subset instead of guessing: a silently wrong "allow" is the failure it exists to prevent.

Rules followed, with where they are written down:

- Evaluation (one identity policy, one account): every request is implicitly denied; an applicable
  Allow allows it; an applicable Deny denies it whatever else applies. AWS IAM User Guide, "How AWS
  enforcement code logic evaluates requests to allow or deny access" and "The difference between
  explicit and implicit denies"
  (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic_policy-eval-denyallow.html).
- Action / NotAction: the service prefix and action name are case-insensitive; `*` and `?` are
  wildcards. Resource / NotResource: ARNs, case-sensitive; `*` and `?` match within one
  colon-separated segment, and a `*` that is the last character of a segment may expand beyond
  the colons ("IAM JSON policy elements: Resource", section "Using wildcards in resource ARNs",
  https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_resource.html).
- Condition: all operators of a block must hold, all keys of an operator must hold, and a key
  holds when the request's value matches any of the policy's values. Key names are
  case-insensitive ("IAM JSON policy elements: Condition").
- A key absent from the request context: "If the key that you specify in a policy condition is
  not present in the request context, the values do not match and the condition is false. If the
  policy condition requires that the key is not matched, such as StringNotLike or ArnNotLike, and
  the right key is not present, the condition is true. This logic applies to all condition
  operators except ...IfExists and Null check." ("IAM JSON policy elements: Condition
  operators", https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_condition_operators.html).
  `...IfExists` holds when the key is absent; `Null: true` holds when the key is absent and
  `Null: false` when it is present.
- Set qualifiers ("Single-valued vs. multivalued context keys", same guide): `ForAllValues:`
  holds when every request value matches, and also when the key is absent or empty;
  `ForAnyValue:` holds when at least one request value matches, so never for an absent key.

S3's side (`authorizations`): which IAM action, resource ARN and condition keys each S3 API
operation is authorised as, from the "API operations defined by Amazon S3" table of the Service
Authorization Reference ("Actions, resources, and condition keys for Amazon S3",
https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html) and the
Permissions section of each operation's API reference page:

- HeadBucket is `s3:ListBucket` on the bucket (API_HeadBucket: "you must have permissions to
  perform the s3:ListBucket action"); it carries no prefix, so `s3:prefix` is absent.
- ListObjects / ListObjectsV2 are `s3:ListBucket` on the bucket with `s3:prefix`, `s3:delimiter`
  and `s3:max-keys` taken from the request's parameters when it sends them.
- GetObject and HeadObject are `s3:GetObject` on the object (`s3:GetObjectVersion` with a
  versionId); PutObject, CreateMultipartUpload, UploadPart and CompleteMultipartUpload are
  `s3:PutObject`; AbortMultipartUpload is `s3:AbortMultipartUpload`; ListParts is
  `s3:ListMultipartUploadParts`; DeleteObject is `s3:DeleteObject`, and DeleteObjects is
  `s3:DeleteObject` once per key it names; CopyObject (and UploadPartCopy) is `s3:GetObject` on
  the source and `s3:PutObject` on the destination; GetBucketLocation is `s3:GetBucketLocation`;
  ListBuckets is `s3:ListAllMyBuckets` on `*`.
- A GET or HEAD of a missing object is answered 404 only if the caller may also `s3:ListBucket`
  the bucket, 403 otherwise (API_HeadObject, Permissions). AWS evaluates that ListBucket with the
  object's key as `s3:prefix`; Ceph RGW copied this to match AWS (ceph/ceph pull request 68577,
  "rgw: read_obj_policy() consults s3:prefix when deciding between 403/404"). So a 404 the
  client relies on is one more authorization here.
"""

from __future__ import annotations

import copy
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

POLICY_VERSION = "2012-10-17"

# ------------------------------------------------------------------------------ decisions


class Decision(Enum):
    """The outcome of evaluating one request: AWS's three cases, kept apart for messages."""

    ALLOW = "allow"
    EXPLICIT_DENY = "explicit-deny"
    IMPLICIT_DENY = "implicit-deny"

    @property
    def allowed(self) -> bool:
        return self is Decision.ALLOW


@dataclass(frozen=True)
class AuthzRequest:
    """One authorization AWS makes: an action on a resource, with the request's context keys.

    Context values are lists (a single-valued key has one element); names are matched
    case-insensitively, as AWS matches them.
    """

    action: str
    resource: str
    context: Mapping[str, Sequence[str]] = field(default_factory=dict)
    why: str = ""

    def describe(self) -> str:
        ctx = ", ".join(f"{k}={list(v)!r}" for k, v in sorted(self.context.items())) or "no context keys"
        return f"{self.action} on {self.resource} ({ctx})" + (f" [{self.why}]" if self.why else "")


# ------------------------------------------------------------------------------- matching


def _glob_regex(pattern: str, *, ignore_case: bool) -> re.Pattern[str]:
    """`*` any run of characters, `?` exactly one, everything else literal (AWS string globs)."""
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body, re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def string_like(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    """StringLike's match: the whole value against a glob with `*` and `?`."""
    return _glob_regex(pattern, ignore_case=ignore_case).fullmatch(value) is not None


def action_matches(pattern: str, action: str) -> bool:
    """Action element match: case-insensitive glob over `service:Action`."""
    return string_like(pattern, action, ignore_case=True)


def _arn_regex(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    for i, c in enumerate(pattern):
        if c == "*":
            last_of_segment = i + 1 == len(pattern) or pattern[i + 1] == ":"
            out.append(".*" if last_of_segment else "[^:]*")
        elif c == "?":
            out.append("[^:]")
        else:
            out.append(re.escape(c))
    return re.compile("".join(out), re.DOTALL)


def resource_matches(pattern: str, arn: str) -> bool:
    """Resource element match: `*` alone is every resource; otherwise the per-segment ARN glob."""
    if pattern == "*":
        return True
    return _arn_regex(pattern).fullmatch(arn) is not None


# ----------------------------------------------------------------------------- conditions

_STRING_OPERATORS: dict[str, tuple[bool, bool, bool]] = {
    # name -> (negated, glob, ignore_case)
    "stringequals": (False, False, False),
    "stringnotequals": (True, False, False),
    "stringequalsignorecase": (False, False, True),
    "stringnotequalsignorecase": (True, False, True),
    "stringlike": (False, True, False),
    "stringnotlike": (True, True, False),
}


def _policy_values(raw: Any, where: str) -> list[str]:
    values = raw if isinstance(raw, list) else [raw]
    out: list[str] = []
    for v in values:
        if isinstance(v, bool):
            out.append("true" if v else "false")
        elif isinstance(v, str | int | float):
            out.append(str(v))
        else:
            raise ValueError(f"{where}: condition values must be strings, numbers or booleans")
        if "${" in out[-1]:
            raise ValueError(f"{where}: policy variables (${{...}}) are not supported by this evaluator")
    return out


def _one_value_matches(op: str, policy_values: Sequence[str], value: str) -> bool:
    """The positive form of `op` for one request value: does it match any policy value?"""
    if op == "bool":
        return value.lower() in {p.lower() for p in policy_values}
    _negated, glob, ignore_case = _STRING_OPERATORS[op]
    if glob:
        return any(string_like(p, value, ignore_case=ignore_case) for p in policy_values)
    if ignore_case:
        return value.lower() in {p.lower() for p in policy_values}
    return value in policy_values


def _key_holds(operator: str, key: str, policy_values: Sequence[str],
               context: Mapping[str, Sequence[str]]) -> bool:
    qualifier, _, name = operator.rpartition(":")
    qualifier = qualifier.lower()
    op = name.lower()
    if_exists = op.endswith("ifexists")
    if if_exists:
        op = op[: -len("ifexists")]
    present = key.lower() in context
    values = list(context.get(key.lower(), ()))
    if op == "null":
        if qualifier or if_exists:
            raise ValueError(f"{operator}: Null takes neither a set qualifier nor IfExists")
        wanted = {p.lower() for p in policy_values}
        if not wanted <= {"true", "false"}:
            raise ValueError(f"{operator} {key}: Null takes true or false")
        absent = not present
        return ("true" in wanted and absent) or ("false" in wanted and not absent)
    if op != "bool" and op not in _STRING_OPERATORS:
        raise ValueError(f"condition operator {operator!r} is not supported by this evaluator")
    negated = op in _STRING_OPERATORS and _STRING_OPERATORS[op][0]

    def single(value: str) -> bool:
        hit = _one_value_matches(op, policy_values, value)
        return not hit if negated else hit

    if qualifier == "forallvalues":
        return all(single(v) for v in values)  # vacuously true for an absent or empty key
    if qualifier == "foranyvalue":
        return any(single(v) for v in values)  # never for an absent or empty key
    if qualifier:
        raise ValueError(f"unknown set qualifier in {operator!r}")
    if not present:
        return if_exists or negated
    if len(values) != 1:
        raise ValueError(f"{operator} {key}: a multivalued context key needs ForAnyValue:/ForAllValues:")
    return single(values[0])


def condition_holds(block: Mapping[str, Any], context: Mapping[str, Sequence[str]]) -> bool:
    """A whole Condition block: every operator, every key of it (values of one key are ORed)."""
    ctx = {k.lower(): list(v) for k, v in context.items()}
    for operator, keys in block.items():
        if not isinstance(keys, Mapping):
            raise ValueError(f"Condition {operator!r} must map keys to values")
        for key, raw in keys.items():
            if not _key_holds(operator, key, _policy_values(raw, f"{operator} {key}"), ctx):
                return False
    return True


# ------------------------------------------------------------------------------- policies

_STATEMENT_FIELDS = {"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Condition"}


def _as_list(raw: Any, where: str) -> list[str]:
    values = raw if isinstance(raw, list) else [raw]
    if not values or not all(isinstance(v, str) and v for v in values):
        raise ValueError(f"{where}: must be a non-empty string or list of strings")
    return list(values)


@dataclass(frozen=True)
class Statement:
    """One parsed statement of an identity-based policy."""

    sid: str
    effect: str
    actions: tuple[str, ...]
    not_actions: bool
    resources: tuple[str, ...]
    not_resources: bool
    condition: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any], index: int) -> Statement:
        where = f"Statement[{index}]" + (f" ({raw['Sid']})" if "Sid" in raw else "")
        unknown = set(raw) - _STATEMENT_FIELDS
        if unknown:
            raise ValueError(f"{where}: unsupported element(s) {sorted(unknown)} (Principal belongs in "
                             "resource policies)")
        if raw.get("Effect") not in ("Allow", "Deny"):
            raise ValueError(f"{where}: Effect must be Allow or Deny")
        if ("Action" in raw) == ("NotAction" in raw):
            raise ValueError(f"{where}: exactly one of Action and NotAction")
        if ("Resource" in raw) == ("NotResource" in raw):
            raise ValueError(f"{where}: exactly one of Resource and NotResource")
        cond = raw.get("Condition", {})
        if not isinstance(cond, Mapping):
            raise ValueError(f"{where}: Condition must be an object")
        return cls(
            sid=str(raw.get("Sid", f"#{index}")), effect=raw["Effect"],
            actions=tuple(_as_list(raw.get("Action", raw.get("NotAction")), f"{where} Action")),
            not_actions="NotAction" in raw,
            resources=tuple(_as_list(raw.get("Resource", raw.get("NotResource")), f"{where} Resource")),
            not_resources="NotResource" in raw,
            condition=cond,
        )

    def applies(self, req: AuthzRequest) -> bool:
        """Action, resource and condition all match (NotX inverts its element's match)."""
        act = any(action_matches(p, req.action) for p in self.actions)
        if act == self.not_actions:
            return False
        res = any(resource_matches(p, req.resource) for p in self.resources)
        if res == self.not_resources:
            return False
        return condition_holds(self.condition, req.context)


@dataclass(frozen=True)
class Policy:
    """A parsed identity policy (or several attached ones, concatenated: same evaluation)."""

    statements: tuple[Statement, ...]

    @classmethod
    def parse(cls, doc: Mapping[str, Any] | str) -> Policy:
        data: Any = json.loads(doc) if isinstance(doc, str) else doc
        if data.get("Version") != POLICY_VERSION:
            raise ValueError(f"policy Version must be {POLICY_VERSION!r}")
        raw = data.get("Statement")
        stmts = raw if isinstance(raw, list) else [raw]
        if not stmts or not all(isinstance(s, Mapping) for s in stmts):
            raise ValueError("policy needs a Statement object or list of objects")
        return cls(tuple(Statement.parse(s, i) for i, s in enumerate(stmts)))

    def __add__(self, other: Policy) -> Policy:
        return Policy(self.statements + other.statements)

    def evaluate(self, req: AuthzRequest) -> Decision:
        """Default deny; any applicable Deny wins; otherwise any applicable Allow allows."""
        applicable = [s for s in self.statements if s.applies(req)]
        if any(s.effect == "Deny" for s in applicable):
            return Decision.EXPLICIT_DENY
        if any(s.effect == "Allow" for s in applicable):
            return Decision.ALLOW
        return Decision.IMPLICIT_DENY

    def allowing(self, req: AuthzRequest) -> list[str]:
        """Sids of the Allow statements that apply (for messages)."""
        return [s.sid for s in self.statements if s.effect == "Allow" and s.applies(req)]


def instantiate(template: Mapping[str, Any], bucket: str, prefix: str) -> dict[str, Any]:
    """The policy with its `BUCKET` and `PREFIX` placeholders filled in, as backends/s3/README.md
    tells an operator to do; only Resource, NotResource and Condition values are edited."""
    doc = copy.deepcopy(dict(template))

    def fill(v: Any) -> Any:
        if isinstance(v, str):
            return v.replace("BUCKET", bucket).replace("PREFIX", prefix)
        if isinstance(v, list):
            return [fill(x) for x in v]
        if isinstance(v, dict):
            return {k: fill(x) for k, x in v.items()}
        return v

    stmts = doc["Statement"] if isinstance(doc["Statement"], list) else [doc["Statement"]]
    for s in stmts:
        for k in ("Resource", "NotResource", "Condition"):
            if k in s:
                s[k] = fill(s[k])
    doc["Statement"] = stmts
    return doc


# ----------------------------------------------------------------------------- S3 requests


@dataclass(frozen=True)
class S3Call:
    """One S3 API operation as it went over the wire (path-style), with the server's status."""

    operation: str
    bucket: str | None
    key: str | None
    query: Mapping[str, str]
    headers: Mapping[str, str]
    status: int
    delete_keys: tuple[tuple[str, str | None], ...] = ()  # DeleteObjects: (key, versionId)

    def describe(self) -> str:
        where = f"s3://{self.bucket}/{self.key}" if self.key is not None else f"s3://{self.bucket or ''}"
        params = {k: v for k, v in self.query.items() if k in ("prefix", "delimiter", "max-keys",
                                                                 "start-after", "list-type")}
        return f"{self.operation} {where}" + (f" {params}" if params else "") + f" -> {self.status}"


_BUCKET_GET_SUBRESOURCES = {"location": "GetBucketLocation", "uploads": "ListMultipartUploads",
                            "versions": "ListObjectVersions", "versioning": "GetBucketVersioning"}


def operation_from_http(method: str, target: str, headers: Mapping[str, str], body: bytes,
                        status: int) -> S3Call:
    """Name the S3 REST operation a path-style request is (S3 API reference, per operation).

    Anything not in this table raises: an operation the map below does not know must make the
    test fail, not pass unexamined.
    """
    parts = urlsplit(target)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    hdrs = {k.lower(): v for k, v in headers.items()}
    path = parts.path
    if not path.startswith("/"):
        raise ValueError(f"not a path-style S3 request: {method} {target}")
    bucket_part, _, key_part = path[1:].partition("/")
    bucket = unquote(bucket_part) or None
    key = unquote(key_part) if key_part else None
    m = method.upper()

    def call(op: str, **kw: Any) -> S3Call:
        return S3Call(op, bucket, key, query, hdrs, status, **kw)

    if bucket is None:
        if m == "GET":
            return call("ListBuckets")
    elif key is None:
        if m == "HEAD":
            return call("HeadBucket")
        if m == "GET":
            if query.get("list-type") == "2":
                return call("ListObjectsV2")
            for sub, op in _BUCKET_GET_SUBRESOURCES.items():
                if sub in query:
                    return call(op)
            if not set(query) - {"prefix", "delimiter", "max-keys", "marker", "encoding-type"}:
                return call("ListObjects")
        if m == "POST" and "delete" in query:
            return call("DeleteObjects", delete_keys=_delete_keys(body))
        if m == "PUT" and not query:
            return call("CreateBucket")
        if m == "DELETE" and not query:
            return call("DeleteBucket")
    else:
        copy_source = "x-amz-copy-source" in hdrs
        if m == "GET":
            if "uploadId" in query:
                return call("ListParts")
            if not set(query) - {"versionId", "partNumber", "response-content-type"}:
                return call("GetObject")
        if m == "HEAD" and not set(query) - {"versionId", "partNumber"}:
            return call("HeadObject")
        if m == "PUT":
            if "uploadId" in query and "partNumber" in query:
                return call("UploadPartCopy" if copy_source else "UploadPart")
            if not query:
                return call("CopyObject" if copy_source else "PutObject")
        if m == "POST":
            if "uploads" in query:
                return call("CreateMultipartUpload")
            if "uploadId" in query:
                return call("CompleteMultipartUpload")
        if m == "DELETE":
            if "uploadId" in query:
                return call("AbortMultipartUpload")
            if not set(query) - {"versionId"}:
                return call("DeleteObject")
    raise ValueError(f"unrecognised S3 request: {method} {target}")


def _delete_keys(body: bytes) -> tuple[tuple[str, str | None], ...]:
    root = ET.fromstring(body)
    out: list[tuple[str, str | None]] = []
    for obj in root.iter():
        if obj.tag.rsplit("}", 1)[-1] != "Object":
            continue
        fields = {child.tag.rsplit("}", 1)[-1]: (child.text or "") for child in obj}
        out.append((fields["Key"], fields.get("VersionId")))
    if not out:
        raise ValueError("DeleteObjects body names no keys")
    return tuple(out)


def bucket_arn(bucket: str) -> str:
    return f"arn:aws:s3:::{bucket}"


def object_arn(bucket: str, key: str) -> str:
    return f"arn:aws:s3:::{bucket}/{key}"


_LIST_KEYS = {"prefix": "s3:prefix", "delimiter": "s3:delimiter", "max-keys": "s3:max-keys"}
# request headers that S3 also exposes as condition keys of the same name
_PUT_HEADER_KEYS = {h: f"s3:{h}" for h in ("x-amz-acl", "x-amz-server-side-encryption",
                                           "x-amz-storage-class")}


def _copy_source(raw: str) -> tuple[str, str, str | None]:
    src, _, qs = unquote(raw).partition("?")
    b, _, k = src.lstrip("/").partition("/")
    version = dict(parse_qsl(qs)).get("versionId")
    if not b or not k:
        raise ValueError(f"bad x-amz-copy-source {raw!r}")
    return b, k, version


def authorizations(call: S3Call) -> list[AuthzRequest]:
    """Every authorization AWS makes for this call (see the module docstring for the sources)."""
    op, b, k = call.operation, call.bucket, call.key
    if op == "ListBuckets":
        return [AuthzRequest("s3:ListAllMyBuckets", "*")]
    if b is None:
        raise ValueError(f"{op} without a bucket")
    if op == "HeadBucket":
        return [AuthzRequest("s3:ListBucket", bucket_arn(b))]
    if op in ("ListObjects", "ListObjectsV2", "ListObjectVersions"):
        ctx = {ck: [call.query[q]] for q, ck in _LIST_KEYS.items() if q in call.query}
        action = "s3:ListBucketVersions" if op == "ListObjectVersions" else "s3:ListBucket"
        return [AuthzRequest(action, bucket_arn(b), ctx)]
    if op == "GetBucketLocation":
        return [AuthzRequest("s3:GetBucketLocation", bucket_arn(b))]
    if op == "ListMultipartUploads":
        return [AuthzRequest("s3:ListBucketMultipartUploads", bucket_arn(b))]
    if op == "GetBucketVersioning":
        return [AuthzRequest("s3:GetBucketVersioning", bucket_arn(b))]
    if op == "CreateBucket":
        return [AuthzRequest("s3:CreateBucket", bucket_arn(b))]
    if op == "DeleteBucket":
        return [AuthzRequest("s3:DeleteBucket", bucket_arn(b))]
    if op == "DeleteObjects":
        return [AuthzRequest("s3:DeleteObjectVersion" if v else "s3:DeleteObject", object_arn(b, key),
                             why="DeleteObjects entry") for key, v in call.delete_keys]
    if k is None:
        raise ValueError(f"{op} without a key")
    versioned = "versionId" in call.query
    if op in ("GetObject", "HeadObject"):
        out = [AuthzRequest("s3:GetObjectVersion" if versioned else "s3:GetObject", object_arn(b, k))]
        if call.status == 404:
            out.append(AuthzRequest("s3:ListBucket", bucket_arn(b), {"s3:prefix": [k]},
                                    why="a 404 is shown only to a caller who may list that key; else 403"))
        return out
    put_ctx = {ck: [call.headers[h]] for h, ck in _PUT_HEADER_KEYS.items() if h in call.headers}
    if op in ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"):
        return [AuthzRequest("s3:PutObject", object_arn(b, k), put_ctx)]
    if op in ("CopyObject", "UploadPartCopy"):
        sb, sk, sv = _copy_source(call.headers["x-amz-copy-source"])
        ctx = dict(put_ctx)
        ctx["s3:x-amz-copy-source"] = [call.headers["x-amz-copy-source"]]
        if "x-amz-metadata-directive" in call.headers:
            ctx["s3:x-amz-metadata-directive"] = [call.headers["x-amz-metadata-directive"]]
        return [AuthzRequest("s3:GetObjectVersion" if sv else "s3:GetObject", object_arn(sb, sk),
                             why="copy source"),
                AuthzRequest("s3:PutObject", object_arn(b, k), ctx, why="copy destination")]
    if op == "AbortMultipartUpload":
        return [AuthzRequest("s3:AbortMultipartUpload", object_arn(b, k))]
    if op == "ListParts":
        return [AuthzRequest("s3:ListMultipartUploadParts", object_arn(b, k))]
    if op == "DeleteObject":
        return [AuthzRequest("s3:DeleteObjectVersion" if versioned else "s3:DeleteObject", object_arn(b, k))]
    raise ValueError(f"no permission mapping for S3 operation {op}")


@dataclass(frozen=True)
class Verdict:
    """A call and what the policy decides for each authorization it needs."""

    call: S3Call
    checks: tuple[tuple[AuthzRequest, Decision], ...]

    @property
    def allowed(self) -> bool:
        return all(d.allowed for _, d in self.checks)

    def denied(self) -> list[tuple[AuthzRequest, Decision]]:
        return [(r, d) for r, d in self.checks if not d.allowed]


def judge(policy: Policy, calls: Iterable[S3Call]) -> list[Verdict]:
    """Each call with the decision for every authorization it needs."""
    return [Verdict(c, tuple((r, policy.evaluate(r)) for r in authorizations(c))) for c in calls]
