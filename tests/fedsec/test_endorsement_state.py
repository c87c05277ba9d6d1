"""A threshold party's endorsements survive a restart on the same SQLite file.

Adversary: the server, asking restarted parties (a new process, a new `PaillierClient` and
`DecryptionParty` from the same share and identity) to endorse and decrypt a second contributor
list of an aggregation they already helped decrypt. With the endorsements in
`fedsec.state.SqliteEndorsementStore` the restarted parties refuse it (review r11: with the log in
memory, every party restarted once let the server decrypt two lists and isolate an update).
"""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.paillier import PaillierClient
from fedsec.protocols.paillier.party import CONFLICT
from fedsec.protocols.paillier.state import EndorsementConflict

from fedsec.state import SqliteEndorsementStore
from tests.protocols.paillier_helpers import make_paillier_session

N, T = 4, 2


def _decrypt(session, spec, subs, ids):
    server = session.server(spec)
    for c in ids:
        server.receive(c, subs[c])
    coordinator = session.coordinator(server)
    request = session.certify(coordinator)
    return coordinator.combine({c: session.clients[c].decryption_share(request) for c in ids})


def _restart(session, c, store):
    """Party ``c`` as a new process: a fresh client from its identity and share, on ``store``."""
    old = session.clients[c]
    client = PaillierClient(c, identity=session.identities[c],
                            announcer_identity=session.dealer.identity.public, share=old._share,
                            roster=session.roster, min_key_bits=512, endorsements=store)
    client.receive_announcement(session.dealer.announcement())
    client.receive_verification_keys(session.keys)
    session.clients[c] = client


def test_restarted_parties_on_sqlite_refuse_a_second_list_of_one_aggregation(tmp_path):
    session = make_paillier_session(N, threshold=T, custody="threshold", key_bits=512)
    paths = {c: tmp_path / f"party{c}.db" for c in range(N)}
    for c in range(N):
        _restart(session, c, SqliteEndorsementStore(paths[c]))
    spec = session.spec(length=4)
    subs = session.submissions(spec)
    first = _decrypt(session, spec, subs, [0, 1, 2, 3])
    assert np.array_equal(first, session.expected([0, 1, 2, 3]))
    for c in range(N):  # every party crashes and restarts on its own file
        session.clients[c]._party.store.close()
        _restart(session, c, SqliteEndorsementStore(paths[c]))
    with pytest.raises(ClientAbort, match=CONFLICT):
        _decrypt(session, spec, subs, [1, 2, 3])
    # the next aggregation still decrypts on the restarted parties
    spec = session.spec(length=4)
    subs = session.submissions(spec)
    assert np.array_equal(_decrypt(session, spec, subs, [1, 2, 3]), session.expected([1, 2, 3]))


def test_sqlite_endorsement_store_rules_and_settings(tmp_path):
    path = tmp_path / "party.db"
    store = SqliteEndorsementStore(path)
    key, other_key = bytes(16), b"\x01" * 16
    a, b = b"\xaa" * 32, b"\xbb" * 32
    assert store.endorsed(key, 1) is None
    store.endorse(key, 1, a)
    store.endorse(key, 1, a)  # the same digest again changes nothing
    with pytest.raises(EndorsementConflict):
        store.endorse(key, 1, b)
    store.endorse(other_key, 1, b)  # per key
    store.endorse(key, (1 << 64) - 1, b)  # the whole u64 range
    with pytest.raises(ValueError, match="sequence"):
        store.endorse(key, 1 << 64, b)
    with pytest.raises(ValueError, match="digest"):
        store.endorse(key, 2, b"short")
    assert (store.endorsed(key, 1), store.endorsed(other_key, 1)) == (a, b)
    assert store.endorsed(key, (1 << 64) - 1) == b
    store.close()
    reopened = SqliteEndorsementStore(path)
    assert reopened.endorsed(key, 1) == a
    with pytest.raises(EndorsementConflict):
        reopened.endorse(key, 1, b)
    reopened.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT COUNT(*) FROM endorsed").fetchone()[0] == 3
    with pytest.raises(ValueError, match="path"):
        SqliteEndorsementStore(tmp_path / "missing" / "party.db")
