"""An SSH host's files: SFTP, or plain commands (`test`, `cat`, `mv`, `tail`) where the sshd refuses the sftp
subsystem, as hardened hosts that removed `Subsystem sftp` do. Any sshd runs commands, so eagleflow works there
unchanged instead of failing as if the network were broken.

Writes are atomic either way (a temporary name beside the target, then a rename). A write the host refuses is
named with its fix: a full disk (the free bytes, from `df`), no permission in the directory; neither is a lost
link, and neither is retried.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shlex
import stat
from collections.abc import Callable, Iterator

import paramiko

from eagleflow.hosts.base import ConnectionLost, HostError, HostSetupError

# paramiko raises these when the transport breaks under an open channel or SFTP session (socket.timeout is an
# OSError); an OSError with the link still up is the host's answer (no such file, permission), not a lost link.
TRANSPORT_ERRORS = (EOFError, OSError, paramiko.SSHException)


class SshFiles:
    """The file operations of `SshHost`, a mixin: it uses the host's `_conn`, `_sftp_client`, `_fail`, `_lost`,
    `label`, `user` and `work_root`."""

    def exists(self, path: str) -> bool:
        sftp = self._sftp_client()
        if sftp is None:
            rc, _, err = self._command(["test", "-e", path])
            if rc not in (0, 1):
                raise HostError(f"checking {path} on {self.label} failed: {err.strip() or f'exit status {rc}'}")
            return rc == 0
        try:
            sftp.stat(path)
            return True
        except FileNotFoundError:
            return False
        except TRANSPORT_ERRORS as exc:
            raise self._fail(f"checking {path}", exc) from None

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode()

    def read_bytes(self, path: str) -> bytes:
        sftp = self._sftp_client()
        if sftp is None:
            rc, out, err = self._command(["cat", "--", path])
            if rc != 0 and "No such file" in err:
                raise FileNotFoundError(f"{path} does not exist on {self.label}")
            if rc != 0:
                raise HostError(f"reading {path} on {self.label} failed: {err.strip() or f'exit status {rc}'}")
            return out
        try:
            with sftp.open(path, "r") as f:
                return f.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} does not exist on {self.label}") from None
        except TRANSPORT_ERRORS as exc:
            raise self._fail(f"reading {path}", exc) from None

    def write_text(self, path: str, text: str) -> None:
        self.write_bytes(path, text.encode())

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write atomically: a temporary name in the same directory, then rename over the target."""

        def write(sftp: paramiko.SFTPClient, tmp: str) -> None:
            with sftp.open(tmp, "w") as f:
                f.write(data)

        self._upload(path, write, lambda: iter([data]), f"writing {path}", len(data))

    def put_file(self, local: str, remote: str) -> None:
        """Copy a local file to the host (temporary name, then rename)."""

        def chunks() -> Iterator[bytes]:
            with open(local, "rb") as f:
                while block := f.read(1 << 20):
                    yield block

        self._upload(
            remote,
            lambda sftp, tmp: sftp.put(local, tmp),
            chunks,
            f"copying {local} to {remote}",
            os.path.getsize(local),
        )

    def _upload(
        self,
        path: str,
        write: Callable[[paramiko.SFTPClient, str], object],
        chunks: Callable[[], Iterator[bytes]],
        what: str,
        size: int,
    ) -> None:
        """`write(sftp, tmp)` (or `chunks()` piped into `cat`, without SFTP) fills a temporary name beside `path`;
        then it is renamed over `path`. A refusal (permission, a full disk) is named with its fix."""
        directory = posixpath.dirname(path)
        tmp = posixpath.join(directory, f".{posixpath.basename(path)}.{os.getpid()}.tmp")
        sftp = self._sftp_client()
        if sftp is None:
            # $1 the directory, $2 the temporary name, $3 the target: nothing of them reaches the shell unquoted.
            script = 'mkdir -p -- "$1" && cat > "$2" && mv -f -- "$2" "$3" || { rc=$?; rm -f -- "$2"; exit "$rc"; }'
            rc, _, err = self._command(["sh", "-c", script, "sh", directory, tmp, path], chunks())
            if rc != 0:
                raise self._refusal(what, directory, size, err.strip() or f"exit status {rc}")
            return
        try:
            self._makedirs(sftp, directory)
            write(sftp, tmp)
            sftp.posix_rename(tmp, path)
        except TRANSPORT_ERRORS as exc:
            err = self._fail(what, exc)
            if isinstance(err, ConnectionLost):
                raise err from None
            with contextlib.suppress(Exception):
                sftp.remove(tmp)
            raise self._refusal(what, directory, size, str(exc)) from None

    def _refusal(self, what: str, directory: str, size: int, said: str) -> HostError:
        """A write the host refused, as its setup error when it is one (a full disk, no permission on
        host.work_root) with the fix; else a plain HostError. Neither is retried."""
        free = self._free_bytes(directory)
        if free is not None and free < size + (1 << 20):
            return HostSetupError(
                self.label,
                f"{what} on {self.label} failed: the disk holding {directory} is full ({free:,} bytes free; "
                f"the host said {said!r}). Fix: free space there, or point host.work_root (now {self.work_root}) "
                "at a larger disk",
            )
        if "ermission denied" in said or "Errno 13" in said or "Operation not permitted" in said:
            return HostSetupError(
                self.label,
                f"{what} on {self.label} failed: {self.user} may not write in {directory} ({said}). Fix: give "
                f"{self.user} that directory (chown -R {self.user} {self.work_root}), or set host.work_root to a "
                "directory the user owns",
            )
        return HostError(f"{what} on {self.label} failed: {said}")

    def _free_bytes(self, directory: str) -> int | None:
        """Bytes free to this user on the disk holding `directory` (its nearest existing parent); None if unknown."""
        probe = 'd=$1; while [ ! -e "$d" ]; do d=$(dirname -- "$d"); done; df -Pk -- "$d"'
        try:
            rc, out, _ = self._command(["sh", "-c", probe, "sh", directory])
            return int(out.decode().splitlines()[-1].split()[3]) * 1024 if rc == 0 else None
        except (HostError, ValueError, IndexError):
            return None

    def _command(
        self, argv: list[str], stdin: Iterator[bytes] | None = None, timeout: float = 300
    ) -> tuple[int, bytes, str]:
        """A command for the file operations: bytes out, `stdin` streamed in (no host.env: plain tools)."""
        try:
            chan = self._conn().get_transport().open_session()
            chan.settimeout(timeout)
            chan.exec_command(shlex.join(argv))
            for block in stdin or ():
                chan.sendall(block)
            chan.shutdown_write()
            out, err = chan.makefile("rb").read(), chan.makefile_stderr("rb").read()
            rc = chan.recv_exit_status()
        except TRANSPORT_ERRORS as exc:
            raise self._lost(f"running {argv[:2]}", exc) from None
        if rc == -1:
            raise self._lost(f"running {argv[:2]}", EOFError("no exit status"))
        return rc, out, err.decode(errors="replace")

    def tail(self, path: str, lines: int = 40) -> list[str]:
        """The last lines of a host file (the stage log, for failure messages)."""
        sftp = self._sftp_client()
        if sftp is None:
            rc, out, _ = self._command(["tail", "-c", "16384", "--", path])
            return out.decode(errors="replace").splitlines()[-lines:] if rc == 0 else []
        try:
            with sftp.open(path, "r") as f:
                size = f.stat().st_size
                f.seek(max(0, size - 16384))
                return f.read().decode(errors="replace").splitlines()[-lines:]
        except FileNotFoundError:
            return []
        except TRANSPORT_ERRORS as exc:
            raise self._fail(f"reading {path}", exc) from None

    @staticmethod
    def _makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
        missing = []
        while path and path != "/":
            try:
                if stat.S_ISDIR(sftp.stat(path).st_mode):
                    break
                raise HostError(f"{path} exists on the host and is not a directory")
            except FileNotFoundError:
                missing.append(path)
                path = posixpath.dirname(path)
        for p in reversed(missing):
            try:
                sftp.mkdir(p)
            except OSError:
                try:  # created meanwhile by a concurrent writer is fine; refused (permission) is not
                    if stat.S_ISDIR(sftp.stat(p).st_mode):
                        continue
                except OSError:
                    pass
                raise
