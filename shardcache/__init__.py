"""shardcache: a local caching sidecar that serves WebDataset shards off local disk."""

__version__ = "0.1.0"
