"""The network layer above ``protocols``: enrolment (a small CA), site policy, gRPC + mutual TLS.

Imports run one way: this package may use ``protocols``, ``secagg``, ``dp`` and ``fl_core``;
nothing below ``fedsec`` imports it.
"""
