"""The cache: what is on local disk, and how a miss becomes an entry there."""
