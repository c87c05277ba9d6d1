"""The network layer above ``protocols``: enrolment (a small CA), site policy, gRPC + mutual TLS,
and the deployed federation (``fedsec serve``: :mod:`fedsec.network.coordinator` and
:mod:`fedsec.network.serve`; ``fedsec join``: :mod:`fedsec.network.site`; the secure layers'
network sides: :mod:`fedsec.network.layers`; ``fedsec demo deploy``: :mod:`fedsec.network.demo`).

Imports run one way: this package may use ``protocols``, ``secagg``, ``dp`` and ``fl_core``;
nothing below ``fedsec`` imports it.
"""
