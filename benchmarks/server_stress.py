"""Abuse of `matlint server` over stdio, as a raw client writing bytes: malformed JSON-RPC, unknown
methods, huge documents, a very long line and bursts of edits. After each, the server must still
answer a request and publish correct diagnostics for a normal document.

    python benchmarks/server_stress.py [--burst 500] [--huge-mb 10] [--long-line 1000000]

Prints one line per scenario (what was sent, how long the answer took) and exits 1 when one
fails. tests/test_server.py runs the same scenarios at CI size.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SERVER = [sys.executable, "-m", "matlint", "server"]

# One MAT101 finding (a matmul per loop item) on line 6.
LOOP = ("import torch\nx = torch.randn(4, 3, 3)\nw = torch.randn(3, 3)\nys = []\n"
        "for i in range(4):\n    ys.append(x[i] @ w)\n")
LOOP_ROW = 5  # 0-based line of the finding


def frame(message) -> bytes:
    payload = message if isinstance(message, bytes) else json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(payload) + payload


class LspProcess:
    """`matlint server` in a subprocess; a thread reads its messages into a queue."""

    def __init__(self, root: Path, command=SERVER):
        self.root = root
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, cwd=root)
        self.messages: queue.Queue = queue.Queue()
        self.responses: dict = {}
        self.published: dict = {}    # uri -> list of (version, diagnostics, time received)
        self.logs: list = []
        self._next_id = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        stream = self.proc.stdout
        while True:
            length = None
            while True:
                line = stream.readline()
                if not line:
                    self.messages.put(None)
                    return
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
                elif line == b"\r\n" and length is not None:
                    break
            message = json.loads(stream.read(length))
            received = time.perf_counter()
            if message.get("method") == "textDocument/publishDiagnostics":
                params = message["params"]
                self.published.setdefault(params["uri"], []).append(
                    (params.get("version"), params["diagnostics"], received))
            elif message.get("method") == "window/logMessage":
                self.logs.append(message["params"]["message"])
            elif "id" in message and "method" not in message:
                self.responses[message["id"]] = message
            elif "id" in message:  # a request from the server (configuration, registration)
                result = [None] * len(message["params"].get("items", [])) \
                    if message["method"] == "workspace/configuration" else None
                self.send({"jsonrpc": "2.0", "id": message["id"], "result": result})
            self.messages.put(message)

    # -- sending ------------------------------------------------------------------------------
    def send_bytes(self, data: bytes):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, *messages):
        self.send_bytes(b"".join(frame(m) for m in messages))

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def request(self, method: str, params=None) -> int:
        id_ = self.new_id()
        self.send({"jsonrpc": "2.0", "id": id_, "method": method, "params": params if params is not None else {}})
        return id_

    def notify(self, method: str, params):
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    # -- waiting ------------------------------------------------------------------------------
    def wait(self, ready, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while True:
            value = ready()
            if value is not None:
                return value
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from the server in time")
            if self.messages.get(timeout=left) is None:
                raise ConnectionError(f"the server exited (code {self.proc.wait()})")

    def response(self, id_: int, timeout: float = 30.0) -> dict:
        return self.wait(lambda: self.responses.get(id_), timeout)

    def call(self, method: str, params=None, timeout: float = 30.0) -> dict:
        return self.response(self.request(method, params), timeout)

    def diagnostics(self, uri: str, version: int, timeout: float = 60.0) -> list:
        """The first diagnostics published for `version` of `uri`."""
        def ready():
            for v, diagnostics, _ in self.published.get(uri, ()):
                if v == version:
                    return diagnostics
            return None
        return self.wait(ready, timeout)

    # -- the LSP conversation -----------------------------------------------------------------
    def initialize(self, options=None):
        reply = self.call("initialize", {"processId": None, "rootUri": self.root.as_uri(), "capabilities": {},
                                         "initializationOptions": options})
        self.notify("initialized", {})
        return reply

    def open(self, path: Path, text: str, version: int = 1) -> str:
        uri = path.as_uri()
        self.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "python", "version": version, "text": text}})
        return uri

    def change(self, uri: str, version: int, text: str):
        self.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                               "contentChanges": [{"text": text}]})

    def close(self):
        try:
            if self.proc.poll() is None:
                self.call("shutdown", None, timeout=30)
                self.notify("exit", None)
                return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# -- checks ---------------------------------------------------------------------------------------

def still_serving(client: LspProcess, name: str = "after.py") -> float:
    """Opens a fresh document with one finding: returns seconds until its correct diagnostics."""
    start = time.perf_counter()
    uri = client.open(client.root / name, LOOP)
    diagnostics = client.diagnostics(uri, 1)
    codes = [(d["code"], d["range"]["start"]["line"]) for d in diagnostics]
    assert codes == [("MAT101", LOOP_ROW)], codes
    hover = client.call("textDocument/hover", {"textDocument": {"uri": uri},
                                               "position": {"line": LOOP_ROW, "character": 16}})
    assert "MAT101" in hover["result"]["contents"]["value"], hover
    return time.perf_counter() - start


def burst(client: LspProcess, edits: int, name: str = "burst.py", prefix: str = "") -> dict:
    """`edits` didChange in one write, alternating between text with and without a finding;
    the last version has the finding on a line that moves with the edit count. `prefix`, code
    without findings, comes first in every version (a longer document)."""
    uri = client.open(client.root / name, prefix + "import torch\n")
    client.diagnostics(uri, 1, timeout=600)
    texts = []
    for version in range(2, edits + 2):
        texts.append(prefix + "#\n" * (version % 7) + (LOOP if version % 2 else "import torch\n"))
    last = edits + 1
    start = time.perf_counter()
    client.send(*({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {
        "textDocument": {"uri": uri, "version": v}, "contentChanges": [{"text": t}]}}
        for v, t in zip(range(2, last + 1), texts)))
    hover_id = client.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 0}})
    client.response(hover_id, timeout=120)
    answered = time.perf_counter() - start
    diagnostics = client.diagnostics(uri, last, timeout=120)
    published_last = time.perf_counter() - start
    time.sleep(0.5)  # anything published late would land now
    versions = [v for v, _, _ in client.published[uri]]
    expected = [("MAT101", prefix.count("\n") + last % 7 + LOOP_ROW)] if last % 2 else []
    got = [(d["code"], d["range"]["start"]["line"]) for d in diagnostics]
    assert got == expected, (got, expected)
    assert versions[-1] == last, versions[-5:]
    assert versions == sorted(versions), "diagnostics of an older version were published after a newer one"
    return {"edits": edits, "lines": texts[-1].count("\n"), "request_answered_s": answered, "last_version_published_s": published_last,
            "publications": len(versions) - 1}


def huge_document(client: LspProcess, text: str, name: str) -> dict:
    """Opens `text`, waits for its diagnostics; returns the time and what was published."""
    start = time.perf_counter()
    uri = client.open(client.root / name, text)
    diagnostics = client.diagnostics(uri, 1, timeout=600)
    return {"bytes": len(text.encode()), "published_s": time.perf_counter() - start,
            "codes": sorted({d.get("code", "") for d in diagnostics}), "count": len(diagnostics),
            "messages": sorted({d["message"] for d in diagnostics if "code" not in d})}


def big_module(target_bytes: int) -> str:
    """Real-looking code, LOOP's finding once per block: about `target_bytes` long."""
    block = ("\n\ndef f{n}(x, w):\n    ys = []\n    for i in range(4):\n        ys.append(x[i] @ w)\n"
             "    return torch.stack(ys)\n")
    parts, size, n = ["import torch\n"], 0, 0
    while size < target_bytes:
        part = block.format(n=n)
        parts.append(part)
        size += len(part)
        n += 1
    return "".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--burst", type=int, default=500, help="didChange notifications in one burst")
    p.add_argument("--burst-lines", type=int, default=2000, help="lines of the document of the second burst")
    p.add_argument("--huge-mb", type=float, default=10.0, help="size of the huge document")
    p.add_argument("--large-mb", type=float, default=1.0, help="size of a large document still linted")
    p.add_argument("--long-line", type=int, default=1_000_000, help="characters on the long line")
    opts = p.parse_args(argv)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "pyproject.toml").write_text("[project]\nname = 'p'\n")
        client = LspProcess(root)
        try:
            client.initialize()
            scenarios = {
                "burst": lambda: burst(client, opts.burst),
                "burst, long document": lambda: burst(
                    client, opts.burst, "burst_long.py", big_module(opts.burst_lines * 15)),
                "large document": lambda: huge_document(
                    client, big_module(int(opts.large_mb * 2**20)), "large.py"),
                "huge document": lambda: huge_document(
                    client, big_module(int(opts.huge_mb * 2**20)), "huge.py"),
                "long line (string)": lambda: huge_document(
                    client, "import torch\nx = '" + "a" * opts.long_line + "'\n", "long_string.py"),
                "long line (list)": lambda: huge_document(
                    client, "import torch\nx = [" + "0, " * (opts.long_line // 3) + "]\n", "long_list.py"),
            }
            for n, (name, scenario) in enumerate(scenarios.items()):
                try:
                    result = scenario()
                    after = still_serving(client, f"after{n}.py")
                    print(f"{name:20} {json.dumps(result)}  then a normal document in {after:.2f} s", flush=True)
                except Exception as exc:  # report and go on with the next scenario
                    failures += 1
                    print(f"{name:20} FAILED: {type(exc).__name__}: {exc}", flush=True)
        finally:
            code = client.close()
        print(f"server exit code {code}; {failures} failure(s)")
    return 1 if failures or code != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
