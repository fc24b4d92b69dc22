"""S13's section of RESULTS.md and its goal: admission latency added by a webhook, mcruntime vs Go."""

from __future__ import annotations

import math
from typing import Any

from report_fleet import spread_text

GO = "go"
GOAL_TIMES = 2.0


def _median(scenario: dict[str, Any], peer: str, key: str) -> float:
    stats = scenario.get("peers", {}).get(peer, {}).get("stats", {})
    value = stats.get(key, {}).get("median")
    return float(value) if value is not None else float("nan")


def goal(results: dict[str, Any]) -> list[str]:
    """``S13 p99 added latency ≤ 2x Go's``, met, not met or n/a."""
    s13 = results.get("s13", {})
    if "peers" not in s13:
        return []
    mine, theirs = _median(s13, "mcruntime", "added_p99_ms"), _median(s13, GO, "added_p99_ms")
    if math.isnan(mine) or math.isnan(theirs):
        return [f"- n/a: S13 p99 added admission latency ≤ {GOAL_TIMES:g}x Go's (no Go run)"]
    # Added latency near zero (or below it, in noise) makes a ratio meaningless: compare with the limit.
    met = mine <= GOAL_TIMES * max(theirs, 0.0)
    mark = "**met**" if met else "**not met**"
    return [
        f"- {mark}: S13 p99 added admission latency ≤ {GOAL_TIMES:g}x Go's: "
        f"{mine:.1f} ms vs {theirs:.1f} ms (mcruntime vs controller-runtime"
        + (f", {mine / theirs:.2f}x)" if theirs > 0 else ")")
    ]


def section(results: dict[str, Any], load_line: str) -> list[str]:
    """The S13 table: per mode requests/s, p50, p99, added p50/p99, webhook CPU per request."""
    s13 = results.get("s13", {})
    title = "## S13 admission webhook, versus controller-runtime"
    if "error" in s13:
        return [title, "", f"Failed: `{s13['error']}`", ""]
    if "peers" not in s13:
        return []
    lines = [
        title,
        "",
        f"A client creates ConfigMaps through one kube-apiserver, {s13['concurrency']} at a time,",
        f"{s13['requests']:,} timed creates per run after a warm-up, {s13['rounds']} round(s); each round",
        "runs *none* (no webhook configured), *mcruntime* (`peers/webhook_peer.py`: a Manager with",
        "one validator, registering its own configuration) and *go* (controller-runtime's",
        "`webhook.Server`, `peers/mcr-go/webhook.go`) in a random order. Both webhooks check one",
        "label; same rules, namespace selector, `failurePolicy: Fail`, timeout. *Added* is a",
        "webhook's figure minus the same round's *none*. CPU is the webhook process's own",
        "(`utime + stime`) per timed request. The client, the API server, etcd and the webhook",
        "share the machine: the figures include their contention.",
        load_line,
        *([f"*{s13['note']}*", ""] if s13.get("note") else []),
        "| | creates/s | p50 (ms) | p99 (ms) | added p50 (ms) | added p99 (ms) | webhook CPU ms/request |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, data in s13["peers"].items():
        stats = data.get("stats", {})
        added = name != "none"
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    spread_text(stats, "per_second", 0),
                    spread_text(stats, "p50_ms", 1),
                    spread_text(stats, "p99_ms", 1),
                    spread_text(stats, "added_p50_ms", 1) if added else "-",
                    spread_text(stats, "added_p99_ms", 1) if added else "-",
                    spread_text(stats, "cpu_ms_per_request", 2) if added else "-",
                ]
            )
            + " |"
        )
    lines += ["", "Median (min-max) over the rounds.", ""]
    lines += goal(results)
    lines.append("")
    return lines
