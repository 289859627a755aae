"""The drivers' side of a bench/frameworks worker: a process of its own, with a gpupool client
name of its own, spoken to a line at a time on its stdin and stdout. workers() kills what is
still running when the driver is done, so that a failed run leaves no process holding GPU
memory."""
import contextlib
import os
import subprocess
import sys


class Worker:
    def __init__(self, name, argv):
        self.name = name
        self.proc = subprocess.Popen([sys.executable] + argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=dict(os.environ, GPUPOOL_CLIENT_NAME=name))

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def read(self):
        """The worker's next line, stripped; RuntimeError if it ended instead."""
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: the process ended (exit status {self.proc.wait()})")
        return line.strip()

    def ready(self):
        """The words after "ready", which the worker prints once it is set up."""
        words = self.read().split()
        if not words or words[0] != "ready":
            raise RuntimeError(f"{self.name}: expected 'ready', got {' '.join(words)!r}")
        return words[1:]

    def finish(self):
        """Waits for the worker's exit; RuntimeError unless it is 0."""
        if self.proc.wait() != 0:
            raise RuntimeError(f"{self.name}: exit status {self.proc.returncode}")


@contextlib.contextmanager
def workers(specs):
    """Starts a Worker per (name, argv) and kills, at the end, those still running."""
    started = []
    try:
        for name, argv in specs:
            started.append(Worker(name, argv))
        yield started
    finally:
        for w in started:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
