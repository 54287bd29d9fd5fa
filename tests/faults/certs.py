"""A throwaway CA, a server certificate for 127.0.0.1/localhost and a client certificate, made with the
openssl command line (no Python crypto dependency)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: verification against it must fail


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=directory)


def leaf(directory: Path, name: str, ca: str, extensions: str) -> None:
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=directory)


def make_certs(directory: Path) -> Certs:
    if shutil.which("openssl") is None:
        import pytest

        pytest.skip("openssl is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    _ca(directory, "ca")
    _ca(directory, "other-ca")
    leaf(directory, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:vllm.internal\n"
          "extendedKeyUsage=serverAuth\n")
    leaf(directory, "client", "ca", "extendedKeyUsage=clientAuth\n")
    return Certs(directory / "ca.crt", directory / "server.crt", directory / "server.key",
                 directory / "client.crt", directory / "client.key", directory / "other-ca.crt")
