"""SigV4 as S3 checks it (`serving.s3_signatures`), against botocore's signer as the reference
client: what it signs verifies, and every change to a signed part, the clock, the key or the
header's shape is refused with S3's code, never another exception."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from unittest import mock
from urllib.parse import quote, urlencode, urlsplit

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import botocore.crt.auth
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardcache.errors import SignatureRefused
from shardcache.serving.s3_signatures import PRESIGNED_PARAMS, SignedRequest, is_signed, verify

KEYS = {"AKIASHARDCACHE01": "s3cr3t/with+odd=chars", "reader": "another-secret-0000"}
NOW = datetime.datetime(2026, 11, 28, 12, 0, 0, tzinfo=datetime.UTC)
ENDPOINT = "http://127.0.0.1:8470"


def _signed(
    method: str,
    url: str,
    headers: Mapping[str, str] | None = None,
    *,
    key: str = "AKIASHARDCACHE01",
    secret: str | None = None,
    at: datetime.datetime = NOW,
    presign_s: int | None = None,
    region: str = "us-east-1",
    crt: bool = False,
) -> tuple[str, str, dict[str, str]]:
    """The method, URL and headers botocore sends for a request signed at `at` (by its own
    signer, or with `crt` by the AWS CRT's, which botocore uses when awscrt is installed)."""
    credentials = botocore.credentials.Credentials(key, secret or KEYS.get(key, "x"))
    request = botocore.awsrequest.AWSRequest(method=method, url=url, headers=dict(headers or {}))
    signer: botocore.auth.BaseSigner
    if crt:
        kind = botocore.crt.auth.CrtS3SigV4Auth
        query_kind = botocore.crt.auth.CrtS3SigV4QueryAuth
    else:
        kind, query_kind = botocore.auth.S3SigV4Auth, botocore.auth.S3SigV4QueryAuth
    if presign_s is None:
        signer = kind(credentials, "s3", region)
    else:
        signer = query_kind(credentials, "s3", region, expires=presign_s)

    def now(remove_tzinfo: bool = True) -> datetime.datetime:
        return at.replace(tzinfo=None) if remove_tzinfo else at

    with (
        mock.patch("botocore.auth.get_current_datetime", now),
        mock.patch("botocore.crt.auth.get_current_datetime", now),
    ):
        signer.add_auth(request)
    prepared = request.prepare()
    sent = {name: value for name, value in prepared.headers.items()}
    sent.setdefault("Host", urlsplit(prepared.url).netloc)
    return method, prepared.url, sent


def _request(method: str, url: str, headers: Mapping[str, str]) -> SignedRequest:
    parts = urlsplit(url)
    lowered = {name.lower(): value for name, value in headers.items()}
    return SignedRequest(
        method,
        parts.path,
        parts.query,
        lambda name: [lowered[name.lower()]] if name.lower() in lowered else [],
        list(headers),
    )


def _verify(sent: tuple[str, str, dict[str, str]], now: datetime.datetime = NOW) -> str:
    return verify(_request(*sent), KEYS, now.timestamp())


Sent = tuple[str, str, dict[str, str]]


def _refused(sent: Sent, now: datetime.datetime = NOW) -> tuple[str, int]:
    with pytest.raises(SignatureRefused) as caught:
        _verify(sent, now)
    return caught.value.code, caught.value.status


@pytest.mark.parametrize(
    ("method", "url", "headers"),
    [
        ("GET", f"{ENDPOINT}/my-bucket/datasets/laion/shards_000001.tar", {}),
        ("HEAD", f"{ENDPOINT}/my-bucket/a%20b/c%21d~e%2Bf%3D%25.tar", {"Range": "bytes=0-9"}),
        ("GET", f"{ENDPOINT}/my-bucket/%E2%82%AC/x.tar", {"x-amz-checksum-mode": "ENABLED"}),
        ("GET", f"{ENDPOINT}/my-bucket?list-type=2&prefix=a%20b%2F&continuation-token=x%2B%3D", {}),
        ("GET", f"{ENDPOINT}/my-bucket?location", {}),
        ("GET", f"{ENDPOINT}/", {}),
        ("GET", "http://my-bucket.localhost:8470/datasets/x.tar", {}),
    ],
)
@pytest.mark.parametrize("crt", [False, True], ids=["botocore", "crt"])
def test_what_botocore_signs_verifies(
    method: str, url: str, headers: dict[str, str], crt: bool
) -> None:
    sent = _signed(method, url, headers, crt=crt)
    assert _verify(sent) == "AKIASHARDCACHE01"
    presigned = _signed(method, url, headers, presign_s=3600, crt=crt)
    assert "Authorization" not in presigned[2]
    assert _verify(presigned) == "AKIASHARDCACHE01"
    assert is_signed(sent[2].get("Authorization"), []) and is_signed(None, ["X-Amz-Signature"])


def test_any_region_signs() -> None:
    sent = _signed("GET", f"{ENDPOINT}/b/k", region="eu-central-1", key="reader")
    assert _verify(sent) == "reader"


def test_an_unknown_key_a_wrong_secret_and_a_replay_are_refused() -> None:
    url = f"{ENDPOINT}/my-bucket/a.tar"
    assert _refused(_signed("GET", url, key="AKIANOTCONFIGURED")) == ("InvalidAccessKeyId", 403)
    wrong = _signed("GET", url, key="reader", secret="not-the-secret")
    assert _refused(wrong) == ("SignatureDoesNotMatch", 403)
    method, _, headers = _signed("GET", url)
    for other in (f"{ENDPOINT}/my-bucket/b.tar", f"{ENDPOINT}/other/a.tar", f"{url}?x-id=1"):
        assert _refused((method, other, headers)) == ("SignatureDoesNotMatch", 403), other
    assert _refused(("HEAD", url, headers)) == ("SignatureDoesNotMatch", 403)
    # The same signature under another key id (the key id is part of what is signed).
    stolen = dict(headers)
    stolen["Authorization"] = headers["Authorization"].replace("AKIASHARDCACHE01", "reader")
    assert _refused((method, url, stolen)) == ("SignatureDoesNotMatch", 403)


def test_a_signed_header_altered_or_an_unsigned_amz_header_added_is_refused() -> None:
    url = f"{ENDPOINT}/my-bucket/a.tar"
    method, _, headers = _signed("GET", url, {"Range": "bytes=0-9"})
    altered = {**headers, "Range": "bytes=0-99"}
    assert _refused((method, url, altered)) == ("SignatureDoesNotMatch", 403)
    added = {**headers, "x-amz-checksum-mode": "ENABLED"}
    with pytest.raises(SignatureRefused) as caught:
        _verify((method, url, added))
    assert caught.value.code == "AccessDenied"
    assert caught.value.fields["HeadersNotSigned"] == "x-amz-checksum-mode"
    other_host = {**headers, "Host": "evil.example:8470"}
    assert _refused((method, url, other_host)) == ("SignatureDoesNotMatch", 403)
    mismatch = {**headers, "X-Amz-Content-SHA256": "0" * 64}
    assert _refused((method, url, mismatch)) == ("XAmzContentSHA256Mismatch", 400)


def test_clock_skew_of_fifteen_minutes() -> None:
    url = f"{ENDPOINT}/my-bucket/a.tar"
    for minutes in (-14, 14):
        assert _verify(_signed("GET", url, at=NOW + datetime.timedelta(minutes=minutes)))
    for minutes in (-16, 16, -60 * 24):
        sent = _signed("GET", url, at=NOW + datetime.timedelta(minutes=minutes))
        with pytest.raises(SignatureRefused) as caught:
            _verify(sent)
        assert (caught.value.code, caught.value.status) == ("RequestTimeTooSkewed", 403)
        assert caught.value.fields["MaxAllowedSkewMilliseconds"] == "900000"


def test_a_presigned_url_expires_and_is_not_valid_before_its_time() -> None:
    url = f"{ENDPOINT}/my-bucket/a.tar"
    sent = _signed("GET", url, presign_s=60)
    assert _verify(sent, NOW + datetime.timedelta(seconds=59))
    with pytest.raises(SignatureRefused) as caught:
        _verify(sent, NOW + datetime.timedelta(seconds=61))
    assert (caught.value.code, str(caught.value)) == ("AccessDenied", "Request has expired")
    early = _signed("GET", url, presign_s=60, at=NOW + datetime.timedelta(hours=1))
    assert _refused(early) == ("AccessDenied", 403)
    method, signed_url, headers = sent
    longer = signed_url.replace("X-Amz-Expires=60", "X-Amz-Expires=6000")
    assert _refused((method, longer, headers)) == ("SignatureDoesNotMatch", 403)
    week = signed_url.replace("X-Amz-Expires=60", "X-Amz-Expires=604801")
    assert _refused((method, week, headers)) == ("AuthorizationQueryParametersError", 400)


@pytest.mark.parametrize(
    ("authorization", "code"),
    [
        ("AWS4-HMAC-SHA256 garbage", "AuthorizationHeaderMalformed"),
        ("AWS4-HMAC-SHA256 ", "AuthorizationHeaderMalformed"),
        (
            "AWS4-HMAC-SHA256 Credential=a, SignedHeaders=host, Signature=00",
            "AuthorizationHeaderMalformed",
        ),
        (
            "AWS4-HMAC-SHA256 Credential=AKIASHARDCACHE01/20261128/us-east-1/ec2/aws4_request, "
            "SignedHeaders=host, Signature=00",
            "AuthorizationHeaderMalformed",
        ),
        (
            "AWS4-HMAC-SHA256 Credential=AKIASHARDCACHE01/20261127/us-east-1/s3/aws4_request, "
            "SignedHeaders=host, Signature=00",
            "AuthorizationHeaderMalformed",
        ),
        (
            "AWS4-HMAC-SHA256 Credential=AKIASHARDCACHE01/20261128/us-east-1/s3/aws4_request, "
            "SignedHeaders=x-amz-date, Signature=00",
            "AuthorizationHeaderMalformed",
        ),
        (
            "AWS4-HMAC-SHA256 Credential=AKIASHARDCACHE01/20261128/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=\udcff\u20ac",
            "SignatureDoesNotMatch",
        ),
        ("AWS AKIASHARDCACHE01:c2lnbmF0dXJl", "InvalidRequest"),
        ("AWS4-HMAC-SHA256 Credential=" + "A" * 100_000, "AuthorizationHeaderMalformed"),
    ],
)
def test_garbage_authorization_is_a_clear_s3_error(authorization: str, code: str) -> None:
    headers = {
        "Host": "127.0.0.1:8470",
        "X-Amz-Date": "20261128T120000Z",
        "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD",
        "Authorization": authorization,
    }
    assert _refused(("GET", f"{ENDPOINT}/my-bucket/a.tar", headers))[0] == code


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"}, "AccessDenied"),  # no x-amz-date
        ({"X-Amz-Date": "yesterday", "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"}, "AccessDenied"),
        ({"X-Amz-Date": "20261128T120000Z"}, "InvalidRequest"),  # no content hash
        ({"X-Amz-Date": "20261128T120000Z", "X-Amz-Content-SHA256": "abc"}, "InvalidArgument"),
    ],
)
def test_missing_or_malformed_signed_parts(headers: dict[str, str], code: str) -> None:
    authorization = (
        "AWS4-HMAC-SHA256 Credential=AKIASHARDCACHE01/20261128/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=" + "0" * 64
    )
    sent = {"Host": "127.0.0.1:8470", "Authorization": authorization, **headers}
    assert _refused(("GET", f"{ENDPOINT}/my-bucket/a.tar", sent))[0] == code


@pytest.mark.parametrize(
    "query",
    [
        "X-Amz-Signature=00",
        "X-Amz-Algorithm=AWS4-HMAC-SHA1&X-Amz-Credential=a&X-Amz-Date=20261128T120000Z"
        "&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Signature=00",
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=a%2Fb&X-Amz-Date=20261128T120000Z"
        "&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Signature=00",
        "X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIASHARDCACHE01%2F20261128%2Fus-east-1%2Fs3%2Faws4_request"
        "&X-Amz-Date=20261128T120000Z&X-Amz-Expires=-5&X-Amz-SignedHeaders=host"
        "&X-Amz-Signature=00",
    ],
)
def test_a_malformed_presigned_query_is_a_clear_s3_error(query: str) -> None:
    sent = ("GET", f"{ENDPOINT}/my-bucket/a.tar?{query}", {"Host": "127.0.0.1:8470"})
    assert _refused(sent) == ("AuthorizationQueryParametersError", 400)


def test_both_mechanisms_at_once_are_refused() -> None:
    method, url, _ = _signed("GET", f"{ENDPOINT}/my-bucket/a.tar", presign_s=60)
    _, _, headers = _signed("GET", f"{ENDPOINT}/my-bucket/a.tar")
    assert _refused((method, url, headers)) == ("InvalidArgument", 400)


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=200)
_PIECES = st.sampled_from(
    [
        "AWS4-HMAC-SHA256 ",
        "Credential=",
        "AKIASHARDCACHE01/20261128/us-east-1/s3/aws4_request",
        "SignedHeaders=",
        "host;x-amz-date",
        "Signature=",
        ", ",
        "=",
        "/",
        ";",
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    authorization=st.lists(st.one_of(_PIECES, _TEXT), max_size=8).map("".join),
    query=st.lists(
        st.tuples(st.sampled_from([*PRESIGNED_PARAMS, "x", "AWSAccessKeyId"]), _TEXT), max_size=7
    ),
    amz_date=st.one_of(st.just("20261128T120000Z"), _TEXT),
    path=_TEXT,
)
def test_any_garbage_is_refused_with_an_s3_code_and_nothing_else(
    authorization: str, query: list[tuple[str, str]], amz_date: str, path: str
) -> None:
    headers = {"Host": "127.0.0.1:8470", "X-Amz-Date": amz_date, "X-Amz-Content-SHA256": "x"}
    if authorization:
        headers["Authorization"] = authorization
    raw_query = urlencode(query)
    sent = ("GET", f"{ENDPOINT}/{quote(path)}?{raw_query}", headers)
    with pytest.raises(SignatureRefused) as caught:
        _verify(sent)
    assert caught.value.status in (400, 403) and caught.value.code.isalnum()
