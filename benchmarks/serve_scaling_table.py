"""The table of benchmarks/run_serve_scaling_gpu.sh: each `sdaccel loadtest` report in a folder (gpus-N.json for
`serve --gpus`, ray-N.json for the Ray Serve deployment) as one row, with its images/min against one GPU's of the
same kind and Ray's against `--gpus` at the same count.

    python benchmarks/serve_scaling_table.py OUT_DIR
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def rows(folder: Path) -> list[dict]:
    found = []
    for path in sorted(folder.glob("*.json")):
        match = re.fullmatch(r"(gpus|ray)-(\d+)\.json", path.name)
        if not match:
            continue
        report = json.loads(path.read_text())
        load = report["load"]
        found.append(dict(kind=match.group(1), count=int(match.group(2)), clients=load["clients"], ok=load["ok"],
                          errors=sum(load["errors"].values()), images_per_min=load["images_per_min"],
                          p50=load["latency_p50_s"], p99=load["latency_p99_s"], ready=report.get("server_ready_s")))
    return sorted(found, key=lambda r: (r["kind"] != "gpus", r["count"]))


def table(found: list[dict]) -> str:
    one = {r["kind"]: r for r in found if r["count"] == 1}
    by_count = {r["count"]: r for r in found if r["kind"] == "gpus"}

    def ms(value):
        return "-" if value is None else f"{value * 1000:.0f}"

    lines = ["| server | GPUs | clients | ok | errors | images/min | vs 1 GPU | Ray vs --gpus | p50 ms | p99 ms | "
             "p99 vs 1 GPU | ready s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in found:
        base = one.get(r["kind"])
        scaling = f"{r['images_per_min'] / base['images_per_min']:.2f}x" if base else "-"
        p99 = f"{r['p99'] / base['p99'] - 1:+.0%}" if base and base["p99"] and r["p99"] else "-"
        peer = by_count.get(r["count"]) if r["kind"] == "ray" else None
        versus = f"{r['images_per_min'] / peer['images_per_min'] - 1:+.1%}" if peer else "-"
        ready = "-" if r["ready"] is None else f"{r['ready']:.1f}"
        lines.append(f"| {'--gpus' if r['kind'] == 'gpus' else 'Ray Serve'} | {r['count']} | {r['clients']} | "
                     f"{r['ok']} | {r['errors']} | {r['images_per_min']:.1f} | {scaling} | {versus} | {ms(r['p50'])} | "
                     f"{ms(r['p99'])} | {p99} | {ready} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python benchmarks/serve_scaling_table.py OUT_DIR")
    print(table(rows(Path(sys.argv[1]))))
