"""gRPC with mutual TLS between the parties of a federation: two generic bytes methods.

Two methods carry one framed request (:mod:`fedsec.network.framing`) and return one framed
reply; no protoc code generation, the messages are the protocols' canonical bytes:

- ``/fedsec.v1.Transport/Call``, the fast path: a request whose header and payload fit in one gRPC
  message travels as that one message (:func:`~fedsec.network.framing.single`) and the client
  calls it as a unary call (gRPC Python's unary path starts no threads: about a quarter of a
  streaming call's CPU). The server reads it as a stream (so it takes the peer's slot and arms the
  read deadline before it reads, as below) and answers with one message. A reply too large for
  one message is *spilled*: the server keeps it under a random ticket bound to the peer's name (at
  most ``max_calls_per_peer`` kept per peer, each handed out once) and answers with the ticket
  under the topic :data:`SPILL`; the client fetches it with one ``Exchange`` call.
- ``/fedsec.v1.Transport/Exchange``: bidirectional streaming, the header then chunks, for requests
  larger than one message and for spilled replies.

Both ends build their TLS credentials from the federation's root and their own certificate and key:

- the server requires a client certificate chaining to the root (TLS), and on every call reads
  the client's verified certificate from the gRPC auth context and admits it with
  :func:`~fedsec.network.pki.verify_peer` (role, revocation list re-read when it changes, roster).
  The handler is told the peer's name from that certificate, never from anything the peer sends.
  A rejected peer gets ``UNAUTHENTICATED`` (not a valid member: wrong chain, expired, revoked) or
  ``PERMISSION_DENIED`` (valid, but a role or name this server does not accept), with no detail;
  the reason is logged on the server.
- the client trusts only the root, and TLS host-name checking matches the server's certificate
  against ``NAME.ROLE.fedsec``, so the server's name and role are checked in the handshake. Before
  its first call :meth:`TransportClient.check_server` fetches the server certificate once more
  with the standard library's TLS client and runs ``verify_peer`` on it (revocation list, roster).

Every call has a deadline (seconds); every gRPC message is at most ``MESSAGE_MAX`` bytes, and a
payload at most ``max_payload`` bytes (checked from the header before any chunk is read).

An enrolled peer cannot hold the server (review finding R6): the server reads each request under
its own ``read_deadline`` (a request whose chunks have not all arrived by then is cancelled and the
peer reported to ``on_slow``), admits at most ``max_calls_per_peer`` calls in flight per peer name
(the excess is refused with ``RESOURCE_EXHAUSTED`` at once, before any chunk is read), and runs
``max_calls_per_peer`` threads per roster name plus spare ones for refusals, so one peer holding
all its calls leaves every other peer its own threads.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
from cryptography import x509

from fedsec.network.errors import MalformedFrame, PeerRejected
from fedsec.network.framing import DEFAULT_MAX_PAYLOAD, MESSAGE_MAX, frames, reassemble, single, unpack
from fedsec.network.pki import Peer, Trust, dns_name, verify_peer

SERVICE = "fedsec.v1.Transport"
METHOD = f"/{SERVICE}/Exchange"
CALL = f"/{SERVICE}/Call"
SPILL = "fedsec.spill"
"""The topic of a spilled reply's ticket, and of the ``Exchange`` call that fetches it."""
TICKET_BYTES = 16
DEFAULT_DEADLINE = 60.0
DEFAULT_READ_DEADLINE = 60.0
"""Seconds a server waits for a whole request (header and chunks) to arrive."""
DEFAULT_CALLS_PER_PEER = 4
"""Calls one peer name may have in flight at once (a site makes one at a time, plus a retry)."""
SPARE_WORKERS = 4
"""Server threads beyond ``max_calls_per_peer`` per roster name (they refuse excess calls)."""
Handler = Callable[[Peer, str, bytes], bytes]
"""``handler(peer, topic, payload) -> reply``: what a server does with one admitted call."""
_log = logging.getLogger(__name__)


class TransportError(Exception):
    """A call failed; ``code`` is the gRPC status name (e.g. ``"UNAUTHENTICATED"``,
    ``"DEADLINE_EXCEEDED"``, ``"UNAVAILABLE"`` for a refused handshake)."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code


class Watchdog:
    """One thread that runs ``expire()`` callbacks at their deadlines (the servers' read deadlines:
    one timer thread for all calls instead of a new thread per call).

    The thread sleeps until the earliest deadline in its heap, armed or disarmed, and is woken
    only by a deadline earlier than that, not at every :meth:`arm`: with one read deadline for
    all calls a new deadline is the latest, so a server answering calls wakes it about once per
    ``read_deadline`` instead of once per call. Disarmed deadlines at the front of the heap are
    dropped by the next :meth:`arm` (and by the thread once due), so calls served in the order
    they arrive leave the heap as small as the calls in flight.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._live: set[int] = set()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._waiting_until = -math.inf
        """The deadline the thread waits for (monotonic seconds; ``inf``: none, ``-inf``: not waiting)."""

    def arm(self, seconds: float, expire: Callable[[], None]) -> int:
        """Call ``expire()`` in ``seconds`` unless :meth:`disarm` is called first; returns a handle."""
        with self._cond:
            handle = next(self._ids)
            self._drop_disarmed()
            due = time.monotonic() + seconds
            heapq.heappush(self._heap, (due, handle, expire))
            self._live.add(handle)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="read-deadlines", daemon=True)
                self._thread.start()
            if due < self._waiting_until:  # the thread would sleep past it
                self._cond.notify()
            return handle

    def _drop_disarmed(self) -> None:
        """Pop disarmed deadlines off the front of the heap (the caller holds the lock)."""
        while self._heap and self._heap[0][1] not in self._live:
            heapq.heappop(self._heap)

    def disarm(self, handle: int) -> None:
        with self._cond:
            self._live.discard(handle)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._heap:
                    self._waiting_until = math.inf
                    self._cond.wait()
                    self._waiting_until = -math.inf
                    continue
                # the front's time, live or disarmed: a later deadline armed meanwhile wakes nobody
                left = self._heap[0][0] - time.monotonic()
                if left > 0:
                    self._waiting_until = self._heap[0][0]
                    self._cond.wait(left)
                    self._waiting_until = -math.inf
                    continue
                _, handle, expire = heapq.heappop(self._heap)
                if handle not in self._live:
                    continue
                self._live.discard(handle)
            expire()


def _options(max_payload: int) -> list[tuple[str, int]]:
    if max_payload < 1:
        raise ValueError("max_payload: must be >= 1 byte")
    return [("grpc.max_send_message_length", MESSAGE_MAX), ("grpc.max_receive_message_length", MESSAGE_MAX)]


class TransportServer:
    """A gRPC server that admits only enrolled peers and hands their calls to ``handler``.

    Args:
        trust: the federation's root and revocation list.
        cert_pem, key_pem: this server's certificate and TLS private key (PEM).
        handler: ``handler(peer, topic, payload) -> reply``. A ``ValueError`` it raises (the
            protocols' ``MalformedMessage`` among them) becomes ``INVALID_ARGUMENT``, the protocols'
            ``ClientAbort``/``ProtocolAbort`` ``FAILED_PRECONDITION`` with their reason, anything
            else ``INTERNAL`` with no detail.
        roster: names admitted (``None``: any enrolled name with an accepted role).
        roles: client roles admitted, e.g. ``("site",)`` or ``("site", "keyholder")``.
        listen: ``HOST:PORT``; port 0 picks a free one (see :attr:`port` after :meth:`start`).
        max_payload: largest request payload in bytes.
        workers: threads serving calls concurrently (``None``: ``max_calls_per_peer`` per roster
            name plus :data:`SPARE_WORKERS`; 8 without a roster). With a roster it must be at least that.
        read_deadline: seconds, > 0, a request's header and chunks may take to arrive; a slower
            request is cancelled and its peer passed to ``on_slow``.
        max_calls_per_peer: calls in flight per peer name, >= 1; more get ``RESOURCE_EXHAUSTED``.
        on_slow: ``on_slow(peer)``, called (once per dropped request) when a request missed
            ``read_deadline``.
    """

    def __init__(self, *, trust: Trust, cert_pem: bytes, key_pem: bytes, handler: Handler,
                 roster: frozenset[str] | set[str] | None, roles: tuple[str, ...] = ("site",),
                 listen: str = "127.0.0.1:0", max_payload: int = DEFAULT_MAX_PAYLOAD,
                 workers: int | None = None, read_deadline: float = DEFAULT_READ_DEADLINE,
                 max_calls_per_peer: int = DEFAULT_CALLS_PER_PEER,
                 on_slow: Callable[[Peer], None] | None = None) -> None:
        if not roles:
            raise ValueError("roles: at least one client role must be admitted")
        if not read_deadline > 0:
            raise ValueError("read_deadline: must be > 0 seconds")
        if isinstance(max_calls_per_peer, bool) or not isinstance(max_calls_per_peer, int) \
                or max_calls_per_peer < 1:
            raise ValueError("max_calls_per_peer: must be an integer >= 1")
        self.trust = trust
        self.handler = handler
        self.roster = None if roster is None else frozenset(roster)
        self.roles = tuple(roles)
        self.max_payload = max_payload
        self.read_deadline, self.max_calls_per_peer, self.on_slow = read_deadline, max_calls_per_peer, on_slow
        needed = 8 if self.roster is None else max_calls_per_peer * len(self.roster) + SPARE_WORKERS
        if workers is None:
            workers = needed
        elif self.roster is not None and workers < needed:
            raise ValueError(f"workers: {workers} cannot serve {max_calls_per_peer} calls for each of "
                             f"{len(self.roster)} peers (need >= {needed})")
        self.workers = workers
        self._in_flight: dict[str, int] = {}
        self._slots = threading.Lock()
        self._spilled: dict[str, dict[bytes, tuple[str, bytes]]] = {}
        self._watchdog = Watchdog()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                                   options=_options(max_payload))
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            SERVICE, {"Exchange": grpc.stream_stream_rpc_method_handler(self._exchange),
                      "Call": grpc.stream_unary_rpc_method_handler(self._call)}),))
        credentials = grpc.ssl_server_credentials([(key_pem, cert_pem)], root_certificates=trust.ca_pem,
                                                  require_client_auth=True)
        self.port = self._server.add_secure_port(listen, credentials)
        if self.port == 0:
            raise OSError(f"cannot listen on {listen}")

    def start(self) -> int:
        """Start serving; returns the port."""
        self._server.start()
        return self.port

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop accepting calls; calls in flight get ``grace`` seconds to finish."""
        self._server.stop(grace).wait()

    def wait(self) -> None:
        """Block until the server stops."""
        self._server.wait_for_termination()

    def admit(self, context: grpc.ServicerContext) -> Peer:
        """The calling peer, from its TLS-verified certificate; raises :class:`PeerRejected`."""
        pems = context.auth_context().get("x509_pem_cert") or []
        if len(pems) != 1:
            raise PeerRejected("malformed", "no client certificate")
        # the PEM bytes themselves: a certificate seen before is not parsed again (verify_peer's cache
        # is keyed by the exact bytes and the root; validity, revocation, role and roster every call)
        return verify_peer(pems[0], trust=self.trust, roles=self.roles, roster=self.roster)

    def _exchange(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        _, served = self._admitted(requests, context, reassemble)
        if served is not None:
            yield from frames(*served)

    def _call(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        """The unary fast path: one message in, one out (a spilled reply's ticket if too large)."""
        peer, served = self._admitted(requests, context, unpack)
        if served is None:
            return b""  # the call was cancelled: nobody reads this
        message = single(*served)
        if message is None:
            message = single(SPILL, self._spill(peer.name, *served))
        assert message is not None
        return message

    def _admitted(self, requests: Iterator[bytes], context: grpc.ServicerContext,
                  read: Callable[..., tuple[str, bytes]]) -> tuple[Peer, tuple[str, bytes] | None]:
        """Admit the caller, take one of its slots, read its request with ``read`` and serve it;
        the peer and the reply (None: the request missed the read deadline or was cancelled)."""
        try:
            peer = self.admit(context)
        except PeerRejected as error:
            _log.warning("peer rejected: %s (%s)", error, context.peer())
            code = (grpc.StatusCode.UNAUTHENTICATED if error.reason in PeerRejected.UNAUTHENTICATED
                    else grpc.StatusCode.PERMISSION_DENIED)
            context.abort(code, "rejected")
        if not self._take_slot(peer.name):
            _log.warning("%s has %d calls in flight: refused one more", peer.name, self.max_calls_per_peer)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many calls in flight")
        try:
            return peer, self._serve(peer, requests, context, read)
        finally:
            self._release_slot(peer.name)

    def _spill(self, name: str, topic: str, reply: bytes) -> bytes:
        """Keep ``reply`` for ``name`` to fetch once; returns its ticket (the oldest kept is dropped
        beyond ``max_calls_per_peer``)."""
        ticket = os.urandom(TICKET_BYTES)
        with self._slots:
            kept = self._spilled.setdefault(name, {})
            kept[ticket] = (topic, reply)
            while len(kept) > self.max_calls_per_peer:
                del kept[next(iter(kept))]
        return ticket

    def _unspill(self, name: str, ticket: bytes) -> tuple[str, bytes]:
        with self._slots:
            kept = self._spilled.get(name, {})
            if ticket not in kept:
                raise ValueError("no spilled reply under this ticket")
            return kept.pop(ticket)

    def _take_slot(self, name: str) -> bool:
        with self._slots:
            if self._in_flight.get(name, 0) >= self.max_calls_per_peer:
                return False
            self._in_flight[name] = self._in_flight.get(name, 0) + 1
            return True

    def _release_slot(self, name: str) -> None:
        with self._slots:
            self._in_flight[name] -= 1
            if not self._in_flight[name]:
                del self._in_flight[name]

    def in_flight(self, name: str) -> int:
        """Calls of ``name`` being served now."""
        with self._slots:
            return self._in_flight.get(name, 0)

    def _read(self, peer: Peer, requests: Iterator[bytes], context: grpc.ServicerContext,
              read: Callable[..., tuple[str, bytes]] = reassemble) -> tuple[str, bytes] | None:
        """The request, or None when it missed :attr:`read_deadline` (the call is cancelled)."""
        late = threading.Event()

        def expire() -> None:
            late.set()
            context.cancel()

        timer = self._watchdog.arm(self.read_deadline, expire)
        try:
            return read(requests, max_payload=self.max_payload)
        except (grpc.RpcError, MalformedFrame):
            if not late.is_set():  # a cancelled call's stream may raise or just end: either way late
                raise
        finally:
            self._watchdog.disarm(timer)
        _log.warning("%s: request not complete within %.3g s: dropped", peer.name, self.read_deadline)
        if self.on_slow is not None:
            self.on_slow(peer)
        return None

    def _serve(self, peer: Peer, requests: Iterator[bytes], context: grpc.ServicerContext,
               read: Callable[..., tuple[str, bytes]] = reassemble) -> tuple[str, bytes] | None:
        try:
            request = self._read(peer, requests, context, read)
            if request is None:
                return None
            topic, payload = request
            if topic == SPILL:
                return self._unspill(peer.name, payload)
            reply = self.handler(peer, topic, payload)
        except ValueError as error:
            _log.warning("malformed message from %s: %s", peer.name, error)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed message")
        except grpc.RpcError:
            return None  # the peer cancelled its call
        except Exception as error:
            from fedsec.protocols.errors import ClientAbort, ProtocolAbort

            if isinstance(error, ClientAbort | ProtocolAbort):
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
            _log.exception("handler failed on a call from %s", peer.name)
            context.abort(grpc.StatusCode.INTERNAL, "failed")
        return topic, reply


class TransportClient:
    """A party's connection to one server (the coordinator or the key holder).

    Args:
        address: ``HOST:PORT`` of the server.
        trust: the federation's root and revocation list.
        cert_path, key_path: this party's certificate and TLS key files (PEM).
        server_name: the name the server's certificate must carry.
        server_role: the role it must carry (``"server"`` or ``"keyholder"``).
        deadline: default per-call deadline in seconds, > 0.
        max_payload: largest reply payload in bytes.
    """

    def __init__(self, *, address: str, trust: Trust, cert_path: str | Path, key_path: str | Path,
                 server_name: str, server_role: str = "server", deadline: float = DEFAULT_DEADLINE,
                 max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        if not deadline > 0:
            raise ValueError("deadline: must be > 0 seconds")
        self.address = address
        self.trust = trust
        self.cert_path, self.key_path = Path(cert_path), Path(key_path)
        self.server_name, self.server_role = server_name, server_role
        self.deadline = deadline
        self.max_payload = max_payload
        credentials = grpc.ssl_channel_credentials(root_certificates=trust.ca_pem,
                                                   private_key=self.key_path.read_bytes(),
                                                   certificate_chain=self.cert_path.read_bytes())
        options = [*_options(max_payload),
                   ("grpc.ssl_target_name_override", dns_name(server_name, server_role))]
        self._channel = grpc.secure_channel(address, credentials, options=options)
        self._exchange = self._channel.stream_stream(METHOD)
        self._unary = self._channel.unary_unary(CALL)
        self._server_checked = False
        self.server: Peer | None = None
        """The server's admitted certificate, once :meth:`check_server` ran (before the first call)."""

    def check_server(self, timeout: float = 10.0) -> Peer:
        """Fetch the server's certificate over TLS and admit it (root, role, name, revocation list)."""
        host, _, port = self.address.rpartition(":")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["h2"])
        with tempfile.NamedTemporaryFile() as ca:
            ca.write(self.trust.ca_pem)
            ca.flush()
            context.load_verify_locations(ca.name)
        context.load_cert_chain(self.cert_path, self.key_path)
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw:
                with context.wrap_socket(raw, server_hostname=dns_name(self.server_name,
                                                                       self.server_role)) as tls:
                    der = tls.getpeercert(binary_form=True)
        except OSError:
            raise TransportError("UNAVAILABLE", "TLS handshake with the server failed") from None
        peer = verify_peer(x509.load_der_x509_certificate(der), trust=self.trust, roles=(self.server_role,),
                           roster={self.server_name})
        self._server_checked = True
        self.server = peer
        return peer

    def call(self, topic: str, payload: bytes, *, deadline: float | None = None) -> bytes:
        """Send one payload under ``topic`` and return the reply payload.

        Raises:
            TransportError: the call failed (status code name in ``code``).
            PeerRejected: the server's certificate is revoked or not the expected party.
            MalformedFrame: the reply is malformed.
        """
        if not self._server_checked:
            self.check_server()
        timeout = deadline or self.deadline
        end = time.monotonic() + timeout
        message = single(topic, payload)
        try:
            if message is None:
                reply_topic, reply = self._streamed(topic, payload, timeout)
            else:
                reply_topic, reply = unpack((self._unary(message, timeout=timeout),),
                                            max_payload=self.max_payload)
                if reply_topic == SPILL and topic != SPILL:
                    reply_topic, reply = self._streamed(SPILL, reply, max(end - time.monotonic(), 0.001))
        except grpc.RpcError as error:
            raise TransportError(error.code().name, error.details() or "") from None
        if reply_topic != topic:
            raise MalformedFrame(f"reply topic {reply_topic!r} does not answer {topic!r}")
        return reply

    def _streamed(self, topic: str, payload: bytes, timeout: float) -> tuple[str, bytes]:
        replies = self._exchange(frames(topic, payload), timeout=timeout)
        return reassemble(replies, max_payload=self.max_payload)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> TransportClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
