"""The bench's results as Markdown (the README's table) and as a PNG plot."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent / "README.md"
BEGIN, END = "<!-- bench:latest:begin -->", "<!-- bench:latest:end -->"
LABELS = {
    "noop": "Spark `noop` sink",
    "toarrow": "foreachBatch: only `toArrow()`",
    "tasks-arrow": "foreachBatch: tasks only read their Arrow batches in Python",
    "alo-chdb-hand": "hand-written at-least-once: `toArrow()` + `insert_arrow` per table (chdb)",
    "alo-chdb-sink": "sink's writers, at-least-once (no journal), chdb",
    "eo-chdb-file": "`ExactlyOnceSink` -> chdb, file store",
    "eo-chdb-redis": "`ExactlyOnceSink` -> chdb, Redis store",
    "alo-null-starrocks": "sink's writers in tasks, at-least-once -> null server (StarRocks)",
    "eo-null-starrocks": "`ExactlyOnceSink`, writers in tasks -> null server (StarRocks), file store",
    "alo-null-doris": "sink's writers in tasks, at-least-once -> null server (Doris)",
    "eo-null-doris": "`ExactlyOnceSink`, writers in tasks -> null server (Doris), file store",
    "eo-null-doris-arrow": "`ExactlyOnceSink`, writers in tasks -> null server (Doris, format arrow), file store",
    "eo-null-spread-starrocks": "`ExactlyOnceSink`, writers in tasks -> null server (StarRocks), every batch spread (forced)",
}


def _phase(result: dict[str, Any], key: str) -> str:
    values = [p.get(key) for p in result.get("phases", []) if p.get(key) is not None]
    return f"{sum(values):.2f}" if values else ""


def table(data: dict[str, Any]) -> str:
    m, c = data["machine"], data["config"]
    lines = [
        f"Run of {data['date']} ({data['size']}): {c['events']:,} events of {c['event_bytes']} bytes, {c['partitions']} partitions, "
        f"{c['batches']} batches of {c['max_offsets_per_trigger']:,} (availableNow), Spark {c['spark_master']}; "
        f"{m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB, load average at start {m['load_average_at_start'][0]:.2f}; "
        f"pyspark {m['pyspark']}, pyarrow {m['pyarrow']}, chdb {m['chdb']}, Kafka {m['kafka']}, Python {m['python']}. "
        f"Whole run {data['elapsed_s']:.0f} s.",
        "",
        "| mode | seconds | rows/s | x noop | write s | commit s | driver RSS MiB | workers RSS MiB (sum) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in data.get("throughput", []):
        rss = r["rss_mib"]
        ratio = "n/a" if r["vs_noop"] is None else f"{r['vs_noop']:.2f}"
        lines.append(
            f"| {LABELS.get(r['mode'], r['mode'])} | {r['seconds']:.1f} | {r['rows_per_s']:,.0f} | {ratio} | "
            f"{_phase(r, 'write_s')} | {_phase(r, 'commit_s')} | {rss.get('driver_python', 0):.0f} | "
            f"{rss.get('python_workers_sum', 0):.0f} |"
        )
    null_modes = [r for r in data.get("throughput", []) if r.get("null_server")]
    if null_modes:
        lines += ["", "What reached the null server:", "",
                  "| mode | body bytes/row | transactions | requests | `_schema` reads |", "| --- | ---: | ---: | ---: | ---: |"]
        for r in null_modes:
            n = r["null_server"]
            lines.append(f"| {r['mode']} | {n['wire_bytes_per_row']:.1f} | {n['transactions']:,} | {n['requests']:,} | "
                         f"{n['schema_requests']:,} |")
    if data.get("goals"):
        lines += ["", "| goal | measured | bound | met |", "| --- | ---: | ---: | --- |"]
        for g in data["goals"]:
            value = "n/a" if g["value"] is None else (f"{g['value']:,.0f}" if g["unit"] == "rows/s" else f"{g['value']}")
            extra = f" ({g['worst']})" if g.get("worst") else ""
            if g.get("rounds"):
                extra = f" (rounds {min(g['rounds'])}–{max(g['rounds'])})"
            met = "n/a" if g["met"] is None else ("met" if g["met"] else "**not met**")
            lines.append(f"| {g['goal']} | {value} {g['unit']}{extra} | {g['bound']:,} {g['unit']} | {met} |")
    if data.get("commit_phase"):
        lines += ["", "Commit phase alone (PREPARED record -> COMMITTED, file store, null server; median of 3), ms:", "",
                  "| N | " + " | ".join(str(r["n"]) for r in data["commit_phase"] if r["target"] == "starrocks") + " |",
                  "| --- |" + " ---: |" * len([r for r in data["commit_phase"] if r["target"] == "starrocks"])]
        for kind in ("starrocks", "doris"):
            rows = [r for r in data["commit_phase"] if r["target"] == kind]
            if rows:
                lines.append(f"| {kind} | " + " | ".join(f"{r['phase_s'] * 1000:.0f}" for r in rows) + " |")
        goal_row = [r for r in data["commit_phase"] if r["target"] == "starrocks"]
        lines.append("| goal | " + " | ".join(f"{r['goal_s'] * 1000:.0f}" for r in goal_row) + " |")
    if data.get("encode_send"):
        lines += ["", "Encode + send, one thread against the null server (rows per CPU-second of the client thread; "
                  "body bytes per row as the server received them):", "",
                  "| target | format | what | rows | rows/CPU-s | rows/s wall | body bytes/row |",
                  "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
        for r in data["encode_send"]:
            wire = f"{r['wire_bytes_per_row']:.1f}" if "wire_bytes_per_row" in r else ""
            lines.append(f"| {r['target']} | {r.get('format', 'csv')} | {r['what']} | {r['rows']:,} | {r['rows_per_cpu_s']:,.0f} | "
                         f"{r['rows_per_s']:,.0f} | {wire} |")
        arrow = next((r["arrow_bytes_per_row"] for r in data["encode_send"] if "arrow_bytes_per_row" in r), None)
        if arrow is not None:
            lines += ["", f"The written columns take {arrow:.1f} bytes per row as Arrow in memory."]
    if data.get("memory"):
        lines += ["", "Peak RSS (MiB) as the batch grows (1x = events/100 rows per batch):", "",
                  "| mode | scale | rows/batch | driver Python | driver JVM | largest worker | workers (sum) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in data["memory"]:
            rss = r["rss_mib"]
            lines.append(f"| {r['mode']} | {r['scale']}x | {r['batch_rows']:,} | {rss.get('driver_python', 0):.0f} | "
                         f"{rss.get('driver_jvm', 0):.0f} | {rss.get('python_worker', 0):.0f} | {rss.get('python_workers_sum', 0):.0f} |")
    if data.get("restart"):
        lines += ["", "Restart on an existing checkpoint: process start -> first batch committed:", "",
                  "| mode | seconds | vs noop |", "| --- | ---: | ---: |"]
        for r in data["restart"]:
            lines.append(f"| {r['mode']} | {r['first_batch_after_launch_s']:.1f} | {r['vs_noop_s']:+.1f} s |")
    return "\n".join(lines)


def update_readme(data: dict[str, Any], stem: str) -> None:
    """Replace the README's latest-run block with this run's table and plot."""
    text = README.read_text()
    block = f"{BEGIN}\n{table(data)}\n\n![latest run](results/{stem}.png)\n\nRaw: [results/{stem}.json](results/{stem}.json)\n{END}"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
    README.write_text(pattern.sub(lambda _: block, text) if pattern.search(text) else text + "\n" + block + "\n")


def plot(data: dict[str, Any], path: Path) -> None:
    """Four panels: throughput x noop, commit phase vs N, peak RSS vs batch size, restart time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    ax = axes[0][0]
    tp = data.get("throughput", [])
    ax.barh([r["mode"] for r in tp][::-1], [r["vs_noop"] for r in tp][::-1], color="tab:blue")
    ax.axvline(0.8, color="tab:red", linestyle="--", label="goal 0.8 x noop")
    ax.set_xlabel("throughput relative to Spark's noop sink (same run)")
    ax.legend(loc="lower right")
    ax = axes[0][1]
    for kind in ("starrocks", "doris"):
        rows = [r for r in data.get("commit_phase", []) if r["target"] == kind]
        if rows:
            ax.plot([r["n"] for r in rows], [r["phase_s"] * 1000 for r in rows], marker="o", label=kind)
    rows = [r for r in data.get("commit_phase", []) if r["target"] == "starrocks"]
    if rows:
        ax.plot([r["n"] for r in rows], [r["goal_s"] * 1000 for r in rows], "r--", label="goal 20 ms + 2 ms/txn")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prepared transactions N")
    ax.set_ylabel("commit phase, ms")
    ax.legend()
    ax = axes[1][0]
    for mode in sorted({r["mode"] for r in data.get("memory", [])}):
        rows = [r for r in data["memory"] if r["mode"] == mode]
        for role, style in (("driver_python", "-o"), ("python_worker", "--s")):
            ax.plot([r["batch_rows"] for r in rows], [r["rss_mib"].get(role, 0) for r in rows], style, label=f"{mode}: {role}")
    ax.set_xscale("log")
    ax.set_xlabel("rows per batch")
    ax.set_ylabel("peak RSS, MiB")
    ax.legend(fontsize=8)
    ax = axes[1][1]
    restart = data.get("restart", [])
    if restart:
        ax.bar([r["mode"] for r in restart], [r["first_batch_after_launch_s"] for r in restart], color="tab:green")
        ax.set_ylabel("process start -> first batch committed, s")
    else:
        ax.text(0.5, 0.5, "restart not measured in this run", ha="center", va="center")
    fig.suptitle(f"streaming-sink bench {data['date']} ({data['size']}, {data['config']['events']:,} events, "
                 f"{data['machine']['cores']} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
