"""Simulation backends: where a simulated federation's clients compute.

``sim.backend = "local"`` (the default) runs every client in the driver's process, one after
another. ``sim.backend = "ray"`` runs the clients' local training and their secure-layer
computations (the masking clients' stages) on a Ray cluster (:mod:`fedsec.backends.ray_runner`),
while the server logic, the accountant and the audit log stay in the driver. Ray is optional
(``pip install 'fedsec[ray]'``); nothing here imports it until a Ray backend is asked for.
"""

from fedsec.backends.session import BackendError, connect, ray_available

__all__ = ["BackendError", "connect", "ray_available"]
