"""The `sdaccel` command. `main.py` builds the parser and runs a subcommand; `common.py` holds what every
subcommand shares (exit codes, flags, status lines); `generate.py`, `cache.py` and `serve.py` register their
subcommands, as `bench/cli.py`, `onnx/cli.py`, `quality/cli.py` and `serve/loadtest.py` do beside their modules."""
