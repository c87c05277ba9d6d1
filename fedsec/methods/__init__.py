"""Runners of the seed methods that are more than a FedAvg strategy (personalization, robust
aggregation, CoCoA, MOCHA, boosting): each builds its fl_core pieces from the configuration, trains
through the aggregation seam, and reports its own figures into ``summary.json`` and the run
directory."""
