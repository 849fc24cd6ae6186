"""The message store: commit log, consume queues, index, flush and recovery."""
