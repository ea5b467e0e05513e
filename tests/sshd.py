"""A real OpenSSH server on 127.0.0.1 for the tests, and a TCP relay that can cut its connections.

The server gets its own generated host key and user key, a known_hosts that holds exactly its key,
a high port, and runs in its own session, so the fixture ends it (and only it) when done.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import free_port
from tests.helpers.procs import end_group

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def keygen(path: Path, kind: str = "ed25519") -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "eagleflow-test", "-f", str(path)], check=True)


@dataclass
class Sshd:
    dir: Path
    port: int
    proc: subprocess.Popen
    user_key: Path
    known_hosts: Path
    argv: list[str] = field(default_factory=list)

    def host_overrides(self, port: int | None = None, **extra: object) -> dict[str, object]:
        """Run-config overrides that send the host to this server (or to a relay in front of it)."""
        return {
            "host.kind": "ssh",
            "host.name": "loopback",
            "host.address": "127.0.0.1",
            "host.port": port or self.port,
            "host.key_path": str(self.user_key),
            "host.known_hosts": str(self.known_hosts),
            **extra,
        }

    def trust_port(self, port: int) -> None:
        """Add the server's key for another port (a relay in front of it) to known_hosts."""
        entry = self.known_hosts.read_text().splitlines()[0].split(maxsplit=1)[1]
        with open(self.known_hosts, "a") as f:
            f.write(f"[127.0.0.1]:{port} {entry}\n")

    def restart(self, down_s: float) -> None:
        """Stop the listener, stay down `down_s`, start it again on the same port with the same keys: what an
        sshd restart or upgrade does (sessions it already forked live in sessions of their own)."""
        self.stop()
        time.sleep(down_s)
        self.proc = _listen(self.argv, self.dir, self.port)

    def stop(self) -> None:
        end_group(self.proc, grace_s=10)


# The test run's machine-wide settings (`make test` exports them: OpenMP threads that wait without spinning, vLLM's
# CPU engine unpinned, in two processes instead of three, its core forked, one preflight cache for the run). An
# SSH session starts with a clean environment, so the loopback host gets them as a host's administrator would set
# them, in sshd's own SetEnv; a stage's `host.env` still comes on top.
# PYTHONPATH too, when the run sets it: a second checkout of the project (a git worktree) sharing the first one's
# environments, whose editable install points at the first.
RUN_SETTINGS = (
    "OMP_WAIT_POLICY",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "EAGLEFLOW_ENGINE_CORE_FORK",
    "EAGLEFLOW_PREFLIGHT_CACHE",
    "PYTHONPATH",
)


def run_settings() -> str:
    pairs = [f"{k}={os.environ[k]}" for k in RUN_SETTINGS if os.environ.get(k)]
    return f"SetEnv {' '.join(pairs)}\n" if pairs else ""


def start_sshd(
    base: Path, *, sftp: str | None = "internal-sftp", extra: str = "", wrap: list[str] | None = None
) -> Sshd:
    """`sftp`: the sftp subsystem's command (None: no subsystem, as on a hardened host); `extra`: more
    sshd_config lines; `wrap`: argv the sshd runs under (a mount namespace, a capability set)."""
    if not os.path.exists(SSHD):
        raise RuntimeError("sshd is not installed: apt-get install -y openssh-server (.ci/run does it)")
    base.mkdir(parents=True, exist_ok=True)
    host_key, user_key = base / "host_ed25519", base / "user_ed25519"
    keygen(host_key)
    keygen(user_key)
    (base / "authorized_keys").write_text((base / "user_ed25519.pub").read_text())
    os.chmod(base / "authorized_keys", 0o600)
    port = free_port()
    kind, key, _ = (base / "host_ed25519.pub").read_text().split(maxsplit=2)
    known_hosts = base / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {kind} {key}\n")
    config = base / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {base / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {base / 'authorized_keys'}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
        + (f"Subsystem sftp {sftp}\n" if sftp else "")
        + "LogLevel VERBOSE\nMaxStartups 100\nMaxSessions 50\n"
        + run_settings()
        + extra
    )
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    argv = [*(wrap or []), SSHD, "-D", "-e", "-f", str(config)]
    return Sshd(base, port, _listen(argv, base, port), user_key, known_hosts, argv)


def _listen(argv: list[str], base: Path, port: int) -> subprocess.Popen:
    log = open(base / "sshd.log", "ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {(base / 'sshd.log').read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if time.monotonic() > deadline:
            raise RuntimeError("sshd did not listen within 20 s")
        time.sleep(0.1)
    return proc


class Relay:
    """A TCP relay in front of sshd. `cut()` drops every open connection, as a network failure would;
    new connections are still accepted afterwards, so a retry can reconnect."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:  # the server is down (restarting): this client is refused, the next may not be
                client.close()
                continue
            with self.lock:
                self.open += [client, upstream]
                self.accepted += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> int:
        with self.lock:
            victims, self.open = self.open, []
        for s in victims:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        return len(victims) // 2

    def close(self) -> None:
        self.server.close()
        self.cut()
