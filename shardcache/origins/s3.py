"""An S3 bucket (AWS, MinIO, any S3 API) as an origin: boto3 signs, the HTTP transport streams.

Credentials and endpoints come from boto3's standard chain; bodies are fetched with presigned
GetObject URLs over the HTTP transport, and boto3 itself only signs (on a worker thread) and
answers HEAD. Retries are the fetch policy's."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.config
import botocore.exceptions

from shardcache import checksums
from shardcache.config import OriginSpec
from shardcache.errors import (
    BadRequest,
    BucketNotFound,
    ConfigError,
    OriginChanged,
    OriginDenied,
    OriginError,
    OriginNotFound,
    OriginThrottled,
    OriginTimeout,
    OriginUnavailable,
    OriginUntrusted,
)
from shardcache.origins import s3_checksums
from shardcache.origins.base import (
    NEW_REQUEST,
    ObjectInfo,
    RequestContext,
    Timeouts,
    entity_tag,
    header_text,
)
from shardcache.origins.http import HttpStream, HttpTransport, retry_after_s
from shardcache.origins.listing import (
    ListedObject,
    Listing,
    ListQuery,
    ListVersion,
    unwrap_token,
    wrap_token,
)
from shardcache.origins.location import US_EAST_1
from shardcache.origins.receivers import ReceiverPool

log = logging.getLogger("shardcache.origins")
_NOT_FOUND = {"NoSuchKey", "404", "NotFound", "NoSuchBucket"}
_DENIED = {"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}
_CHANGED = {"PreconditionFailed", "412"}
_THROTTLED = {"SlowDown", "503", "429", "Throttling", "ThrottlingException", "RequestLimitExceeded"}
MAX_PARTS = 10_000  # S3's limit: a multipart ETag or composite claiming more is not believed
TOKEN_KIND = "s3"  # around the store's continuation tokens (`listing.wrap_token`)
PRESIGNED_URL_TTL_S = 3600  # signed per request, so only a long-stalled fill could outlive it


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
    except (ValueError, SyntaxError) as exc:  # botocore's parse of an answer that is no S3's
        raise OriginUnavailable(f"{url}: the store's answer could not be read ({exc})") from exc


def _refuses_the_part(exc: botocore.exceptions.ClientError) -> bool:
    """Whether a HEAD with PartNumber was refused for the part itself (no such part: 416, 404
    or 400 InvalidPartNumber; PartNumber not supported: 400/501), which says the layout cannot
    be derived, not that the store is failing (401, 403, 408, 429 and 5xx are raised as
    errors). An object deleted meanwhile is then found missing by its GET."""
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return status == 501 or (400 <= status < 500 and status not in (401, 403, 408, 429))


def _info(response: Mapping[str, Any], found: tuple[checksums.Checksum, ...]) -> ObjectInfo:
    """A HeadObject `response` as ObjectInfo with the whole-object checksums `found` (see
    `s3_checksums`) and, for a single-part unencrypted object, its MD5 ETag."""
    content_range = response.get("ContentRange")
    size = int(content_range.rsplit("/", 1)[1]) if content_range else int(response["ContentLength"])
    md5 = checksums.from_s3_etag(response.get("ETag"), response.get("ServerSideEncryption"))
    if md5 is not None and response.get("SSECustomerAlgorithm") is None:
        found = (*found, md5)
    modified = response.get("LastModified")
    return ObjectInfo(
        size,
        entity_tag(response.get("ETag")),
        found,
        header_text(response.get("ContentType")),
        accepts_ranges=True,
        last_modified=modified.timestamp() if modified is not None else None,
    )


def _listing(response: Mapping[str, Any], under: str) -> Listing:
    """A ListObjects(V2) `response` as a Listing of keys relative to `under` (the origin's
    prefix and its slash); a key the store returns outside it is left out."""
    objects = []
    for item in response.get("Contents", ()):
        key = str(item.get("Key", ""))
        if not key.startswith(under) or key == under:
            continue
        modified = item.get("LastModified")
        objects.append(
            ListedObject(
                key[len(under) :],
                int(item.get("Size", 0)),
                entity_tag(item.get("ETag")),
                modified.timestamp() if modified is not None else None,
            )
        )
    named = (str(p.get("Prefix", "")) for p in response.get("CommonPrefixes", ()))
    prefixes = tuple(
        name[len(under) :] for name in named if name.startswith(under) and name != under
    )
    is_truncated = bool(response.get("IsTruncated"))
    token = response.get("NextContinuationToken")
    marker = response.get("NextMarker")
    if is_truncated and marker is None:  # V1 says it only with a delimiter: the last name
        names = [o.key for o in objects] + list(prefixes)
        marker = under + max(names) if names else None
    return Listing(
        tuple(objects),
        prefixes,
        is_truncated,
        wrap_token(TOKEN_KIND, str(token)) if token else None,
        str(marker)[len(under) :] if marker and str(marker).startswith(under) else None,
    )


class S3Origin:
    def __init__(self, spec: OriginSpec, timeouts: Timeouts, receivers: ReceiverPool) -> None:
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
        try:
            self._client = boto3.session.Session().client(
                "s3", endpoint_url=spec.endpoint_url, config=config, verify=spec.ca_file
            )
        except botocore.exceptions.BotoCoreError as exc:  # AWS_PROFILE naming no profile, …
            raise ConfigError(f"origin {spec.name!r}: cannot make an S3 client: {exc}") from None
        # No follow_within: a presigned URL's redirect is never followed, to any host.
        self._transport = HttpTransport(timeouts, receivers, ca_file=spec.ca_file)

    def _object_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def url_for(self, key: str) -> str:
        url = f"s3://{self.bucket}/{self._object_key(key)}"
        # One daemon may front AWS and a MinIO with the same bucket name: keep them apart.
        return f"{url}?endpoint={self._endpoint_url}" if self._endpoint_url else url

    async def head(self, key: str, *, context: RequestContext = NEW_REQUEST) -> ObjectInfo:
        url = self.url_for(key)
        with map_botocore_errors(url):
            try:
                response = await asyncio.to_thread(self._head, key)
            except botocore.exceptions.ClientError as exc:
                await self._name_missing_bucket(url, exc)
                raise
            published = s3_checksums.published(response)
            info = _info(response, published.full)
            parts = published.parts
            if parts and (published.composites or not info.checksums):
                per_part = await asyncio.to_thread(self._per_part, key, response, published, parts)
                return dataclasses.replace(info, checksums=info.checksums + per_part)
        return info

    async def _name_missing_bucket(self, url: str, exc: Exception) -> None:
        """Raise OriginNotFound naming the bucket when a 404 (`exc`) is the bucket's, not the
        key's: a HEAD's 404 has no body to say which, so ask (HeadBucket, on this path only).
        Return otherwise, for the caller to raise its own error."""
        code = (
            str(exc.response.get("Error", {}).get("Code", ""))
            if isinstance(exc, botocore.exceptions.ClientError)
            else "404"
        )
        if code not in ("404", "NotFound", "NoSuchBucket"):
            return
        try:
            await asyncio.to_thread(self._client.head_bucket, Bucket=self.bucket)
        except botocore.exceptions.ClientError as missing:
            if str(missing.response.get("Error", {}).get("Code", "")) in _NOT_FOUND:
                raise BucketNotFound(f"{url}: no such bucket: {self.bucket}") from exc
        except (botocore.exceptions.BotoCoreError, OSError):
            return  # the bucket could not be asked about: the key's 404 stands

    def _head(self, key: str, part_number: int | None = None) -> Mapping[str, Any]:
        extra: dict[str, Any] = {"PartNumber": part_number} if part_number else {}
        return self._client.head_object(
            Bucket=self.bucket, Key=self._object_key(key), ChecksumMode="ENABLED", **extra
        )

    def _per_part(
        self, key: str, response: Mapping[str, Any], published: s3_checksums.Published, parts: int
    ) -> tuple[checksums.Checksum, ...]:
        """The per-part checksums of a multipart object (its ETag, unless encrypted, and its
        composites), when the part layout can be derived: the first and last parts' sizes
        (HEAD with PartNumber) must account for the whole length with equal parts before the
        last, as every common uploader makes them. Otherwise none (the object is then checked
        by length, and any whole-object checksum, only)."""
        size = int(response["ContentLength"])
        if parts > MAX_PARTS or parts > size:  # a part count no upload can have
            log.info(
                "%s: %d parts claimed for %d bytes; per-part checksums not used", key, parts, size
            )
            return ()
        try:
            first = int(self._head(key, 1)["ContentLength"])
            last = int(self._head(key, parts)["ContentLength"]) if parts > 1 else first
        except botocore.exceptions.ClientError as exc:
            if not _refuses_the_part(exc):
                raise  # throttled, denied, down: retried like any HEAD, never skipped
            log.info("%s: the store refused a part HEAD; per-part checksums not used", key)
            return ()
        if not 0 < last <= first or first * (parts - 1) + last != size:
            log.info("%s: multipart layout not derivable; its per-part checksums are not used", key)
            return ()
        found = published.per_part(parts, first)
        etag = response.get("ETag")
        if etag and published.etag_parts == parts and response.get("SSECustomerAlgorithm") is None:
            md5 = checksums.from_s3_multipart_etag(
                etag, first, response.get("ServerSideEncryption")
            )
            found = (*found, md5) if md5 is not None else found
        return found

    async def open(
        self,
        key: str,
        start: int = 0,
        end: int | None = None,
        if_match: str | None = None,
        *,
        context: RequestContext = NEW_REQUEST,
    ) -> HttpStream:
        label = self.url_for(key)
        with map_botocore_errors(label):
            url = await asyncio.to_thread(
                self._client.generate_presigned_url,
                "get_object",
                Params={"Bucket": self.bucket, "Key": self._object_key(key)},
                ExpiresIn=PRESIGNED_URL_TTL_S,
            )
        try:
            return await self._transport.get(
                url, label, start, end, if_match, context.is_continuing
            )
        except OriginNotFound as exc:
            with map_botocore_errors(label):
                await self._name_missing_bucket(label, exc)
            raise

    async def list_objects(self, query: ListQuery) -> Listing:
        """One page of the bucket's keys under this origin's prefix, asked of the store as
        the client asked (ListObjectsV2 or V1), with the keys made the origin's own again."""
        under = f"{self.prefix}/" if self.prefix else ""
        params: dict[str, Any] = {
            "Bucket": self.bucket,
            "Prefix": under + query.prefix,
            "MaxKeys": query.max_keys,
        }
        if query.delimiter:
            params["Delimiter"] = query.delimiter
        if query.version is ListVersion.V2:
            if query.token:
                params["ContinuationToken"] = unwrap_token(TOKEN_KIND, query.token)
            if query.start_after:
                params["StartAfter"] = under + query.start_after
            call: Callable[..., Mapping[str, Any]] = self._client.list_objects_v2
        else:
            if query.start_after:
                params["Marker"] = under + query.start_after
            call = self._client.list_objects
        label = f"s3://{self.bucket}/{params['Prefix']}"
        with map_botocore_errors(label):
            try:
                response = await asyncio.to_thread(call, **params)
            except botocore.exceptions.ClientError as exc:
                await self._name_missing_bucket(label, exc)
                if str(exc.response.get("Error", {}).get("Code", "")) == "InvalidArgument":
                    raise BadRequest(f"{label}: the store refused the listing: {exc}") from None
                raise
        return _listing(response, under)

    async def bucket_location(self) -> str:
        """The bucket's `LocationConstraint`, asked of the store (GetBucketLocation, with the
        daemon's credentials) as given: us-east-1's is empty. Raises BucketNotFound for a
        missing bucket, or the OriginError its failure maps to."""
        label = f"s3://{self.bucket}"
        with map_botocore_errors(label):
            try:
                response = await asyncio.to_thread(
                    self._client.get_bucket_location, Bucket=self.bucket
                )
            except botocore.exceptions.ClientError as exc:
                if str(exc.response.get("Error", {}).get("Code", "")) in _NOT_FOUND:
                    raise BucketNotFound(f"{label}: no such bucket: {self.bucket}") from exc
                raise
        return str(response.get("LocationConstraint") or US_EAST_1)

    async def aclose(self) -> None:
        await self._transport.aclose()
        await asyncio.to_thread(self._client.close)
