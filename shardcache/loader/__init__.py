"""What runs in training workers: the standard library only, so a training image needs no
daemon dependency (the package without an extra, from a clone, or these files copied).

Parts:

- `client`: talking to a running daemon from a job: `local_url`, `prefetch`, `post_plan`,
  `status`, with the admin token from the environment; every failure one `ClientError`.
- `webdataset`: `prefetch_ahead(n)`, a WebDataset pipeline stage that tells the daemon which
  shards this worker reads next.
- `pipeline_order`: the next epochs' order of the pipeline that stage sits in, replayed from
  its shard stages where they are computable (`detshuffle`, `split_by_node`, ...).
- `sample`: generated WebDataset shards for the demo origin and the tests.

What this folder must not know: anything of the daemon's (it speaks its HTTP API), aiohttp,
boto3, diskcache; it imports only the foundation (`printable`).
"""
