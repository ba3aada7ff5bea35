"""A client that dies mid-request through the fault proxy (tests/_fault_proxy.py) leaves what
it would leave talking to moto directly: nothing. Before, the proxy forwarded the part of the
body that came, re-framed with its own Content-Length, and moto stored that torn object under
the checksum header the client had sent for the whole body. A SIGKILLed writer behind the
proxy (tests/test_review_grace_seams.py) so left an object no real S3 can hold, and the next
`ckptfs prune` failed on it with FlexibleChecksumError (a CI run at 4fab328)."""

from __future__ import annotations

import socket
import time
from typing import Any

import botocore.session
import pytest
from _fault_proxy import FaultProxy

from backends.s3.embedded import EmbeddedS3

BUCKET = "proxy-torn-body"


def _client(s3: EmbeddedS3) -> Any:
    opts = s3.storage_options
    return botocore.session.get_session().create_client(
        "s3", endpoint_url=s3.endpoint, region_name=s3.region,
        aws_access_key_id=opts["key"], aws_secret_access_key=opts["secret"])


# a PUT announcing 100 bytes, of which 10 come before the sender dies
TORN = {
    "length": b"Content-Length: 100\r\nx-amz-checksum-crc32: VaHHWQ==\r\n\r\n0123456789",
    "chunked": b"Transfer-Encoding: chunked\r\nx-amz-checksum-crc32: VaHHWQ==\r\n\r\n"
               b"64\r\n0123456789",
}


def _die_mid_put(endpoint: str, key: str, framing: str) -> None:
    """Send a PUT's headers and part of its body, then close: a process killed mid-upload."""
    host, port = endpoint.split("//")[1].split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"PUT /{BUCKET}/{key} HTTP/1.1\r\nHost: {host}\r\n".encode() + TORN[framing])
        time.sleep(0.2)


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_body_cut_short_is_not_forwarded(s3: EmbeddedS3, framing: str) -> None:
    client = _client(s3)
    client.create_bucket(Bucket=BUCKET)
    _die_mid_put(s3.endpoint, f"direct-{framing}", framing)  # what moto itself does with it
    with FaultProxy(s3.endpoint, lambda _req: None) as proxy:
        _die_mid_put(proxy.endpoint, f"proxied-{framing}", framing)
        deadline = time.monotonic() + 10
        while proxy.counts["client-gone"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.counts["client-gone"] == 1 and proxy.counts["forwarded"] == 0, proxy.counts
    time.sleep(0.3)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert keys == [], keys  # neither moto nor the proxy kept a torn object
    # a whole request through the proxy still lands
    with FaultProxy(s3.endpoint, lambda _req: None) as proxy:
        opts = s3.storage_options
        whole = botocore.session.get_session().create_client(
            "s3", endpoint_url=proxy.endpoint, region_name=s3.region,
            aws_access_key_id=opts["key"], aws_secret_access_key=opts["secret"])
        whole.put_object(Bucket=BUCKET, Key="whole", Body=b"x" * 100)
        assert proxy.counts["client-gone"] == 0
    assert client.get_object(Bucket=BUCKET, Key="whole")["Body"].read() == b"x" * 100
