"""The command line's contract for the commands written in Python (`moekit serve`, `moekit chat-template`):
a bad argument, or any failure before the work starts, is one line `moekit: error: <command>: ...` on
stderr and exit status 1, as in the C++ commands."""

import argparse
import sys


class ContractParser(argparse.ArgumentParser):
    def __init__(self, command, **kwargs):
        super().__init__(prog=f"moekit {command}", **kwargs)
        self.command = command

    def error(self, message):
        print(f"moekit: error: {self.command}: {message}", file=sys.stderr)
        sys.exit(1)
