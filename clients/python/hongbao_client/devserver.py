"""A `hongbao serve` of one's own, on loopback, for tests and load scripts.

It starts the binary on port 0 for every listener and reads the addresses the server
bound from its `hongbao serve ready: ...` line (printed once every worker is up), so two
runs never fight over a port and nothing is guessed. The ledger lives in a temporary
directory removed at `stop()`. The secret that signs login tokens goes to the server in
`HONGBAO_SECRET`, never on its command line (which every local user can read); with none
the server uses its development secret and listens on loopback only. Settings that have
no flag (`refresh_before_secs`, `token_leeway_secs`, ...) go in `config`, written to a
TOML file. Admin calls (campaigns, the audit) go over the package's own HTTP/1.1 client.
With `tls_cert` and `tls_key` the server speaks TLS on every listener and the admin
address: its URLs are `tcps://` and `https://`, and the admin calls trust `tls_ca`.

For the tests that kill a gateway worker, `worker_pids()` lists the serve process's
children and `worker_holding()` finds the one that holds a given client connection.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .http1 import HttpPool
from .tls import ALPN_HTTP, client_context

#: Where the package sits in the hongbao repository: clients/python/hongbao_client/.
_REPO_FROM_HERE = Path(__file__).resolve().parents[3]


def find_binary(repo_root: Path | None = None) -> Path | None:
    """`$HONGBAO_BIN` if set, else the newest of target/release/hongbao and
    target/debug/hongbao under the repository; None if there is none."""
    if env := os.environ.get("HONGBAO_BIN"):
        return Path(env)
    root = repo_root or _REPO_FROM_HERE
    built = [p for p in (root / "target" / "release" / "hongbao", root / "target" / "debug" / "hongbao")
             if p.is_file() and os.access(p, os.X_OK)]
    return max(built, key=lambda p: p.stat().st_mtime) if built else None


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@dataclass
class DevServer:
    binary: Path
    #: Extra `hongbao serve` flags, e.g. ["--max-shake-qps", "1"].
    extra_args: list[str] = field(default_factory=list)
    workers: int = 2
    #: The secret of the server's HS256 login key (`kid` "hongbao"); None: the
    #: development secret.
    secret: str | None = None
    #: TOML for settings that have no flag, e.g. "refresh_before_secs = 30\n".
    config: str | None = None
    #: TLS on every listener (`--tls-cert`, `--tls-key`: PEM files), and the CA file that
    #: signed the certificate, which the admin calls made here trust.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    ready_timeout_s: float = 60.0

    process: subprocess.Popen[bytes] | None = None
    tcp: tuple[str, int] = ("", 0)
    http: tuple[str, int] = ("", 0)
    admin: tuple[str, int] = ("", 0)
    _dir: Path | None = None
    _seen_workers: set[int] = field(default_factory=set)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def tcp_url(self) -> str:
        return f"{'tcps' if self.tls else 'tcp'}://{self.tcp[0]}:{self.tcp[1]}"

    @property
    def http_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.http[0]}:{self.http[1]}"

    @property
    def admin_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.admin[0]}:{self.admin[1]}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> DevServer:
        self._dir = Path(tempfile.mkdtemp(prefix="hongbao-py-"))
        args = [
            str(self.binary), "serve",
            "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
            "--data-dir", str(self._dir / "data"), "--workers", str(self.workers),
        ]
        if self.tls_cert is not None and self.tls_key is not None:
            args += ["--tls-cert", str(self.tls_cert), "--tls-key", str(self.tls_key)]
        if self.config is not None:
            (self._dir / "hongbao.toml").write_text(self.config)
            args += ["--config", str(self._dir / "hongbao.toml")]
        args += self.extra_args
        env = {k: v for k, v in os.environ.items() if k != "HONGBAO_SECRET"}
        if self.secret is not None:
            env["HONGBAO_SECRET"] = self.secret
        stdout = open(self._dir / "stdout.txt", "wb")
        stderr = open(self._dir / "stderr.txt", "wb")
        # Its own process group, so that a test runner's Ctrl-C reaches us, not it.
        self.process = subprocess.Popen(args, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                                        env=env, start_new_session=True)
        stdout.close()
        stderr.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self._seen_workers.update(self.worker_pids())
        return self

    def _wait_ready(self) -> None:
        assert self.process is not None and self._dir is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            for line in (self._dir / "stdout.txt").read_text(errors="replace").splitlines():
                if line.startswith("hongbao serve ready:"):
                    fields = dict(kv.split("=", 1) for kv in line.split(":", 1)[1].split() if "=" in kv)
                    self.tcp = _host_port(fields["listen"])
                    self.admin = _host_port(fields["admin"])
                    self.http = _host_port(fields["http"])
                    return
            if self.process.poll() is not None:
                raise RuntimeError(f"hongbao serve exited with {self.process.returncode}: {self.stderr()[-2000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"hongbao serve not ready within {self.ready_timeout_s:.0f} s: {self.stderr()[-2000:]}")

    def stderr(self) -> str:
        if self._dir is None or not (self._dir / "stderr.txt").exists():
            return ""
        return (self._dir / "stderr.txt").read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM (the server stops its workers and flushes the ledger), then SIGKILL if
        it is not gone within 20 s; then any worker it left behind; then the temp dir."""
        if self.process is not None and self.process.poll() is None:
            self._seen_workers.update(self.worker_pids())
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        for pid in self._seen_workers:
            _kill_if_ours(pid, self.binary)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # -- workers ----------------------------------------------------------------------

    def worker_pids(self) -> list[int]:
        """The gateway worker processes: the serve process's children."""
        if self.process is None or self.process.poll() is not None:
            return []
        pids: list[int] = []
        for task in Path(f"/proc/{self.pid}/task").glob("*"):
            try:
                pids += [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                continue
        self._seen_workers.update(pids)
        return sorted(set(pids))

    def worker_holding(self, client_port: int) -> int | None:
        """The worker whose socket is the server end of the connection from local port
        `client_port` to the TCP listener, found through /proc/net/tcp{,6} inodes."""
        inode = _socket_inode(self.tcp[1], client_port)
        if inode is None:
            return None
        target = f"socket:[{inode}]"
        for pid in self.worker_pids():
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return pid
            except OSError:
                continue
        return None

    # -- admin API --------------------------------------------------------------------

    async def admin_get(self, path: str) -> tuple[int, Any]:
        return await self._admin("GET", path, None)

    async def admin_post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        return await self._admin("POST", path, body)

    def admin_key(self) -> str:
        """The operator key a fresh server makes in its data directory."""
        assert self._dir is not None
        return (self._dir / "data" / "admin.key").read_text().strip()

    async def _admin(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        key = self.admin_key()
        tls = client_context(ALPN_HTTP, cafile=self.tls_ca) if self.tls else None
        pool = HttpPool(*self.admin, tls=tls)
        try:
            response = await pool.request(method, path, headers={"Authorization": f"Bearer {key}"},
                                          json_body=body)
            return response.status, response.json()
        finally:
            await pool.aclose()

    async def start_shake_campaign(self, *, packets: int, rate_per_sec: int, amount_min: int = 100,
                                   amount_max: int = 500) -> dict[str, Any]:
        status, campaign = await self.admin_post("/v1/campaigns/shake", {
            "packets": packets, "rate_per_sec": rate_per_sec, "amount_min": amount_min, "amount_max": amount_max,
        })
        if status != 201:
            raise RuntimeError(f"starting a shake campaign: {status} {campaign}")
        return campaign  # type: ignore[no-any-return]

    async def audit(self) -> dict[str, Any]:
        status, audit = await self.admin_get("/v1/audit")
        if status != 200:
            raise RuntimeError(f"GET /v1/audit: {status} {audit}")
        return audit  # type: ignore[no-any-return]


def _socket_inode(server_port: int, client_port: int) -> int | None:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local_port = int(cols[1].rsplit(":", 1)[1], 16)
            remote_port = int(cols[2].rsplit(":", 1)[1], 16)
            if local_port == server_port and remote_port == client_port and cols[9] != "0":
                return int(cols[9])
    return None


def _kill_if_ours(pid: int, binary: Path) -> None:
    """SIGKILL `pid` if it is still a process of our binary (pids get reused)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return
    if Path(exe.removesuffix(" (deleted)")).resolve() == binary.resolve():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
