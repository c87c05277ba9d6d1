"""The key holder's burned sequence numbers survive a restart on the same SQLite file."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
from fedsec.protocols.paillier import DecryptionRefused, PaillierKeyHolder
from fedsec.protocols.paillier.keyholder import REFUSAL
from fedsec.protocols.paillier.state import StaleSequence

from fedsec.state import SqliteSequenceStore
from tests.protocols.paillier_helpers import make_paillier_session


def test_a_restarted_key_holder_refuses_the_burned_number(tmp_path):
    path = tmp_path / "keyholder.db"
    session = make_paillier_session(3, threshold=2, key_bits=512)
    first = session.key_holder
    first.store = SqliteSequenceStore(path)
    spec = session.spec(length=20)
    server = session.server(spec)
    for c, data in session.submissions(spec).items():
        server.receive(c, data)
    request = server.decryption_request()
    assert np.array_equal(server.finish(first.decrypt(request)), session.expected(range(3)))
    first.store.close()

    restarted = PaillierKeyHolder(threshold=2, server_identity=session.server_identity.public,
                                  identity=first.identity, store=SqliteSequenceStore(path),
                                  private_key=first._private_key,
                                  tag_secret=first._tag_pair.private, mac_key=first._mac_key)
    for c, client in session.clients.items():
        restarted.enroll(c, session.identities[c].public)
        restarted.register(client._registration)
    assert restarted.last_sequence == spec.sequence
    assert restarted.respond(request) == REFUSAL
    assert restarted.refusals[-1][1] == "not the next sequence number (2)"
    spec = session.spec(length=20)
    server = session.server(spec)
    for c, data in session.submissions(spec).items():
        server.receive(c, data)
    assert np.array_equal(server.finish(restarted.decrypt(server.decryption_request())),
                          session.expected(range(3)))
    with pytest.raises(DecryptionRefused):
        restarted.decrypt(server.decryption_request())


def test_sqlite_store_rules_and_settings(tmp_path):
    store = SqliteSequenceStore(tmp_path / "s.db")
    for bad in (0, 2, 2**63):
        with pytest.raises(StaleSequence):
            store.burn(b"k", bad)
    store.burn(b"k", 1)
    store.burn(b"k", 2)
    with pytest.raises(StaleSequence):
        store.burn(b"k", 2)
    assert store.last_burned(b"k") == 2 and store.last_burned(b"other") == 0
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    store.close()
    with sqlite3.connect(tmp_path / "s.db") as db:
        assert db.execute("SELECT sequence FROM burned").fetchall() == [(2,)]
    with pytest.raises(ValueError, match="path"):
        SqliteSequenceStore(tmp_path / "missing" / "s.db")
