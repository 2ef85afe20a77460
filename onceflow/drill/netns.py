"""Network namespaces for the partition drill and tests: workers on hosts of their own, and cuts.

`NetworkLab` makes a bridge in the root namespace holding the services' address (PostgreSQL,
Temporal and the billing service listen there, besides loopback), and one namespace per worker,
joined to the bridge by a veth pair, with an address of its own. `cut(worker, ports)` drops, inside
that worker's namespace, every packet to or from the services' address on those ports (nftables,
both directions), so the worker's connections neither answer nor close: no FIN, no RST, as when a
host's network goes. `heal(worker)` removes the rules; the same TCP connections carry on if both
ends still hold them. Everything is made by the lab and removed by `close()`; only loopback and the
lab's own private addresses are used.

Needs root (CAP_NET_ADMIN), `ip` and `nft`; `unavailable()` says why not, for a skip with a reason.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass

IP = shutil.which("ip") or "/usr/sbin/ip"
NFT = shutil.which("nft") or "/usr/sbin/nft"
_TABLE = "onceflow_cut"
_LABS = itertools.count()


class NetworkLabError(RuntimeError):
    """A namespace, link or rule could not be made; the message has the command and its error."""


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetworkLabError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); CI runs as root"
    for tool, path in (("ip (iproute2)", IP), ("nft (Debian's nftables)", NFT)):
        if not os.path.exists(path):
            return f"{tool} is not installed (.ci/run installs it)"
    probe = f"ofprobe{os.getpid() % 100000}"
    try:
        _run(IP, "netns", "add", probe)
        _run(IP, "netns", "exec", probe, NFT, "list", "tables")
    except NetworkLabError as exc:
        return f"cannot make a network namespace with nftables here: {exc}"
    finally:
        subprocess.run([IP, "netns", "del", probe], capture_output=True, timeout=30)
    return None


@dataclass
class Host:
    """One worker's namespace and its address."""

    name: str
    namespace: str
    address: str
    cut_ports: tuple[int, ...] = ()

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside this namespace."""
        return [IP, "netns", "exec", self.namespace, *argv]


class NetworkLab:
    """A bridge with the services' address and a namespace per worker; `close()` removes them all."""

    def __init__(self) -> None:
        pid, number = os.getpid(), next(_LABS)
        self.tag = f"{pid % 100000}{chr(ord('a') + number % 26)}"  # names stay under 16 characters
        # A /24 of 10.0.0.0/8 picked by the process id and the lab's number, so that labs of
        # parallel processes, or one just removed, do not meet.
        self.prefix = f"10.{200 + pid % 50}.{(pid // 50 + number) % 250}"
        self.bridge = f"ofb{self.tag}"
        self.service_address = f"{self.prefix}.1"
        self.hosts: dict[str, Host] = {}
        self._up = False

    def open(self) -> NetworkLab:
        _run(IP, "link", "add", "name", self.bridge, "type", "bridge")
        self._up = True
        _run(IP, "addr", "add", f"{self.service_address}/24", "dev", self.bridge)
        _run(IP, "link", "set", self.bridge, "up")
        return self

    def add_host(self, name: str) -> Host:
        index = len(self.hosts) + 1
        namespace = f"of{self.tag}h{index}"
        outside, inside = f"ofv{self.tag}h{index}", f"ofi{self.tag}h{index}"
        address = f"{self.prefix}.{10 + index}"
        _run(IP, "netns", "add", namespace)
        host = Host(name, namespace, address)
        self.hosts[name] = host
        _run(IP, "link", "add", outside, "type", "veth", "peer", "name", inside)
        _run(IP, "link", "set", inside, "netns", namespace)
        _run(IP, "link", "set", outside, "master", self.bridge, "up")
        _run(*host.command([IP, "addr", "add", f"{address}/24", "dev", inside]))
        _run(*host.command([IP, "link", "set", inside, "up"]))
        _run(*host.command([IP, "link", "set", "lo", "up"]))
        return host

    def cut(self, name: str, ports: tuple[int, ...]) -> None:
        """Drop everything between the host and the services' address on these TCP ports."""
        host = self.hosts[name]
        self.heal(name)
        wanted = "{ " + ", ".join(str(p) for p in ports) + " }"
        rules = (
            f"add table inet {_TABLE}\n"
            f"add chain inet {_TABLE} out {{ type filter hook output priority 0; policy accept; }}\n"
            f"add chain inet {_TABLE} in {{ type filter hook input priority 0; policy accept; }}\n"
            f"add rule inet {_TABLE} out ip daddr {self.service_address} tcp dport {wanted} drop\n"
            f"add rule inet {_TABLE} in ip saddr {self.service_address} tcp sport {wanted} drop\n"
        )
        done = subprocess.run(
            host.command([NFT, "-f", "-"]), input=rules, capture_output=True, text=True, timeout=30
        )
        if done.returncode != 0:
            raise NetworkLabError(f"nft in {host.namespace}: {done.stderr.strip()}")
        host.cut_ports = ports

    def heal(self, name: str) -> None:
        host = self.hosts[name]
        subprocess.run(
            host.command([NFT, "delete", "table", "inet", _TABLE]), capture_output=True, timeout=30
        )
        host.cut_ports = ()

    def close(self) -> None:
        for host in self.hosts.values():
            subprocess.run([IP, "netns", "del", host.namespace], capture_output=True, timeout=30)
        self.hosts.clear()
        if self._up:
            subprocess.run([IP, "link", "del", self.bridge], capture_output=True, timeout=30)
            self._up = False

    def __enter__(self) -> NetworkLab:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


class TcpRelay:
    """Forwards connections from (host, port) to (target_host, target_port), byte for byte.

    The Temporal dev server serves only on loopback reliably (with `--ip` set to another address its
    own services dial each other on loopback and fail), so the partition drill leaves it there and
    relays the lab's address to it. A cut on the relay's port then stalls a worker's connections to
    Temporal exactly as it would stall them to the server itself."""

    def __init__(self, host: str, port: int, target_host: str, target_port: int) -> None:
        self.host, self.port = host, port
        self.target = (target_host, target_port)
        self._server: asyncio.AbstractServer | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> TcpRelay:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.ensure_future(_pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        sink.close()
