"""`make demo`: the whole promise, end to end, on local disk plus an embedded S3 server.

1. examples/papers_agent.py — 500 papers; the first process is rate-limited at paper 347,
   exhausts its retries and exits 1; a second process resumes at 347 and finishes with
   exactly 500 real tool calls.
2. examples/machine_loss.py — the agent mirrors restore points to the embedded S3 server
   while it works; the machine is lost at paper 347; the run is restored elsewhere and ends.
3. The finished store is checked with `ckptfs verify --data`.

Exits 0 only if every part told the truth.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def part(title: str, cmd: list[str]) -> bool:
    print(f"\n=== {title} ===", flush=True)
    t0 = time.time()
    ok = subprocess.run(cmd, cwd=ROOT).returncode == 0
    print(f"--- {'ok' if ok else 'FAILED'} in {time.time() - t0:.1f}s", flush=True)
    return ok


def main() -> int:
    work = ROOT / ".demo"
    shutil.rmtree(work, ignore_errors=True)
    store = work / "papers" / "store"
    results = [
        part("1. crash at paper 347, resume at 347",
             [PY, "examples/papers_agent.py", "--store", str(store),
              "--workdir", str(work / "papers" / "work")]),
        part("2. machine loss: restore from the embedded S3 mirror, finish elsewhere",
             [PY, "examples/machine_loss.py", "--workdir", str(work / "machine-loss")]),
        part("3. nightly check of the finished store: ckptfs verify --data",
             [str(Path(PY).parent / "ckptfs"), "verify", str(store), "--data"]),
    ]
    print("\ndemo:", "all claims held" if all(results) else "SOMETHING FAILED")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
