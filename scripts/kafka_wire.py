"""The few Kafka wire-protocol requests scripts/kafka.py needs, over a plain socket.

Stdlib only, on purpose, rather than a client library:

* ``scripts/kafka`` runs under the machine's ``python3`` (its wrapper does not use
  ``.venv``): developers and CI start and probe the broker with it before ``scripts/bootstrap``
  has created the virtualenv, and in environments that never create one (a broker host,
  a container that only runs Kafka). No Kafka client is importable there;
* even when run from the virtualenv, ``scripts/`` is ``sys.path[0]``, so ``import kafka``
  would import ``scripts/kafka.py`` itself instead of kafka-python;
* it needs two requests (Metadata, CreateTopics), each answered in one round trip without
  starting a JVM per call.

Only non-flexible request versions that Kafka 4.x still accepts (KIP-896 removed Metadata
v0-v3 and CreateTopics v0-v1) are used: Metadata v4 and CreateTopics v4. The product's own
Kafka traffic goes through ``eventbus`` (confluent-kafka or kafka-python), never through this.
"""

from __future__ import annotations

import itertools
import socket
import struct
from dataclasses import dataclass

CLIENT_ID = "liftgate-scripts-kafka"
METADATA = 3
CREATE_TOPICS = 19
TOPIC_ALREADY_EXISTS = 36
# A foreign service (HTTP, Postgres ...) answers with bytes that decode to an absurd size.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024

_correlation_ids = itertools.count(1)


class ProtocolError(Exception):
    """The peer answered, but not like a Kafka broker."""


@dataclass(frozen=True)
class Partition:
    index: int
    error_code: int
    leader: int


@dataclass(frozen=True)
class Topic:
    name: str
    error_code: int
    partitions: tuple[Partition, ...]

    @property
    def ready(self) -> bool:
        return (
            self.error_code == 0
            and bool(self.partitions)
            and all(p.error_code == 0 and p.leader >= 0 for p in self.partitions)
        )


@dataclass(frozen=True)
class Cluster:
    cluster_id: str | None
    brokers: tuple[tuple[int, str, int], ...]  # (node id, host, port)
    topics: dict[str, Topic]


@dataclass(frozen=True)
class TopicResult:
    name: str
    error_code: int
    error_message: str | None


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def _take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self._pos + size > len(self._data):
            raise ProtocolError("truncated response")
        (value,) = struct.unpack_from(fmt, self._data, self._pos)
        self._pos += size
        return int(value)

    def int8(self) -> int:
        return self._take(">b")

    def int16(self) -> int:
        return self._take(">h")

    def int32(self) -> int:
        return self._take(">i")

    def nullable_string(self) -> str | None:
        size = self.int16()
        if size < 0:
            return None
        if self._pos + size > len(self._data):
            raise ProtocolError("truncated string")
        value = self._data[self._pos : self._pos + size].decode("utf-8", errors="replace")
        self._pos += size
        return value

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise ProtocolError("unexpected null string")
        return value

    def array_length(self) -> int:
        size = self.int32()
        if size > len(self._data):
            raise ProtocolError(f"implausible array length {size}")
        return max(size, 0)

    def int32_array(self) -> list[int]:
        return [self.int32() for _ in range(self.array_length())]


def _string(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ProtocolError("connection closed before the response was complete")
        chunks += chunk
    return bytes(chunks)


def _exchange(address: tuple[str, int], api_key: int, version: int, body: bytes, timeout: float) -> _Reader:
    correlation_id = next(_correlation_ids) & 0x7FFFFFFF
    message = struct.pack(">hhi", api_key, version, correlation_id) + _string(CLIENT_ID) + body
    # The socket timeout bounds every connect/send/recv, so a silent peer cannot hang us.
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(message)) + message)
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        if not 4 <= size <= MAX_RESPONSE_BYTES:
            raise ProtocolError(f"implausible response size {size}")
        reader = _Reader(_recv_exactly(sock, size))
    if reader.int32() != correlation_id:
        raise ProtocolError("response correlation id does not match the request")
    return reader


def metadata(address: tuple[str, int], topics: list[str], timeout: float = 2.0) -> Cluster:
    """Metadata v4 for the given topics (an empty list asks for brokers only)."""
    body = struct.pack(">i", len(topics)) + b"".join(_string(t) for t in topics) + b"\x00"
    reader = _exchange(address, METADATA, 4, body, timeout)
    reader.int32()  # throttle_time_ms
    brokers = []
    for _ in range(reader.array_length()):
        node_id, host, port = reader.int32(), reader.string(), reader.int32()
        reader.nullable_string()  # rack
        brokers.append((node_id, host, port))
    cluster_id = reader.nullable_string()
    reader.int32()  # controller_id
    found = {}
    for _ in range(reader.array_length()):
        error_code, name = reader.int16(), reader.string()
        reader.int8()  # is_internal
        partitions = []
        for _ in range(reader.array_length()):
            p_error, index, leader = reader.int16(), reader.int32(), reader.int32()
            reader.int32_array()  # replica_nodes
            reader.int32_array()  # isr_nodes
            partitions.append(Partition(index=index, error_code=p_error, leader=leader))
        found[name] = Topic(name=name, error_code=error_code, partitions=tuple(partitions))
    return Cluster(cluster_id=cluster_id, brokers=tuple(brokers), topics=found)


def create_topics(
    address: tuple[str, int], names: list[str], partitions: int, timeout_ms: int = 30_000
) -> list[TopicResult]:
    """CreateTopics v4; replication factor -1 means the cluster's default.replication.factor."""
    body = struct.pack(">i", len(names))
    for name in names:
        # name, num_partitions, replication_factor, assignments [], configs []
        body += _string(name) + struct.pack(">ihii", partitions, -1, 0, 0)
    body += struct.pack(">ib", timeout_ms, 0)  # timeout_ms, validate_only
    reader = _exchange(address, CREATE_TOPICS, 4, body, timeout_ms / 1000 + 5)
    reader.int32()  # throttle_time_ms
    results = []
    for _ in range(reader.array_length()):
        name, code, message = reader.string(), reader.int16(), reader.nullable_string()
        results.append(TopicResult(name=name, error_code=code, error_message=message))
    return results
