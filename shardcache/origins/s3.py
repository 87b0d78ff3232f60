"""An S3 bucket (AWS, MinIO, any S3 API) as an origin, through boto3 on worker threads.

boto3 is blocking, so every call and every body read is one `asyncio.to_thread` hop, reading
large parts. Credentials and endpoints come from boto3's standard chain (`AWS_ENDPOINT_URL[_S3]`,
`AWS_REGION`, profiles); a per-origin `endpoint_url` overrides the endpoint. Retries are done by
`fill` (which resumes with Range), so botocore's own retries are off.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
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
    OriginTimeout,
    OriginUnavailable,
)
from shardcache.origins import Timeouts
from shardcache.origins.base import CHUNK_BYTES, ObjectInfo

_NOT_FOUND = {"NoSuchKey", "404", "NotFound", "NoSuchBucket"}
_DENIED = {"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}
_CHANGED = {"PreconditionFailed", "412"}
_CHECKSUM_FIELDS = {"ChecksumSHA256": "sha256", "ChecksumSHA1": "sha1", "ChecksumCRC32": "crc32"}


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
        raise OriginUnavailable(f"{url}: {code or exc}") from exc
    except (botocore.exceptions.ConnectTimeoutError, botocore.exceptions.ReadTimeoutError) as exc:
        raise OriginTimeout(f"{url}: timed out") from exc
    except botocore.exceptions.NoCredentialsError as exc:
        raise OriginDenied(f"{url}: no AWS credentials found") from exc
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
    return ObjectInfo(
        size, response.get("ETag"), tuple(found), response.get("ContentType"), accepts_ranges=True
    )


class S3Stream:
    def __init__(self, info: ObjectInfo, body: Any, url: str) -> None:
        self.info = info
        self._body = body
        self._url = url

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            with map_botocore_errors(self._url):
                chunk: bytes = await asyncio.to_thread(self._body.read, CHUNK_BYTES)
            if not chunk:
                return
            yield chunk

    async def aclose(self) -> None:
        await asyncio.to_thread(self._body.close)


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
        self._client = boto3.session.Session().client(
            "s3", endpoint_url=spec.endpoint_url, config=config
        )

    def _object_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def url_for(self, key: str) -> str:
        url = f"s3://{self.bucket}/{self._object_key(key)}"
        # One daemon may front AWS and a MinIO with the same bucket name: keep them apart.
        return f"{url}?endpoint={self._endpoint_url}" if self._endpoint_url else url

    async def head(self, key: str) -> ObjectInfo:
        url = self.url_for(key)
        with map_botocore_errors(url):
            response = await asyncio.to_thread(
                self._client.head_object,
                Bucket=self.bucket,
                Key=self._object_key(key),
                ChecksumMode="ENABLED",
            )
        return _info(response, full=True)

    async def open(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> S3Stream:
        url = self.url_for(key)
        request: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._object_key(key),
            "ChecksumMode": "ENABLED",
        }
        if start or end is not None:
            request["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        if if_match is not None:
            request["IfMatch"] = if_match
        with map_botocore_errors(url):
            response = await asyncio.to_thread(self._client.get_object, **request)
        info = _info(response, full="Range" not in request)
        if if_match is not None and info.etag not in (None, if_match):
            response["Body"].close()
            raise OriginChanged(f"{url}: ETag changed from {if_match} to {info.etag}")
        return S3Stream(info, response["Body"], url)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._client.close)
