"""The mathematics of privacy accounting, apart from the accountant interface: each module turns
a list of ledger events into epsilon at a given delta."""
