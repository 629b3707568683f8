"""Throwaway certificates for the TLS tests, made with the `openssl` command: a CA, a
server certificate it signed for 127.0.0.1 (P-256, a day long), and a second CA that
signed nothing of the server's — what a client trusting the wrong CA holds."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


@dataclass(frozen=True)
class Certs:
    #: The server's certificate and key (PEM files).
    cert: Path
    key: Path
    #: The CA that signed it, and another that did not (PEM files).
    ca: Path
    other_ca: Path


def openssl_missing() -> str | None:
    """Why the certificates cannot be made here, or None."""
    return None if shutil.which("openssl") else "no `openssl` command to make the test certificates with"


def make_certs(folder: Path) -> Certs:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", *_EC, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "1",
                "-subj", f"/CN=hongbao {ca} for tests",
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    openssl("req", *_EC, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (folder / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                                       "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "1", "-extfile", "server.ext")
    return Certs(folder / "server.pem", folder / "server.key", folder / "ca.pem", folder / "other-ca.pem")
