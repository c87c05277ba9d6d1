"""The coordinator's connection to the key holder (``fedsec keyholder``).

A thin typed wrapper over :class:`~fedsec.network.transport.TransportClient`: TLS checks that the
server is the named key holder (role ``keyholder``), and each method is one topic of
:mod:`fedsec.network.keyholder`. Only the coordinator's certificate is admitted there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from fedsec.network.keyholder import ANNOUNCE, DECRYPT, ENROL, REGISTER, STATUS, encode_enrolment
from fedsec.network.pki import Trust
from fedsec.network.transport import DEFAULT_DEADLINE, TransportClient, TransportError


class KeyHolderClient:
    """Calls the key holder at ``address`` as the coordinator.

    Args:
        address: ``HOST:PORT`` of the key holder.
        trust: the study's root and revocation list.
        cert_path, key_path: the coordinator's certificate and TLS key.
        name: the key holder's certificate name.
        deadline: seconds per call (> 0); a decryption of a large model takes seconds.
        record: ``record(topic, request, reply)`` after every call (``reply`` None when the call
            failed): the coordinator's audit log of what it sent and received.
    """

    def __init__(self, *, address: str, trust: Trust, cert_path: str | Path, key_path: str | Path, name: str,
                 deadline: float = DEFAULT_DEADLINE,
                 record: Callable[[str, bytes, bytes | None], None] | None = None) -> None:
        self.name, self.record = name, record
        self.transport = TransportClient(address=address, trust=trust, cert_path=cert_path, key_path=key_path,
                                         server_name=name, server_role="keyholder", deadline=deadline)

    def _call(self, topic: str, payload: bytes) -> bytes:
        try:
            reply = self.transport.call(topic, payload)
        except TransportError:
            if self.record is not None:
                self.record(topic, payload, None)
            raise
        if self.record is not None:
            self.record(topic, payload, reply)
        return reply

    def announcement(self) -> bytes:
        """The key holder's signed announcement."""
        return self._call(ANNOUNCE, b"")

    def enrol(self, client_id: int, cert_pem: bytes) -> None:
        """Enrol the site whose certificate is ``cert_pem`` as ``client_id``."""
        self._call(ENROL, encode_enrolment(client_id, cert_pem))

    def register(self, registration: bytes) -> bytes:
        """Relay a site's registration; returns its Welcome."""
        return self._call(REGISTER, registration)

    def decrypt(self, request: bytes) -> bytes:
        """Send a signed decryption request; returns the result or the refusal bytes."""
        return self._call(DECRYPT, request)

    def status(self) -> dict:
        """``{"key_id", "epoch", "threshold", "last_sequence", "certificate", "head"}``."""
        return json.loads(self._call(STATUS, b""))

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> KeyHolderClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
