"""Durable state of a deployment's parties (what a restarted party must not forget)."""

from fedsec.state.endorsements import SqliteEndorsementStore
from fedsec.state.sequences import SqliteSequenceStore

__all__ = ["SqliteEndorsementStore", "SqliteSequenceStore"]
