"""Per-method runners for ``fedsec run``: methods that do not train through the FedAvg server loop."""
