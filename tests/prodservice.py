"""The tests' "production": an operator's start/stop scripts around a real server, plus a stand-in
benchmark stage. Standard library only, except `block`, which uses eagleflow.production.

    python tests/prodservice.py start --pidfile P --log L --port N [--env K=V ...] [--env-from K=VAR ...] -- ARGV...
        launch ARGV in a session of its own, write its pid to P, return at once; --env-from copies
        VAR of this script's environment into K (a secret the config must not hold, as a real
        systemd unit would read it from its own credentials)
    python tests/prodservice.py stop --pidfile P
        SIGTERM that group (this script ending what it started), SIGKILL after 20 s, remove P
    python tests/prodservice.py status --pidfile P
        exit 0 while the process P names runs (loading or serving), 3 once it has exited (production.status_command)
    python tests/prodservice.py refuse
        a stop command that fails: prints why, exits 3
    python tests/prodservice.py serve --port N [--drafter LINK] [--load-s S]
        a stand-in production server: it binds its port after S seconds (as an engine loads before it answers;
        sleeping, no CPU), then answers 200 on /health. With LINK it reads its drafter where production's launch
        would: it exits at once when LINK/config.json says {"broken": true} (as an engine dies on a bad
        drafter), else answers LINK/config.json's "name" on /drafter
    python tests/prodservice.py block --state-dir D --work-root W --config JSON
        a stand-in benchmark stage: enter production_stopped, launch a stand-in engine carrying the
        token, write its pid file, print "in-block <token> <engine pid>", sleep until killed
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(") ", 1)[1][0] != "Z"  # a zombie is gone: it holds no port, no memory


def _group_alive(pgid: int) -> bool:
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                fields = Path(f"/proc/{p}/stat").read_text().rsplit(") ", 1)[1].split()
            except (FileNotFoundError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def start(pidfile: Path, log: Path, port: int, env: list[str], argv: list[str], env_from: list[str] = ()) -> int:
    if pidfile.exists() and _alive(int(pidfile.read_text())):
        print(f"already running: pid {pidfile.read_text()}")
        return 1
    with socket.socket() as s:
        # As the servers themselves bind (uvicorn sets SO_REUSEADDR): the last server's connections in
        # TIME_WAIT do not hold the port, a live listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            print(f"port {port} is in use: refusing to start a second server")
            return 1
    extra = dict(kv.split("=", 1) for kv in env)
    for kv in env_from:
        key, var = kv.split("=", 1)
        if var not in os.environ:
            print(f"--env-from {kv}: {var} is not set in this environment")
            return 2
        extra[key] = os.environ[var]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **extra},
            start_new_session=True,
            cwd="/",
        )
    pidfile.write_text(str(proc.pid))
    print(f"started pid {proc.pid}")
    return 0


def stop(pidfile: Path) -> int:
    try:
        pid = int(pidfile.read_text())
    except FileNotFoundError:
        print("not running (no pidfile)")
        return 0
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while _group_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _group_alive(pid):
            break
    pidfile.unlink(missing_ok=True)
    print(f"stopped pid {pid}")
    return 0


def status(pidfile: Path) -> int:
    try:
        pid = int(pidfile.read_text())
    except FileNotFoundError:
        print("not running (no pidfile)")
        return 3
    if not _alive(pid):
        print(f"pid {pid} has exited")
        return 3
    print(f"running: pid {pid}")
    return 0


def block(state_dir: str, work_root: str, config: str) -> int:
    from eagleflow.config import ProductionConfig
    from eagleflow.production import production_stopped

    # Like stage_main: SIGTERM unwinds the stack, so production_stopped sees a cancellation.
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(128 + s))
    cfg = ProductionConfig.model_validate_json(config)
    with production_stopped(cfg, state_dir, work_root=work_root, log=lambda m: print(m, flush=True)) as downtime:
        # The engine stand-in: its own session, the token in its environment, no death signal, so
        # only the guardian can end it once this process is gone.
        engine = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"],
            env={**os.environ, **downtime.engine_env()},
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        downtime.pid_file("standin").write_text(str(engine.pid))
        print(f"in-block {downtime.token} {engine.pid}", flush=True)
        time.sleep(600)
    return 0


def serve(port: int, drafter: Path | None, load_s: float = 0.0) -> int:
    import http.server
    import json

    conf = json.loads((drafter / "config.json").read_text()) if drafter else {}
    if conf.get("broken"):
        print(f"cannot load the drafter at {drafter}: broken", flush=True)
        return 1

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = {"/health": b"ok", "/drafter": str(conf.get("name")).encode()}.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    time.sleep(load_s)
    http.server.ThreadingHTTPServer.allow_reuse_address = True
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("start")
    p.add_argument("--pidfile", type=Path, required=True)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--env-from", action="append", default=[])
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p = sub.add_parser("stop")
    p.add_argument("--pidfile", type=Path, required=True)
    p = sub.add_parser("status")
    p.add_argument("--pidfile", type=Path, required=True)
    sub.add_parser("refuse")
    p = sub.add_parser("serve")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--drafter", type=Path)
    p.add_argument("--load-s", type=float, default=0.0)
    p = sub.add_parser("block")
    p.add_argument("--state-dir", required=True)
    p.add_argument("--work-root", required=True)
    p.add_argument("--config", required=True)
    args = parser.parse_args()
    if args.cmd == "start":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        return start(args.pidfile, args.log, args.port, args.env, argv, args.env_from)
    if args.cmd == "stop":
        return stop(args.pidfile)
    if args.cmd == "status":
        return status(args.pidfile)
    if args.cmd == "serve":
        return serve(args.port, args.drafter, args.load_s)
    if args.cmd == "refuse":
        print("prod-stop: permission denied: this account may not stop the production server")
        return 3
    return block(args.state_dir, args.work_root, args.config)


if __name__ == "__main__":
    sys.exit(main())
