"""The `iox-batch` command: argument parsing, the commands, `show`, and the Spark runner.
The top layer: it may import every other layer; nothing imports it."""

from __future__ import annotations
