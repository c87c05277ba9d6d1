"""How protocol parties exchange messages: bytes between a client id and the server.

State machines never touch a transport; a driver reads their outgoing messages, hands them to a
transport and feeds replies back. :class:`InMemoryTransport` is the simulation (it counts the
bytes each way); a network transport implements the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict


class Transport(ABC):
    """Carries one message from a sender to a recipient."""

    @abstractmethod
    def to_client(self, client: int, data: bytes) -> None:
        """Deliver a server message to ``client``."""

    @abstractmethod
    def to_server(self, client: int, data: bytes) -> None:
        """Deliver ``client``'s message to the server."""


class InMemoryTransport(Transport):
    """Delivers within one process and counts bytes (upload = client to server)."""

    def __init__(self) -> None:
        self.uploaded: dict[int, int] = defaultdict(int)
        self.downloaded: dict[int, int] = defaultdict(int)

    def to_client(self, client: int, data: bytes) -> None:
        self.downloaded[client] += len(data)

    def to_server(self, client: int, data: bytes) -> None:
        self.uploaded[client] += len(data)

    @property
    def upload_bytes(self) -> int:
        return sum(self.uploaded.values())
