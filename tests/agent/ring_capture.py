"""A test helper: load the agent's kernel program for a port and pids, write every ring
record it produces as a hex line to OUT, and the compiled program's own view of the record
structs as the first line, JSON: each field's offset from the BTF the program was loaded
with (bpftool; bcc's ctypes leaf types flatten a two-dimensional array, so they are not
used). Runs until SIGTERM. Tests only: it writes request bytes to a file.

    python -m tests.agent.ring_capture OUT PORT PID [PID ...]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

from agent.kernel import loader

# the scratch maps whose values are the ring records, by the struct they hold
MAPS = {
    "px_scratch_read": "px_ev_read",
    "px_scratch_resp": "px_ev_resp",
    "px_scratch_wagg": "px_ev_wagg",
    "px_scratch_h2": "px_ev_h2",
    "px_scratch_body": "px_ev_body",
}


def btf_offsets(map_names: dict[str, str]) -> dict[str, dict[str, int]]:
    """For each scratch map (by name), its value struct's fields' byte offsets, nested
    structs' as ``outer.inner``, from the program's BTF as the kernel holds it."""
    maps = json.loads(_bpftool("map", "show"))
    mine = _my_map_ids()  # (another agent on the node has maps of the same names)
    btf_id = next(m["btf_id"] for m in maps if m.get("name") in map_names and m.get("id") in mine)
    types = json.loads(_bpftool("btf", "dump", "id", str(btf_id)))["types"]
    by_id = {t["id"]: t for t in types}
    by_name = {t.get("name"): t for t in types if t.get("kind") == "STRUCT"}

    def struct_of(type_id: int) -> dict[str, Any] | None:
        t = by_id.get(type_id)
        while t is not None and t["kind"] in ("TYPEDEF", "CONST", "VOLATILE"):
            t = by_id.get(t["type_id"])
        return t if t is not None and t["kind"] == "STRUCT" else None

    def walk(t: dict[str, Any], base: int, prefix: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in t["members"]:
            off = base + m["bits_offset"] // 8
            out[prefix + m["name"]] = off
            inner = struct_of(m["type_id"])
            if inner is not None:
                out |= walk(inner, off, prefix + m["name"] + ".")
        return out

    return {s: walk(by_name[s], 0, "") for s in map_names.values()}


def _my_map_ids() -> set[int]:
    """The BPF maps this process holds (their fds' fdinfo)."""
    ids = set()
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            text = open(f"/proc/self/fdinfo/{fd}").read()  # noqa: SIM115
        except OSError:
            continue
        ids |= {int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("map_id:")}
    return ids


def _bpftool(*args: str) -> str:
    return subprocess.run(
        ["bpftool", "-j", *args], capture_output=True, text=True, check=True, timeout=30
    ).stdout


def main() -> None:
    out_path, port, pids = sys.argv[1], int(sys.argv[2]), [int(p) for p in sys.argv[3:]]
    loaded = loader.load(loader.Options(ports=[port], pids=pids))
    b = loaded.bpf
    views = btf_offsets(MAPS)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with open(out_path, "w") as out:
        out.write(json.dumps(views) + "\n")
        out.flush()
        ring = loader.Ring(loaded, lambda raw: out.write(bytes(raw).hex() + "\n"))
        print("ready", flush=True)
        while not stop.wait(0.02):
            ring.drain()
            out.flush()
        ring.drain()
        ring.close()
    loader.detach(b)


if __name__ == "__main__":
    main()
