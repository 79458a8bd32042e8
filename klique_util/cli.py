"""What ``kliqued`` and ``klique-worker`` share on the command line. Here rather than in
``kliqued.commands`` so that a worker host does not load the compiler to print its help."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples in each epilog as written."""
