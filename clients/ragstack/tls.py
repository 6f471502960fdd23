"""TLS for the client: when a connection uses it, and the settings each library takes.

A server behind a TLS-terminating proxy (an ingress, a load balancer, an HTTPS proxy) is reached with
TLS: an `https://` or `grpcs://` URL, or TlsOptions (`tls=True` for the defaults). The certificate is
checked against `ca_file` (PEM), else against the system's CAs (HTTP) or gRPC's bundled roots (gRPC).
`cert_file`/`key_file` send a client certificate (mutual TLS). `insecure` skips the check, over HTTP
only: gRPC's Python library has no way to connect without verifying.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

TLS_SCHEMES, PLAIN_SCHEMES = ("https", "grpcs"), ("http", "grpc")


@dataclass(frozen=True)
class TlsOptions:
    ca_file: str | None = None     # PEM certificates of the CAs to trust; None: the defaults
    cert_file: str | None = None   # the client's certificate (PEM), for a server that asks for one
    key_file: str | None = None    # its private key (PEM); None: in cert_file
    insecure: bool = False         # HTTP only: no check of the server's certificate (testing only)

    def check(self, protocol: str) -> "TlsOptions":
        """The options as given, or ValueError naming what cannot be done."""
        if self.insecure and protocol == "grpc":
            raise ValueError("gRPC cannot skip the check of the server's certificate (insecure); give the CA "
                             "that signed it (ca_file, --ssl-ca)")
        if self.insecure and self.ca_file:
            raise ValueError("insecure skips the certificate check, so a CA file (ca_file, --ssl-ca) is pointless: "
                             "give one or the other")
        if self.key_file and not self.cert_file:
            raise ValueError("a client key (key_file, --ssl-key) needs its certificate (cert_file, --ssl-cert)")
        for what, path in (("CA file", self.ca_file), ("certificate", self.cert_file), ("key", self.key_file)):
            if path and not Path(path).is_file():
                raise ValueError(f"TLS {what} {path}: no such file")
        return self

    def context(self, ssl_module=ssl) -> ssl.SSLContext:
        """A client context for these options, from `ssl_module` (ssl, or gevent.ssl for geventhttpclient)."""
        context = ssl_module.create_default_context(cafile=self.ca_file)
        if self.insecure:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def grpc_arguments(self) -> dict:
        """tritonclient.grpc's InferenceServerClient keywords: file paths (None: gRPC's defaults)."""
        return {"ssl": True, "root_certificates": self.ca_file, "certificate_chain": self.cert_file,
                "private_key": self.key_file or self.cert_file}  # a PEM file may hold both


def resolve(url: str, protocol: str, tls: "TlsOptions | bool | None") -> TlsOptions | None:
    """Whether (and how) a connection to `url` uses TLS: an https:// or grpcs:// URL, tls=True or
    TlsOptions turn it on with the defaults or those options; an http:// or grpc:// URL with TLS asked
    for is a contradiction (ValueError)."""
    scheme = urlsplit(url).scheme if "://" in url else ""
    if tls is False:
        if scheme in TLS_SCHEMES:
            raise ValueError(f"{url}: the URL asks for TLS and tls=False for none; give one or the other")
        return None
    if tls is None and scheme not in TLS_SCHEMES:
        return None
    if scheme in PLAIN_SCHEMES:
        raise ValueError(f"{url}: a {scheme}:// URL connects without TLS; write {scheme}s:// "
                         f"(or host:port) to connect with TLS")
    return (TlsOptions() if tls in (None, True) else tls).check(protocol)
