"""Several hosts on one machine, for tests that spread the studio over a network and break it.

Host A is this machine's root network namespace: it runs the servers listening on `Network.gateway`. Hosts B,
C, ... (`Network.host`) are Linux network namespaces joined to A by veth pairs on a bridge, with no route
anywhere else. A process started on such a host (`Host.popen`) also gets a private mount namespace in which a
tmpfs hides the "hosts root" folder: it sees only its own folder there (`Host.root`, kept between its processes
in `Host.storage`), never A's or another host's, as if the hosts shared no filesystem. The code and the venv
stay visible everywhere.

Faults to inject: `Host.cut` / `Host.heal` (the host's cable pulled and plugged back). Everything needs root
(`processes.namespaces_available` says why not). Everything made is removed on exit, even after a failure; what
a killed test run left behind is removed by the next `Network` (its names carry the pid of the process that
made it).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from tests.harness.processes import namespaces_available, pid_alive, run, tool, wait_for

HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,15}")
_SUBNET_PREFIX = "10.213"  # 10.213.Y.0/24: Y picked free per Network
_OURS = re.compile(r"mh([0-9a-f]+)n[0-9a-f]+")  # bridge mh<pid>n<seq>, veths and netns named after it
_OURS_LINK = re.compile(r"mh([0-9a-f]+)n[0-9a-f]+(v\d+)?")  # the bridge and its veths
_networks_made = 0

Stream = int | IO[Any] | None


def _kill_netns_processes(netns: str) -> None:
    """SIGKILL every process still in network namespace `netns` (daemons that left their process group)."""
    pids = run(["ip", "netns", "pids", netns], check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def remove_leftovers() -> None:
    """Remove the namespaces, bridges and veths that a Network of a process no longer alive left behind."""
    for line in run(["ip", "netns", "list"], check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if (match := _OURS.match(name)) and not pid_alive(int(match.group(1), 16)):
            _kill_netns_processes(name)
            run(["ip", "netns", "del", name], check=False)
    for line in run(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
        fields = line.split(":")
        name = fields[1].strip().split("@")[0] if len(fields) > 1 else ""
        if (match := _OURS_LINK.fullmatch(name)) and not pid_alive(int(match.group(1), 16)):
            run(["ip", "link", "del", name], check=False)
    for folder in Path(tempfile.gettempdir()).glob("mas-mh*-*"):  # the hosts' storage
        if (match := _OURS.match(folder.name[len("mas-") :])) and not pid_alive(int(match.group(1), 16)):
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
        run(["ip", "netns", "add", self.netns])
        run(["ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns])
        run(["ip", "-n", self.netns, "addr", "add", f"{self.address}/{net.subnet.prefixlen}", "dev", "eth0"])
        run(["ip", "-n", self.netns, "link", "set", "lo", "up"])
        run(["ip", "-n", self.netns, "link", "set", "eth0", "up"])
        run(["ip", "link", "set", self.veth, "master", net.bridge])
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
        run(["ip", "link", "set", self.veth, "down"])

    def heal(self, timeout: float = 10) -> None:
        """Plug the cable back and wait until the bridge forwards the host's packets again. Neighbour entries
        that failed while the cable was out are forgotten on both sides, so the first packet asks again instead
        of meeting "no route to host"."""
        run(["ip", "link", "set", self.veth, "up"])
        wait_for(self._forwarding, timeout=timeout, what=f"host {self.name}'s link to come up")
        run(["ip", "-n", self.netns, "neigh", "flush", "all"], check=False)
        run(["ip", "neigh", "flush", "dev", self.network.bridge], check=False)

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
        self.tools = {name: tool(name) for name in ("ip", "unshare", "mount", "mkdir")}
        remove_leftovers()
        self._made = True
        try:
            self.hosts_root.mkdir(parents=True, exist_ok=True)
            self.storage = Path(tempfile.mkdtemp(prefix=f"mas-{self.bridge}-"))
            run(["ip", "link", "add", self.bridge, "type", "bridge", "forward_delay", "0", "stp_state", "0"])
            self._claim_subnet()
            run(["ip", "link", "set", self.bridge, "up"])
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
        for line in run(["ip", "-o", "-4", "addr", "show"]).stdout.splitlines():
            fields = line.split()
            if fields[1] != self.bridge and "inet" in fields:
                used.add(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network)
        for line in run(["ip", "-4", "route", "show", "table", "all"]).stdout.splitlines():
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
            run(["ip", "addr", "add", gateway, "dev", self.bridge])
            if any(subnet.overlaps(used) for used in self._used_subnets()):
                run(["ip", "addr", "del", gateway, "dev", self.bridge], check=False)
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
            run(["ip", "link", "del", host.veth], check=False)
            run(["ip", "netns", "del", host.netns], check=False)
        run(["ip", "link", "del", self.bridge], check=False)
        if self.storage != Path():
            shutil.rmtree(self.storage, ignore_errors=True)
        self.hosts.clear()
        self._made = False
