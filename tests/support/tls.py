"""A throwaway certificate authority for tests that serve HTTPS on 127.0.0.1 (made with the `openssl` CLI)."""
from __future__ import annotations

import subprocess
from pathlib import Path


def issue_certificates(directory: Path) -> tuple[str, str, str]:
    """A test CA and a certificate it signed for IP 127.0.0.1, valid one day: paths of (ca.pem, server.pem, server.key)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key",
            "-out", "ca.pem", "-days", "1", "-subj", "/CN=streaming-sink test CA")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "server.key",
            "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "1", "-extfile", "san.ext")
    return tuple(str(directory / name) for name in ("ca.pem", "server.pem", "server.key"))  # type: ignore[return-value]
