"""An S3 bucket (AWS, MinIO, any S3 API) as an origin: boto3 signs, the HTTP transport streams.

Credentials and endpoints come from boto3's standard chain (`AWS_ENDPOINT_URL[_S3]`,
`AWS_REGION`, profiles, instance roles); a per-origin `endpoint_url` overrides the endpoint.
boto3 is blocking and its body reads copy through urllib3 on a thread per read, which capped
the S3 path near 0.3 GB/s on two cores; so bodies are fetched with a presigned GetObject URL
over the same transport as HTTP origins (Range and If-Match are plain headers), and
boto3 itself only signs (on a worker thread: it may refresh credentials) and answers HEAD
(HeadObject with ChecksumMode, for the full-object checksums). Retries are `fill`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.config
import botocore.exceptions

from shardcache import checksums
from shardcache.config import OriginSpec
from shardcache.errors import (
    OriginChanged,
    OriginDenied,
    OriginError,
    OriginNotFound,
    OriginThrottled,
    OriginTimeout,
    OriginUnavailable,
    OriginUntrusted,
)
from shardcache.origins import Timeouts
from shardcache.origins.base import ObjectInfo, header_text
from shardcache.origins.http import HttpStream, HttpTransport, retry_after_s

log = logging.getLogger("shardcache.origins")
_NOT_FOUND = {"NoSuchKey", "404", "NotFound", "NoSuchBucket"}
_DENIED = {"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}
_CHANGED = {"PreconditionFailed", "412"}
_THROTTLED = {"SlowDown", "503", "429", "Throttling", "ThrottlingException", "RequestLimitExceeded"}
PRESIGNED_URL_TTL_S = 3600  # signed per request, so only a long-stalled fill could outlive it
_CHECKSUM_FIELDS = {
    "ChecksumSHA256": "sha256",
    "ChecksumSHA1": "sha1",
    "ChecksumCRC32": "crc32",
    "ChecksumCRC32C": "crc32c",
}


@contextlib.contextmanager
def map_botocore_errors(url: str) -> Iterator[None]:
    """Translate botocore exceptions for `url` into OriginError subclasses."""
    try:
        yield
    except OriginError:
        raise
    except botocore.exceptions.ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in _NOT_FOUND:
            raise OriginNotFound(f"{url}: {code}") from exc
        if code in _CHANGED:
            raise OriginChanged(f"{url}: ETag changed ({code})") from exc
        if code in _DENIED:
            raise OriginDenied(f"{url}: {code}") from exc
        if code in _THROTTLED:
            headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
            hint = retry_after_s(headers.get("retry-after"))
            raise OriginThrottled(f"{url}: {code} (slow down)", hint) from exc
        raise OriginUnavailable(f"{url}: {code or exc}") from exc
    except (botocore.exceptions.ConnectTimeoutError, botocore.exceptions.ReadTimeoutError) as exc:
        raise OriginTimeout(f"{url}: timed out") from exc
    except botocore.exceptions.NoCredentialsError as exc:
        raise OriginDenied(f"{url}: no AWS credentials found") from exc
    except botocore.exceptions.SSLError as exc:
        raise OriginUntrusted(
            f"{url}: TLS certificate not trusted ({exc}); trust its CA with the origin's "
            "ca_file or AWS_CA_BUNDLE"
        ) from exc
    except (botocore.exceptions.BotoCoreError, OSError) as exc:
        raise OriginUnavailable(f"{url}: {exc}") from exc


def _info(response: Mapping[str, Any], full: bool) -> ObjectInfo:
    content_range = response.get("ContentRange")
    size = int(content_range.rsplit("/", 1)[1]) if content_range else int(response["ContentLength"])
    found: list[checksums.Checksum] = []
    if full:
        if response.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT":
            for field, algorithm in _CHECKSUM_FIELDS.items():
                value = response.get(field)
                if value and "-" not in value:
                    found += checksums.from_headers({f"x-amz-checksum-{algorithm}": value})
        md5 = checksums.from_s3_etag(response.get("ETag"), response.get("ServerSideEncryption"))
        if md5 is not None and response.get("SSECustomerAlgorithm") is None:
            found.append(md5)
    modified = response.get("LastModified")
    return ObjectInfo(
        size,
        header_text(response.get("ETag")),
        tuple(found),
        header_text(response.get("ContentType")),
        accepts_ranges=True,
        last_modified=modified.timestamp() if modified is not None else None,
    )


class S3Origin:
    def __init__(self, spec: OriginSpec, timeouts: Timeouts) -> None:
        self.name = spec.name
        parts = urlsplit(spec.url)
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self._endpoint_url = spec.endpoint_url
        config = botocore.config.Config(
            connect_timeout=timeouts.connect_s,
            read_timeout=timeouts.read_s,
            retries={"total_max_attempts": 1},
            max_pool_connections=64,
        )
        # Sessions are not thread-safe but clients are: build the client once, here.
        # `ca_file` for both halves: boto3 (HEAD, signing) reads AWS_CA_BUNDLE or certifi's
        # bundle, the transport (bodies) the system's and SSL_CERT_FILE; an origin's own CAs
        # to both.
        self._client = boto3.session.Session().client(
            "s3", endpoint_url=spec.endpoint_url, config=config, verify=spec.ca_file
        )
        # No follow_within: a presigned URL's redirect is never followed, to any host.
        self._transport = HttpTransport(timeouts, ca_file=spec.ca_file)

    def _object_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def url_for(self, key: str) -> str:
        url = f"s3://{self.bucket}/{self._object_key(key)}"
        # One daemon may front AWS and a MinIO with the same bucket name: keep them apart.
        return f"{url}?endpoint={self._endpoint_url}" if self._endpoint_url else url

    async def head(self, key: str) -> ObjectInfo:
        url = self.url_for(key)
        with map_botocore_errors(url):
            response = await asyncio.to_thread(self._head, key)
            info = _info(response, full=True)
            parts = checksums.multipart_etag_parts(info.etag)
            encrypted = response.get("ServerSideEncryption") not in (None, "", "AES256")
            if parts and not info.checksums and not encrypted:
                found = await asyncio.to_thread(self._multipart_checksum, key, info, parts)
                if found is not None:
                    return dataclasses.replace(info, checksums=(found,))
        return info

    def _head(self, key: str, part_number: int | None = None) -> Mapping[str, Any]:
        extra: dict[str, Any] = {"PartNumber": part_number} if part_number else {}
        return self._client.head_object(
            Bucket=self.bucket, Key=self._object_key(key), ChecksumMode="ENABLED", **extra
        )

    def _multipart_checksum(
        self, key: str, info: ObjectInfo, parts: int
    ) -> checksums.Checksum | None:
        """The multipart ETag as a checksum, when the part layout can be derived: the first
        and last parts' sizes (HEAD with PartNumber) must account for the whole length with
        equal parts before the last, as every common uploader makes them. Otherwise None
        (the object is then checked by length only)."""
        assert info.etag is not None
        first = int(self._head(key, 1)["ContentLength"])
        last = int(self._head(key, parts)["ContentLength"]) if parts > 1 else first
        if not 0 < last <= first or first * (parts - 1) + last != info.size_bytes:
            log.info("%s: multipart layout not derivable; checking the length only", key)
            return None
        return checksums.from_s3_multipart_etag(info.etag, first)

    async def open(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> HttpStream:
        label = self.url_for(key)
        with map_botocore_errors(label):
            url = await asyncio.to_thread(
                self._client.generate_presigned_url,
                "get_object",
                Params={"Bucket": self.bucket, "Key": self._object_key(key)},
                ExpiresIn=PRESIGNED_URL_TTL_S,
            )
        return await self._transport.get(url, label, start, end, if_match)

    async def aclose(self) -> None:
        await self._transport.aclose()
        await asyncio.to_thread(self._client.close)
