"""Delivery: lines in, batches out to every sink, in order, without loss (buffer, workers, retry, spool)."""
