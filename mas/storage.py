"""Where finished videos live, so every host can read them: a folder, or an S3-compatible bucket.

The gpu worker renders into a local staging file and `put`s it under a key (`batch-1/video-3-attempt-1.mp4`);
the database keeps the stored file's location (`location`: a path in the folder, or `s3://bucket/key`), and
whoever reads a video (`mas videos`, the gallery, grading, the taste model) asks for a local copy
(`local_file`): the folder's own file, or one downloaded once into this host's cache. With `MAS_STORAGE_URL`
unset the folder is `MAS_OUTPUT_DIR` (a shared mount where hosts share it); `s3://bucket/prefix` stores
objects through boto3, and no host needs a shared folder.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from mas.config import Settings
from mas.errors import InvalidSettings, PeerUnavailable
from mas.singletons import per_process


class StorageUnavailable(PeerUnavailable):
    """The bucket could not be reached or answered an error that may pass (5xx, a timeout)."""


class StorageRefused(InvalidSettings):
    """The bucket refused the studio (wrong keys, no such bucket, no permission): settings to fix."""


REFUSALS = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchBucket", "403"}


def _failed(action: str, exc: BaseException) -> StorageUnavailable | StorageRefused:
    cause: BaseException | None = exc  # boto3's upload error keeps the server's answer in its context
    while cause is not None and not hasattr(cause, "response"):
        cause = cause.__cause__ or cause.__context__
    code = getattr(cause, "response", {}).get("Error", {}).get("Code", "")
    kind = StorageRefused if code in REFUSALS else StorageUnavailable
    return kind(f"cannot {action}: {exc}")


class Storage(Protocol):
    def staging(self, key: str) -> Path:
        """Where the gpu worker writes the file before `put` (a local path; its folder exists)."""

    def put(self, local: Path, key: str) -> str:
        """Store the finished file `local` under `key`; returns its location (what the database keeps)."""

    def key_of(self, location: str) -> str | None:
        """The key of a stored location, or None when it is not one of this storage's (outside its folder)."""

    def local_file(self, key: str) -> Path | None:
        """A readable local copy of `key`, or None when nothing is stored under it."""

    def exists(self, key: str) -> bool:
        """Whether something is stored under `key`, without copying it here (a page listing videos)."""

    def where(self) -> str:
        """For people: where videos are stored."""

    @property
    def staging_root(self) -> Path:
        """The local folder under which `staging` paths (and a render's partial files) lie."""


def _safe_key(key: str) -> bool:
    parts = key.split("/")
    return bool(key) and not key.startswith("/") and all(part not in ("", ".", "..") for part in parts)


@dataclass(frozen=True)
class FolderStorage:
    """Videos in a folder of this host (shared between hosts by a mount, where hosts share it)."""

    root: Path

    def staging(self, key: str) -> Path:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def put(self, local: Path, key: str) -> str:
        target = self.staging(key)
        if local != target:
            os.replace(local, target)
        return str(target)

    def key_of(self, location: str) -> str | None:
        """Links followed: a location whose real file lies outside the folder is not this storage's."""
        try:
            path = Path(location).resolve()
        except (ValueError, OSError, RuntimeError):  # a NUL byte; a link loop (RuntimeError before 3.13)
            return None
        return path.relative_to(self.root).as_posix() if path.is_relative_to(self.root) else None

    def local_file(self, key: str) -> Path | None:
        if not _safe_key(key) or self.key_of(str(self.root / key)) is None:
            return None
        path = (self.root / key).resolve()
        return path if path.is_file() else None

    def exists(self, key: str) -> bool:
        return self.local_file(key) is not None

    def where(self) -> str:
        return f"under {self.root}"

    @property
    def staging_root(self) -> Path:
        return self.root


class S3Storage:
    """Videos as objects of an S3-compatible bucket; reads are cached under this host's data folder."""

    def __init__(self, *, bucket: str, prefix: str, cache: Path, client) -> None:
        self.bucket, self.prefix, self.cache, self.client = bucket, prefix.strip("/"), cache, client

    def _object(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def staging(self, key: str) -> Path:
        path = self.cache / key
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def put(self, local: Path, key: str) -> str:
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.upload_file(str(local), self.bucket, self._object(key), ExtraArgs={"ContentType": "video/mp4"})
        except (BotoCoreError, ClientError, S3UploadFailedError) as exc:
            raise _failed(f"store {key} in s3://{self.bucket}", exc) from exc
        cached = self.staging(key)
        if local != cached:
            os.replace(local, cached)
        return f"s3://{self.bucket}/{self._object(key)}"

    def key_of(self, location: str) -> str | None:
        head = f"s3://{self.bucket}/{self.prefix + '/' if self.prefix else ''}"
        key = location[len(head) :] if location.startswith(head) else ""
        return key if _safe_key(key) else None

    def local_file(self, key: str) -> Path | None:
        from botocore.exceptions import BotoCoreError, ClientError

        if not _safe_key(key):
            return None
        cached = self.cache / key
        if cached.is_file():
            return cached
        cached.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=cached.parent, suffix=".download")
        os.close(handle)
        try:
            self.client.download_file(self.bucket, self._object(key), partial)
            os.replace(partial, cached)
        except ClientError as exc:
            if _not_found(exc):
                return None
            raise _failed(f"read {key} from s3://{self.bucket}", exc) from exc
        except BotoCoreError as exc:
            raise _failed(f"read {key} from s3://{self.bucket}", exc) from exc
        finally:
            Path(partial).unlink(missing_ok=True)
        return cached

    def exists(self, key: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        if not _safe_key(key):
            return False
        if (self.cache / key).is_file():
            return True
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._object(key))
        except ClientError as exc:
            if _not_found(exc):
                return False
            raise _failed(f"look for {key} in s3://{self.bucket}", exc) from exc
        except BotoCoreError as exc:
            raise _failed(f"look for {key} in s3://{self.bucket}", exc) from exc
        return True

    def where(self) -> str:
        return f"in s3://{self.bucket}/{self.prefix}"

    @property
    def staging_root(self) -> Path:
        return self.cache


def video_key(*, batch_id: int, video_id: int, attempt: int) -> str:
    """One attempt's file, the same on every host and in every storage."""
    return f"batch-{batch_id}/video-{video_id}-attempt-{attempt}.mp4"


def storage(settings: Settings) -> Storage:
    """The storage `settings` name (one S3 client per process and bucket)."""
    if not settings.storage.url:
        return FolderStorage(settings.videos_dir)
    return _s3(settings)


@per_process(key=lambda settings: (settings.storage.url, settings.storage.s3_endpoint_url, settings.data_dir))
def _s3(settings: Settings) -> S3Storage:
    parts = urlsplit(settings.storage.url or "")
    if parts.scheme != "s3" or not parts.netloc:
        raise InvalidSettings("MAS_STORAGE_URL must be s3://BUCKET[/PREFIX] (or unset for the output folder)")
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise InvalidSettings("MAS_STORAGE_URL=s3://... needs boto3: pip install 'mas[s3]'") from exc
    secret = settings.storage.s3_secret_access_key
    client = boto3.client(
        "s3",
        endpoint_url=settings.storage.s3_endpoint_url,
        region_name=settings.storage.s3_region,
        aws_access_key_id=settings.storage.s3_access_key_id,
        aws_secret_access_key=secret.get_secret_value() if secret else None,
        config=Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"},
            retries={"mode": "standard", "max_attempts": 8},
            connect_timeout=5,
            read_timeout=60,
        ),
    )
    return S3Storage(
        bucket=parts.netloc, prefix=parts.path, cache=settings.data_dir / "cache" / "videos", client=client
    )


def local_copy(settings: Settings, location: str | None) -> Path | None:
    """A readable local file of a stored video (downloaded once where the storage is a bucket), or None
    when the location is not the storage's or nothing is stored there."""
    if not location:
        return None
    store = storage(settings)
    key = store.key_of(location)
    return None if key is None else store.local_file(key)


def _not_found(exc: Exception) -> bool:
    """An S3 error that says the object is not there (which is an answer, not a failure)."""
    code = getattr(exc, "response", {}).get("Error", {}).get("Code")
    return code in ("404", "NoSuchKey", "NotFound")
