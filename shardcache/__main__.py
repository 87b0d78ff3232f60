"""`python -m shardcache` runs the command line."""

from shardcache.cli import main

raise SystemExit(main())
