"""Listening, shared by both HTTP servers (the edge in httpd.py, the OTLP receiver in otlp.py).

    "127.0.0.1:9877", "[::1]:9877", ":9877", "localhost:9877" --config's parse_listen--> (host, port)
        --resolve(): getaddrinfo--> (family, socket address) --ListeningServer--> bound, TLS per connection

resolve() asks getaddrinfo, so an IPv6 literal, an empty host (every interface) and a host name all bind in
the family they resolve to; where a name has both, IPv4 is bound, as node_exporter does. ListeningServer binds
without the reverse lookup http.server does, and runs the TLS handshake on each connection's own thread.
"""

from __future__ import annotations

import socket
import socketserver
import ssl
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def resolve(host: str, port: int) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    """The family and socket address to bind host:port ("" is every IPv4 interface); OSError if it does not
    resolve (socket.gaierror)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _type, _proto, _name, address = min(infos, key=lambda info: info[0] != socket.AF_INET)
    return family, address


class ListeningServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer bound to a resolved listen address; with an ssl_context, TLS on every connection.

    A subclass says how long a connection may take (connection_timeout) and may look at a TLS socket before its
    handshake (tls_wrapped).
    """

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self.address_family, bind_to = resolve(*address)
        self.ssl_context = ssl_context
        self._handler = handler
        super().__init__(bind_to, handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's FQDN, a DNS query that can stall startup for seconds.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def connection_timeout(self) -> float:
        """Seconds for the TLS handshake plus the request; the subclass's."""
        raise NotImplementedError

    def tls_wrapped(self, conn: ssl.SSLSocket) -> None:
        """The TLS socket of a connection, before its handshake (nothing to do by default)."""

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(self.connection_timeout())
        if self.ssl_context is None:
            self._handler(request, client_address, self)
            return
        # The handshake runs here, on the connection's own thread under its timeout, not in the accept loop
        # where one silent client would stall every other. wrap_socket detaches `request`: close the TLS one.
        conn = self.ssl_context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        self.tls_wrapped(conn)
        try:
            conn.do_handshake()
            self._handler(conn, client_address, self)
        finally:
            self.shutdown_request(conn)
