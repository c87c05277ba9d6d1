"""Multi-party protocols composing secagg, dp and fl_core into privacy layers (next issues)."""
