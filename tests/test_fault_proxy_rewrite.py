"""`Fault.reply_headers` of the fault proxy (tests/_fault_proxy.py), over the embedded moto
server: the reply of a request its rule picks carries the headers the function made, and
nothing else of it changes (the body, the other headers, a HEAD's Content-Length); the replies
of requests the rule leaves alone pass as they are. `counts["rewritten"]` is what tests built on
it (a store clock a year ahead, tests/test_review_grace_seams.py) assert to show their skew
was really seen, so it counts the replies the function changed and no other."""

from __future__ import annotations

import email.utils
from typing import Any

import botocore.session
from _fault_proxy import Fault, FaultProxy, Headers, Request

from backends.s3.embedded import EmbeddedS3

HOUR = 3600.0
# differ between any two replies, whatever the proxy does
VOLATILE = {"date", "server", "x-amzn-requestid", "connection"}


def _an_hour_later(headers: Headers) -> Headers:
    def later(value: str) -> str:
        at = email.utils.parsedate_to_datetime(value).timestamp() + HOUR
        return email.utils.formatdate(at, usegmt=True)

    return [(k, later(v) if k.lower() == "last-modified" else v) for k, v in headers]


def _rule(req: Request) -> Fault | None:
    if "/moved/" in req.path:
        return Fault(reply_headers=_an_hour_later)
    if "/same/" in req.path:
        return Fault(reply_headers=lambda headers: headers)
    return None


def _client(s3: EmbeddedS3, endpoint: str) -> Any:
    opts = s3.storage_options
    return botocore.session.get_session().create_client(
        "s3", endpoint_url=endpoint, region_name=s3.region,
        aws_access_key_id=opts["key"], aws_secret_access_key=opts["secret"])


def _headers(reply: dict[str, Any]) -> dict[str, str]:
    got = reply["ResponseMetadata"]["HTTPHeaders"]
    return {k: v for k, v in got.items() if k not in VOLATILE}


def test_reply_headers_rewrite_only_what_the_rule_picks(s3: EmbeddedS3) -> None:
    direct = _client(s3, s3.endpoint)
    body = b"the body passes as it is\n" * 40
    for key in ("moved/k", "same/k", "kept/k"):
        direct.put_object(Bucket=s3.bucket, Key=key, Body=body, ContentType="text/plain",
                          Metadata={"note": key})
    with FaultProxy(s3.endpoint, _rule) as proxy:
        through = _client(s3, proxy.endpoint)
        for key, shift in (("moved/k", HOUR), ("same/k", 0.0), ("kept/k", 0.0)):
            want_head = _headers(direct.head_object(Bucket=s3.bucket, Key=key))
            head = through.head_object(Bucket=s3.bucket, Key=key)
            original = direct.get_object(Bucket=s3.bucket, Key=key)
            want_get = _headers(original)
            got = through.get_object(Bucket=s3.bucket, Key=key)
            assert got["Body"].read() == body == original["Body"].read()
            for reply, want in ((head, want_head), (got, want_get)):
                seen = _headers(reply)
                moved = email.utils.parsedate_to_datetime(seen.pop("last-modified"))
                was = email.utils.parsedate_to_datetime(want.pop("last-modified"))
                assert (moved - was).total_seconds() == shift, (key, moved, was)
                assert seen == want, key  # Content-Length, ETag, checksums, metadata alike
            assert head["ContentLength"] == len(body) == got["ContentLength"]
        # the HEAD and the GET of moved/k; same/k's function gave its headers back unchanged
        assert proxy.counts["rewritten"] == 2, proxy.counts
        assert proxy.counts["forwarded"] == 6, proxy.counts
