"""Readiness probes over plain sockets: Kafka's wire protocol (ApiVersions, Metadata) and RESP."""

from __future__ import annotations

import contextlib
import socket
import struct
from dataclasses import dataclass
from typing import Any

from deploy.local.config import HOST, DeployError

__all__ = [
    "KafkaMetadata",
    "kafka_answering",
    "kafka_metadata",
    "parse_api_versions_v0",
    "parse_metadata",
    "redis_ping",
    "redis_shutdown_save",
]


@dataclass(frozen=True)
class KafkaMetadata:
    """The part of a Metadata response that says the broker is up."""

    cluster_id: str | None
    controller_id: int
    brokers: tuple[tuple[int, str, int], ...]  # (node id, host, port)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def int16(self) -> int:
        return int(self._take(">h"))

    def int32(self) -> int:
        return int(self._take(">i"))

    def nullable_string(self) -> str | None:
        length = self.int16()
        if length < 0:
            return None
        raw = self.data[self.pos : self.pos + length]
        if len(raw) != length:
            raise ValueError("truncated string")
        self.pos += length
        return raw.decode()

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise ValueError("unexpected null string")
        return value


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


def _kafka_call(sock: socket.socket, api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    client_id = b"combee-deploy"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    response = _recv_exact(sock, size)
    if struct.unpack_from(">i", response)[0] != correlation_id:
        raise ValueError("correlation id mismatch")
    return response[4:]


def parse_api_versions_v0(body: bytes) -> dict[int, tuple[int, int]]:
    """api_key -> (min, max version) from an ApiVersions v0 response body."""
    reader = _Reader(body)
    reader.int16()  # error code: the list is sent even with UNSUPPORTED_VERSION
    return {reader.int16(): (reader.int16(), reader.int16()) for _ in range(reader.int32())}


def parse_metadata(body: bytes, version: int) -> KafkaMetadata:
    """Brokers, cluster id and controller from a Metadata response body (versions 1-8, no topics asked)."""
    reader = _Reader(body)
    if version >= 3:
        reader.int32()  # throttle_time_ms
    brokers = []
    for _ in range(reader.int32()):
        node_id, host, port = reader.int32(), reader.string(), reader.int32()
        reader.nullable_string()  # rack
        brokers.append((node_id, host, port))
    cluster_id = reader.nullable_string() if version >= 2 else None
    return KafkaMetadata(cluster_id, reader.int32(), tuple(brokers))


def kafka_metadata(port: int, host: str = HOST, timeout_s: float = 3.0) -> KafkaMetadata:
    """Ask the broker at ``host:port`` for cluster metadata (ApiVersions, then Metadata v1-v8).

    A KRaft broker only serves requests once it has caught up with the metadata log and is unfenced, so a
    Metadata answer listing a broker means clients can use it. Raises OSError/ValueError if it cannot answer.
    """
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        versions = parse_api_versions_v0(_kafka_call(sock, 18, 0, 1, b""))
        low, high = versions.get(3, (0, -1))
        version = min(high, 8)
        if version < max(low, 1):
            raise ValueError(f"broker supports Metadata v{low}-v{high} only")
        body = struct.pack(">i", 0)  # topics: empty array (brokers only)
        if version >= 4:
            body += b"\x00"  # allow_auto_topic_creation = false
        if version >= 8:
            body += b"\x00\x00"  # include cluster/topic authorized operations = false
        return parse_metadata(_kafka_call(sock, 3, version, 2, body), version)


def kafka_answering(port: int, host: str = HOST) -> bool:
    try:
        return bool(kafka_metadata(port, host).brokers)
    except (OSError, ValueError, struct.error):
        return False


def _resp_command(*args: str) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        raw = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def _resp_line(sock: socket.socket) -> bytes:
    buf = bytearray()
    while not buf.endswith(b"\r\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("connection closed by redis")
        buf += chunk
    return bytes(buf[:-2])


def redis_ping(port: int, password: str | None = None, host: str = HOST, timeout_s: float = 2.0) -> bool:
    """True if the Redis server at ``host:port`` answers PING with PONG (after AUTH if a password is set)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            if password:
                sock.sendall(_resp_command("AUTH", password))
                if _resp_line(sock) != b"+OK":
                    return False
            sock.sendall(_resp_command("PING"))
            return _resp_line(sock) == b"+PONG"
    except OSError:
        return False


def redis_shutdown_save(port: int, password: str | None) -> None:
    """Ask Redis to write its snapshot and exit (SHUTDOWN SAVE works even with `--save ''`)."""
    with socket.create_connection((HOST, port), timeout=10) as sock:
        if password:
            sock.sendall(_resp_command("AUTH", password))
            _resp_line(sock)
        sock.sendall(_resp_command("SHUTDOWN", "SAVE"))
        with contextlib.suppress(OSError):
            reply = sock.recv(256)  # the connection just closes when the shutdown succeeds
            if reply.startswith(b"-"):
                raise DeployError(f"redis refused SHUTDOWN SAVE: {reply.decode(errors='replace').strip()}")
