"""An SSH host's link: one authenticated connection, opened on demand and again after it drops, its SFTP
session, and what an error on it means. A mixin of `SshHost` (eagleflow.hosts.ssh), which sets `config`,
`address`, `port`, `user`, `known_hosts`, `key_path`, `_client`, `_sftp` and `no_sftp`.

Host keys are verified against host.known_hosts and never added on first sight (`HostKeyError`, with the key's
fingerprint and how to trust it deliberately); a refused key is `HostAuthError`; an unreachable host is tried
`connect_attempts` times with doubling backoff (`HostUnreachable`); a login shell that prints or cannot run
commands is the host's setup, named at first contact (`HostSetupError`).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import shlex
import socket
import time

import paramiko

from eagleflow.config import HostConfig
from eagleflow.hosts.base import ConnectionLost, HostAuthError, HostError, HostKeyError, HostSetupError, HostUnreachable
from eagleflow.hosts.ssh_files import TRANSPORT_ERRORS as _TRANSPORT_ERRORS


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's form: SHA256:<base64 without padding>, as `ssh-keygen -lf` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _RefuseUnknown(paramiko.MissingHostKeyPolicy):
    """Never add a key on first sight: say which key it was and how to trust it deliberately."""

    def __init__(self, label: str, address: str, port: int, known_hosts: str):
        self.label, self.address, self.port, self.known_hosts = label, address, port, known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        scan = (
            f"ssh-keyscan -p {self.port} {shlex.quote(self.address)}"
            if self.port != 22
            else f"ssh-keyscan {shlex.quote(self.address)}"
        )
        raise HostKeyError(
            f"host {self.label} ({hostname}) offered an unknown {key.get_name()} host key {fingerprint(key)}, "
            f"which is not in {self.known_hosts} (host.known_hosts). Compare it with the host's own "
            f"(`ssh-keygen -lf /etc/ssh/ssh_host_{key.get_name().replace('ssh-', '').split('-')[0]}_key.pub` there), "
            f"then add it: {scan} >> {self.known_hosts}. Unknown keys are never accepted automatically."
        )


class SshLink:
    """The connection of `SshHost`, a mixin."""

    config: HostConfig
    address: str
    port: int
    user: str
    known_hosts: str
    key_path: str | None
    _client: paramiko.SSHClient | None
    _sftp: paramiko.SFTPClient | None
    no_sftp: bool
    name: str

    @property
    def label(self) -> str:
        return f"{self.name} ({self.user}@{self.address}:{self.port})"

    # -- connections ------------------------------------------------------------------------------

    def connect(self) -> paramiko.SSHClient:
        """A new authenticated connection; unreachable hosts are retried with backoff, nothing else is."""
        if self.key_path and not os.access(self.key_path, os.R_OK):
            raise HostAuthError(
                f"host.key_path {self.key_path} does not exist or is not readable on this machine; "
                f"point it at the private key whose public half is in {self.user}'s authorized_keys on {self.name}"
            )
        if not os.path.isfile(self.known_hosts):
            raise HostKeyError(
                f"host.known_hosts {self.known_hosts} does not exist; create it with the key of {self.label} "
                f"after verifying its fingerprint (ssh-keyscan -p {self.port} {self.address} >> {self.known_hosts})"
            )
        timeout = self.config.connect_timeout_s
        last: BaseException | None = None
        for attempt in range(self.config.connect_attempts):
            if attempt:
                time.sleep(min(2 ** (attempt - 1), 30))
            client = paramiko.SSHClient()
            client.load_host_keys(self.known_hosts)
            client.set_missing_host_key_policy(_RefuseUnknown(self.label, self.address, self.port, self.known_hosts))
            try:
                client.connect(
                    self.address,
                    port=self.port,
                    username=self.user,
                    key_filename=self.key_path,
                    allow_agent=self.key_path is None,
                    look_for_keys=False,
                    timeout=timeout,
                    banner_timeout=timeout,
                    auth_timeout=timeout,
                )
            except HostKeyError:
                client.close()
                raise
            except paramiko.BadHostKeyException as exc:
                client.close()
                raise HostKeyError(
                    f"the host key of {self.label} has CHANGED: it offered {exc.key.get_name()} "
                    f"{fingerprint(exc.key)} but {self.known_hosts} expects {fingerprint(exc.expected_key)}. "
                    "Either the host was reinstalled or this is not the host. Verify with its admin before "
                    f"replacing the entry (ssh-keygen -R '[{self.address}]:{self.port}' -f {self.known_hosts})."
                ) from None
            except paramiko.AuthenticationException as exc:
                client.close()
                how = (
                    f"key {self.key_path} (host.key_path)"
                    if self.key_path
                    else "the SSH agent's keys (no host.key_path)"
                )
                raise HostAuthError(
                    f"{self.label} refused authentication with {how}: {exc}. Add the public key to "
                    f"~{self.user}/.ssh/authorized_keys on the host, or fix host.user / host.key_path."
                ) from None
            except (OSError, EOFError, paramiko.SSHException) as exc:
                client.close()
                last = exc
                continue
            transport = client.get_transport()
            assert transport is not None
            transport.set_keepalive(15)  # a silently dead link is noticed while following a job
            try:
                self._check_login(client)
            except BaseException:
                client.close()
                raise
            return client
        raise HostUnreachable(
            f"cannot reach {self.label} after {self.config.connect_attempts} attempts: {last}. "
            "Check that the host is up and sshd listens there (host.address, host.port)."
        )

    def _check_login(self, client: paramiko.SSHClient) -> None:
        """First contact: a command that prints nothing must print nothing. A login shell whose startup files
        print (a banner in ~/.bashrc) corrupts SFTP and every answer eagleflow reads, and a shell that cannot run
        commands (nologin) never will: both are the host's setup, named now and never retried."""
        try:
            chan = client.get_transport().open_session()
            chan.settimeout(self.config.connect_timeout_s)
            chan.exec_command("true")
            out, err = chan.makefile("rb").read(), chan.makefile_stderr("rb").read()
            rc = chan.recv_exit_status()
        except _TRANSPORT_ERRORS as exc:
            raise ConnectionLost(f"connection to {self.label} lost at first contact: {exc}") from None
        if out.strip():
            said = out.decode(errors="replace").strip().splitlines()[0][:200]
            raise HostSetupError(
                self.label,
                f"the login shell of {self.user} on {self.label} prints to standard output before every command "
                f"({said!r}): SFTP and every answer eagleflow reads would be corrupted. Fix: make the shell's startup "
                "files quiet when not interactive (at the top of ~/.bashrc: `[[ $- == *i* ]] || return`), or move "
                "the message to /etc/motd, which only interactive logins show",
            )
        if rc != 0:
            said = err.decode(errors="replace").strip()[-300:] or f"exit status {rc}"
            raise HostSetupError(
                self.label,
                f"the login shell of {self.user} on {self.label} cannot run commands (`true` failed: {said!r}). "
                "Fix: give that user a shell (chsh), or set host.user to the account that runs eagleflow there",
            )

    def _conn(self) -> paramiko.SSHClient:
        if self._client is None or not (self._client.get_transport() and self._client.get_transport().is_active()):
            self.close()
            self._client = self.connect()
        return self._client

    def _sftp_client(self) -> paramiko.SFTPClient | None:
        """The SFTP session, or None where the sshd refuses the sftp subsystem (hardened hosts remove
        `Subsystem sftp`): files then go over plain commands (eagleflow.hosts.ssh_files), which any sshd runs."""
        if self.no_sftp:
            return None
        if self._sftp is None or self._client is None or not self._client.get_transport().is_active():
            client = self._conn()
            try:
                self._sftp = client.open_sftp()
            except _TRANSPORT_ERRORS as exc:
                transport = client.get_transport()
                if not isinstance(exc, paramiko.SSHException) or transport is None or not transport.is_active():
                    raise self._lost("opening SFTP", exc) from None
                # The link is up and the request was refused: no sftp subsystem. Not a lost link, not retried.
                self.no_sftp = True
                return None
        return self._sftp

    def close(self) -> None:
        for thing in (self._sftp, self._client):
            if thing is not None:
                with contextlib.suppress(Exception):
                    thing.close()
        self._sftp = self._client = None

    def _fail(self, what: str, exc: BaseException) -> HostError:
        """A remote file error (the link still up: permission, missing dir) or a lost connection."""
        transport = self._client.get_transport() if self._client is not None else None
        if (
            transport is not None
            and transport.is_active()
            and isinstance(exc, OSError)
            and not isinstance(exc, socket.timeout)
        ):
            return HostError(f"{what} on {self.label} failed: {exc}")
        return self._lost(what, exc)

    def _lost(self, what: str, exc: BaseException) -> ConnectionLost:
        self.close()
        return ConnectionLost(f"connection to {self.label} lost while {what}: {exc or type(exc).__name__}")
