"""Tamper-evident audit logs: a party's signed, hash-chained record of what it did.

:mod:`fedsec.audit.log` writes and reads one party's ``audit.db``; :mod:`fedsec.audit.verify`
checks one log; :mod:`fedsec.audit.reconcile` compares two parties' logs; :mod:`fedsec.audit.run`
records a ``fedsec run``. Nothing below ``fedsec`` imports this package.
"""

from fedsec.audit.log import AuditLog, Event, Head, read_events, read_header
from fedsec.audit.reconcile import Mismatch, reconcile
from fedsec.audit.verify import LogBroken, Verified, verify_log

__all__ = ["AuditLog", "Event", "Head", "LogBroken", "Mismatch", "Verified", "read_events",
           "read_header", "reconcile", "verify_log"]
