"""Redis over TLS: Debian's redis-server on a TLS port with a certificate of a CA made here, the studio given
a `rediss://` URL that names the CA. The broker, the result backend, the studio's own clients and
`mas up` all verify the server; a URL without the CA is refused by the server's certificate check."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.harness.processes import redis_server_available
from tests.harness.redis_servers import RedisServer
from tests.parts import need
from tests.studio import ROOT, IsolatedStudio


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it (openssl)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=studio test CA",
            "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
            "-out", "server.csr")  # fmt: skip
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "ext.cnf", "-out", "server.pem")  # fmt: skip
    return folder / "ca.pem", folder / "server.pem", folder / "server.key"


@pytest.fixture
def tls_redis(tmp_path):
    need("TLS", redis_server_available())
    need("TLS", None if shutil.which("openssl") else "no openssl to make certificates")
    ca, cert, key = _certificates(tmp_path)
    with RedisServer(tmp_path / "redis", tls=(ca, cert, key)) as server:
        yield server.url, ca


def test_a_batch_runs_with_its_broker_over_tls_and_an_unverified_server_is_refused(tls_redis):
    url, ca = tls_redis
    verified = f"{url}?ssl_cert_reqs=required&ssl_ca_certs={ca}"
    with tempfile.TemporaryDirectory() as tmp, IsolatedStudio(Path(tmp), MAS_BROKER_URL=verified) as studio:
        up = studio.mas("up")
        assert up.returncode == 0, up.stderr
        studio.worker("cpu")
        studio.worker("gpu")
        done = studio.mas("enqueue", "--wait", "Create 2 videos of tide pools")
        assert done.returncode == 0, done.stdout + done.stderr
        batch_id = int(done.stdout.split()[1].rstrip(":"))
        assert len(studio.videos(batch_id)) == 2
        status = studio.mas("status")
        assert status.returncode == 0 and "gpu queue:" in status.stdout, status.stderr
        assert url.split(":")[2].split("@")[0] not in up.stdout + done.stdout + status.stdout  # no password shown

        unverified = {**studio.env, "MAS_BROKER_URL": f"{url}?ssl_cert_reqs=required"}  # the system CAs only
        refused = subprocess.run(
            [sys.executable, "-m", "mas.cli", "up"],
            env=unverified,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode != 0
        assert "certificate verify failed" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
