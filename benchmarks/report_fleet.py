"""RESULTS.md sections for S7-S12, and the goals every scenario is held to.

Each of these scenarios stores, per peer, every run's figures (``runs``) and
their min / median / max (``stats``). Tables show ``median (min-max)``; the
ratio column divides this peer's median by the concurrent Go variant's, the
fair baseline (Go's file provider as shipped engages one cluster at a time).
Goals are computed from the figures here, never written by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BASELINE = "go concurrent"
GO_JSON = "go concurrent json"  # the baseline speaking JSON, as it does to a custom resource (S7, S8)


@dataclass(frozen=True)
class Column:
    """One figure of a table: its key in ``stats``, its heading and digits."""

    key: str
    title: str
    digits: int = 1


@dataclass(frozen=True)
class Section:
    """How one scenario is shown."""

    key: str
    title: str
    columns: tuple[Column, ...]
    headline: str  # the figure the ratio column divides
    better: str  # "higher" or "lower"


_FLEET_COLUMNS = (
    Column("engage_all_s", "engage all (s)", 1),
    Column("rss_per_cluster_mib", "RSS MiB / cluster", 3),
    Column("anon_per_cluster_mib", "anon RSS MiB / cluster", 3),
    Column("heap_per_cluster_mib", "heap MiB / cluster", 3),
    Column("fds", "fds", 0),
    Column("idle_cpu_ms_per_s", "idle CPU ms/s", 1),
    Column("idle_cpu_us_per_s_per_cluster", "idle CPU µs/s per cluster", 1),
    Column("cpu_s", "CPU s", 1),
)

SECTIONS = (
    Section(
        "s7",
        "S7 writes",
        (
            Column("per_second", "patches/s from spawn", 0),
            Column("per_second_after_first", "patches/s after the first", 0),
            Column("cpu_ms_per_reconcile", "CPU ms / reconcile", 2),
            Column("cpu_s", "CPU s", 1),
            Column("rss", "RSS MiB", 0),
            Column("heap", "heap MiB", 0),
        ),
        "per_second",
        "higher",
    ),
    Section(
        "s8",
        "S8 CPU per watch event",
        (
            Column("achieved_rate", "events/s", 0),
            Column("matched", "events seen", 0),
            Column("cpu_ms_per_1000", "CPU ms / 1,000 events", 0),
            Column("p99_ms", "p99 ms", 1),
            Column("rss", "RSS MiB", 0),
        ),
        "cpu_ms_per_1000",
        "lower",
    ),
    Section(
        "s9",
        "S9 a fleet of clusters (1,000 in a full run)",
        _FLEET_COLUMNS,
        "engage_all_s",
        "lower",
    ),
    Section(
        "s12",
        "S12 a large fleet on one replica (10,000 clusters in a full run)",
        (
            Column("clusters_done", "clusters with every object reconciled", 0),
            Column("elapsed_s", "measured at (s from spawn)", 0),
            *_FLEET_COLUMNS,
            Column("first_probe_failures", "first health verdicts unhealthy", 0),
            Column("unhealthy_transitions", "unhealthy verdicts in all", 0),
            Column("thaw_s", "heap thaw after a tenth stopped (s)", 2),
        ),
        "engage_all_s",
        "lower",
    ),
    Section(
        "s10",
        "S10 garbage collection with a large cache",
        (
            Column("p50_ms", "p50 ms", 1),
            Column("p99_ms", "p99 ms", 1),
            Column("max_ms", "max ms", 1),
            Column("matched", "writes seen", 0),
            Column("cpu_ms_per_1000", "CPU ms / 1,000 events", 0),
            Column("heap", "heap MiB", 0),
            Column("rss", "RSS MiB", 0),
        ),
        "p99_ms",
        "lower",
    ),
    Section(
        "s11",
        "S11 one hung cluster of three",
        (
            Column("p50_ms", "healthy p50 ms", 1),
            Column("p99_ms", "healthy p99 ms", 1),
            Column("max_ms", "healthy max ms", 1),
            Column("matched", "healthy writes reconciled", 0),
            Column("writes", "healthy writes", 0),
            Column("hang_s", "hang (s)", 1),
            Column("hung_pending_at_stop", "hung cluster's writes not done when it stopped", 0),
            Column("recovery_s", "hung cluster's work done after SIGCONT (s)", 1),
            Column("cpu_s", "CPU s", 2),
        ),
        "p99_ms",
        "lower",
    ),
)

INTRO = {
    "s7": (
        "{objects:,} ConfigMaps over the planes, each reconciled once by a reconcile that reads it from",
        "the cache and merge-patches `data.observed` (ConfigMaps have no status subresource; the",
        "patch is the status write), {workers} workers; the patch's own watch event is reconciled",
        "too and writes nothing. CPU per reconcile counts the whole process (start and sync too).",
        "Go's queue is one FIFO over the clusters, so it patches a cluster's whole backlog, then the",
        "next's; *mcruntime* is given the same order (`keys_per_turn` as long as a backlog), since",
        "on these ten API servers sharing two cores the order can move the servers' CPU per patch",
        "(by about 5 % in session 32). *mcruntime, turns of 32* is the same peer in the controller's default",
        "order, where the clusters with work take turns of 32 requests.",
    ),
    "s8": (
        "After the initial sync, a writer patches ConfigMaps at {rate:g} events/s for {seconds:g} s;",
        "CPU is the peer's `utime + stime` from the first write until every write's reconcile was",
        "seen, per 1,000 reconciled events. {repeats} runs per peer, the peers' order drawn anew",
        "each round: one run is at the mercy of what the machine did just before it.",
    ),
    "s9": (
        "{clusters:,} kubeconfig files, each with a token user of its own (a ServiceAccount",
        "token, `ControlPlane.add_token_user`), over {planes} API servers; one informer per cluster",
        "({objects} ConfigMaps each). Engage all: spawn until every cluster reconciled its objects.",
        "Per-cluster memory: (RSS with the fleet - RSS of the same peer over an empty directory) / N.",
        "Idle CPU over a quiet period after the sync. Go's file provider as shipped is left out: it",
        "engages one cluster at a time.",
    ),
    "s12": (
        "S9 at the size one replica is meant to carry: {clusters:,} kubeconfig files, a token user",
        "each, over {planes} API servers, one informer per cluster ({objects} ConfigMaps each), all",
        "present when the peer starts. RSS per cluster as in S9 (over the clusters the peer had",
        "engaged, for a peer stopped early). The Go peer (the concurrent variant) is given",
        "{go_seconds:g} s to engage them, mcruntime {timeout:g} s; where a peer has not finished, its",
        "row is where it got by then (no engage-all or idle figure). *First",
        "health verdicts unhealthy*: clusters whose first health verdict (`mcruntime.health`'s log",
        "line) was unhealthy; every cluster here is healthy, so each one is a false alarm. *Unhealthy",
        "verdicts in all* counts every transition to unhealthy until the sample.",
    ),
    "s10": (
        "{cached:,} ConfigMaps cached; after the sync a writer patches them at {rate:g} writes/s",
        "for {seconds:g} s; write -> reconcile-start latency. *mcruntime gc.freeze* is mcruntime",
        "as shipped: the manager calls `gc.collect(); gc.freeze()` once after a burst of cache",
        "syncs, so the cached objects leave the collector's generations; *mcruntime* runs with",
        "`Manager(gc_freeze=False)`.",
    ),
    "s11": (
        "Three clusters; the reconcile reads live (`client.get`; Go: the API reader), default",
        "controller options. While the peer is paused (SIGSTOP), a burst of writes lands in the third",
        "cluster and its kube-apiserver is stopped (SIGSTOP: it hangs, it does not refuse); the",
        "peer resumes with those events in its sockets, so its reconciles of that cluster read",
        "from a server that no longer answers (the table counts them); the writer then patches",
        "the two healthy clusters at {rate:g} writes/s for {seconds:g} s; SIGCONT afterwards, always.",
        "Latencies count the healthy writes reconciled during the hang or within 10 s after the",
        "writer stopped; *-* means none was.",
    ),
}


def _f(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def spread_text(stats: dict[str, dict[str, float]], key: str, digits: int) -> str:
    """``median (min-max)``, or the median alone when there was one run."""
    figure = stats.get(key)
    if figure is None or any(math.isnan(figure[end]) for end in ("min", "median", "max")):
        return "-" if figure is None or math.isnan(figure["median"]) else _f(figure["median"], digits)
    if figure["min"] == figure["max"]:
        return _f(figure["median"], digits)
    return f"{_f(figure['median'], digits)} ({_f(figure['min'], digits)}-{_f(figure['max'], digits)})"


def median(scenario: dict[str, Any], peer: str, key: str) -> float:
    """A peer's median of one figure, NaN when missing."""
    try:
        return float(scenario["peers"][peer]["stats"][key]["median"])
    except (KeyError, TypeError):
        return float("nan")


def ratio(a: float, b: float) -> float:
    """``a / b``, NaN when either is missing or ``b`` is zero."""
    if math.isnan(a) or math.isnan(b) or b == 0:
        return float("nan")
    return a / b


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return [*lines, *("| " + " | ".join(row) + " |" for row in rows), ""]


def section(results: dict[str, Any], spec: Section, load_line: str) -> list[str]:
    """One scenario's heading, description, table and profile (if any)."""
    scenario = results.get(spec.key, {})
    if "error" in scenario:
        return [f"## {spec.title}", "", load_line, f"Failed: `{scenario['error']}`", ""]
    if "peers" not in scenario:
        return []
    facts = {key: value for key, value in scenario.items() if not isinstance(value, dict)}
    facts.setdefault("repeats", 1)  # results of runs from before S8 was repeated
    lines = [f"## {spec.title}", "", load_line]
    lines += [line.format(**facts) for line in INTRO[spec.key]]
    lines += ["", "Figures: median (min-max) over the runs.", ""]
    header = ["", *(column.title for column in spec.columns), f"{spec.headline} ÷ {BASELINE}"]
    rows = []
    baseline = median(scenario, BASELINE, spec.headline)
    for name, data in scenario["peers"].items():
        stats = data.get("stats", {})
        rows.append(
            [
                name,
                *(spread_text(stats, column.key, column.digits) for column in spec.columns),
                _f(ratio(median(scenario, name, spec.headline), baseline), 2),
            ]
        )
    lines += _table(header, rows)
    lines += [f"*{spec.headline}: {spec.better} is better.*", ""]
    lines += profile_lines(scenario)
    return lines


def profile_lines(scenario: dict[str, Any]) -> list[str]:
    """The cProfile summary of an extra mcruntime run, when the scenario has one."""
    profile = scenario.get("profile")
    if not profile:
        return []
    lines = ["### Where mcruntime's time goes (cProfile, one extra run; cProfile slows Python down)", ""]
    if profile.get("source"):
        lines += [f"From {profile['source']}.", ""]
    if profile.get("window") == "idle":
        lines += ["The idle window alone (the engage before it is below):", ""]
    lines += _top_lines(profile["top"])
    if "engage" in profile:
        lines += ["The engage, up to the idle window:", "", *_top_lines(profile["engage"])]
    return lines


def _top_lines(top: dict[str, str]) -> list[str]:
    return [
        "Top functions by own time:",
        "",
        "```",
        top["tottime"],
        "```",
        "",
        "By cumulative time:",
        "",
        "```",
        top["cumulative"],
        "```",
        "",
    ]


def _goal(met: bool | None, text: str) -> str:
    mark = "n/a" if met is None else ("**met**" if met else "**not met**")
    return f"- {mark}: {text}"


def _check(value: float, limit: float, below: bool) -> bool | None:
    if math.isnan(value):
        return None
    return value <= limit if below else value >= limit


IDLE_NEAR_ZERO_MS_PER_S = 20.0  # "near zero": under 2 % of one core for the whole 1,000-cluster fleet


def goals(results: dict[str, Any]) -> list[str]:
    """The issue's targets against the concurrent Go variant, each met, not met or n/a."""
    lines = []
    s1 = results.get("s1", {})
    if "peers" in s1:
        mc = s1["peers"].get("mcruntime", {}).get("per_second", float("nan"))
        go = s1["peers"].get(BASELINE, {}).get("per_second", float("nan"))
        share = ratio(mc, go)
        text = f"S1 ≥ 0.5x {BASELINE}'s reconciles/s: {share:.2f}x"
        lines.append(_goal(_check(share, 0.5, below=False), text))
    lines += _baseline_goal(results, "s7", "per_second", 0.5, False, f"S7 ≥ 0.5x {BASELINE}'s patches/s")
    s8_text = f"S8 CPU per event ≤ 3x {BASELINE}'s"
    lines += _baseline_goal(results, "s8", "cpu_ms_per_1000", 3.0, True, s8_text)
    lines += speed_goals(results)
    s9 = results.get("s9", {})
    if "peers" in s9:
        engage = median(s9, "mcruntime", "engage_all_s")
        lines.append(
            _goal(
                _check(engage, 10.0, below=True),
                f"S9 engage all {s9.get('clusters')} under 10 s: {engage:.1f} s",
            )
        )
        mine = median(s9, "mcruntime", "rss_per_cluster_mib")
        theirs = median(s9, BASELINE, "rss_per_cluster_mib")
        lines.append(
            _goal(
                None if math.isnan(mine) or math.isnan(theirs) else mine <= theirs,
                f"S9 RSS per cluster no more than {BASELINE}'s: {mine:.3f} vs {theirs:.3f} MiB",
            )
        )
        idle = median(s9, "mcruntime", "idle_cpu_ms_per_s")
        lines.append(
            _goal(
                _check(idle, IDLE_NEAR_ZERO_MS_PER_S, below=True),
                f"S9 idle CPU near zero (under {IDLE_NEAR_ZERO_MS_PER_S:g} CPU ms/s for the fleet): "
                f"{idle:.1f} ms/s",
            )
        )
    lines += large_fleet_goals(results)
    s10 = results.get("s10", {})
    if "peers" in s10:
        go = median(s10, BASELINE, "p99_ms")
        for name in ("mcruntime", "mcruntime gc.freeze"):
            times = ratio(median(s10, name, "p99_ms"), go)
            text = f"S10 p99 ≤ 2x {BASELINE}'s, {name}: {times:.2f}x"
            lines.append(_goal(_check(times, 2.0, below=True), text))
        plain, frozen = median(s10, "mcruntime", "p99_ms"), median(s10, "mcruntime gc.freeze", "p99_ms")
        if not (math.isnan(plain) or math.isnan(frozen)):
            winner = "gc.freeze" if frozen < plain else "no freeze"
            lines.append(f"- S10 winner: **{winner}** (p99 {frozen:.1f} ms frozen vs {plain:.1f} ms not)")
    s11 = results.get("s11", {})
    if "peers" in s11:
        p99 = median(s11, "mcruntime", "p99_ms")
        seen, sent = median(s11, "mcruntime", "matched"), median(s11, "mcruntime", "writes")
        every = None if math.isnan(seen) else seen >= sent
        text = f"S11 every healthy write reconciled during the hang: {seen:.0f}/{sent:.0f}"
        if median(s11, "mcruntime", "hung_pending_at_stop") == 0:
            text += " (but none of the hung cluster's work was pending when it stopped: isolation untested)"
        lines.append(_goal(every, text))
        lines.append(_goal(_check(p99, 1000.0, below=True), f"S11 healthy p99 under 1 s: {p99:.0f} ms"))
    return lines


def _baseline_goal(
    results: dict[str, Any], scenario: str, key: str, limit: float, below: bool, text: str
) -> list[str]:
    """A goal on mcruntime's median ``key`` over the baseline's: ``text``, then the ratio."""
    data = results.get(scenario, {})
    if "peers" not in data:
        return []
    times = ratio(median(data, "mcruntime", key), median(data, BASELINE, key))
    return [_goal(_check(times, limit, below=below), f"{text}: {times:.2f}x")]


def speed_goals(results: dict[str, Any]) -> list[str]:
    """Issue 32's goals against the concurrent Go variant: S1's CPU, S7's patches/s, S8's CPU per event."""
    return [
        *_baseline_goal(results, "s1", "cpu_s", 1.5, True, f"S1 CPU ≤ 1.5x {BASELINE}'s"),
        *_baseline_goal(results, "s7", "per_second", 1.0, False, f"S7 ≥ 1.0x {BASELINE}'s patches/s"),
        *_baseline_goal(results, "s8", "cpu_ms_per_1000", 1.0, True, f"S8 CPU per event ≤ 1.0x {BASELINE}'s"),
        *_default_turns(results),
        *_json_ratio(results, "s7", "per_second", "S7 patches/s"),
        *_json_ratio(results, "s8", "cpu_ms_per_1000", "S8 CPU per event"),
    ]


def _default_turns(results: dict[str, Any]) -> list[str]:
    """S7 with our peer in the controller's default order, beside the goal (which takes Go's order)."""
    data = results.get("s7", {})
    variant = next((name for name in data.get("peers", {}) if name.startswith("mcruntime, turns of ")), None)
    if variant is None:
        return []
    times = ratio(median(data, variant, "per_second"), median(data, BASELINE, "per_second"))
    return [
        f"- S7 patches/s of {variant} (the controller's default: clusters take turns; the goal's peer"
        f" takes Go's order, a cluster's backlog in a row): {times:.2f}x"
    ]


def _json_ratio(results: dict[str, Any], scenario: str, key: str, text: str) -> list[str]:
    """Our median over the baseline's on JSON: a figure beside the goals, not one of them."""
    data = results.get(scenario, {})
    if "peers" not in data or GO_JSON not in data["peers"]:
        return []
    times = ratio(median(data, "mcruntime", key), median(data, GO_JSON, key))
    return [f"- {text} against {GO_JSON} (the same runtime on JSON, as for a custom resource): {times:.2f}x"]


S12_ENGAGE_S = 60.0
S12_RSS_PER_CLUSTER_MIB = 0.25
S12_IDLE_MS_PER_S = 50.0


def large_fleet_goals(results: dict[str, Any]) -> list[str]:
    """S12's goals (issue 32): engage, memory, idle CPU and health of 10,000 clusters on one replica.

    A peer that did not engage every cluster misses the engage goal, and its
    memory and idle figures are of a fleet still engaging: those goals are n/a.
    """
    s12 = results.get("s12", {})
    if "peers" not in s12:
        return []
    count = s12.get("clusters", 0)
    done = median(s12, "mcruntime", "clusters_done")
    finished = not math.isnan(done) and done >= count
    engage = median(s12, "mcruntime", "engage_all_s")
    rss = median(s12, "mcruntime", "rss_per_cluster_mib")
    idle = median(s12, "mcruntime", "idle_cpu_ms_per_s")
    failed = median(s12, "mcruntime", "first_probe_failures")
    if finished:
        engaged = _goal(
            _check(engage, S12_ENGAGE_S, below=True),
            f"S12 engage all {count:,} under {S12_ENGAGE_S:g} s: {engage:.1f} s",
        )
    else:
        at = median(s12, "mcruntime", "elapsed_s")
        engaged = _goal(
            None if math.isnan(done) else False,
            f"S12 engage all {count:,} under {S12_ENGAGE_S:g} s: {done:,.0f} synced at {at:.0f} s",
        )
    unfinished = "" if finished else " (n/a: not every cluster engaged)"
    lines = [
        engaged,
        _goal(
            _check(rss, S12_RSS_PER_CLUSTER_MIB, below=True) if finished else None,
            f"S12 RSS per cluster ≤ {S12_RSS_PER_CLUSTER_MIB} MiB: {rss:.3f} MiB{unfinished}",
        ),
        _goal(
            _check(idle, S12_IDLE_MS_PER_S, below=True) if finished else None,
            f"S12 idle CPU of the fleet under {S12_IDLE_MS_PER_S:g} CPU ms/s: {idle:.1f} ms/s{unfinished}",
        ),
        _goal(
            _check(failed, 0.0, below=True),
            f"S12 no healthy cluster's first health verdict unhealthy: {failed:,.0f} were",
        ),
    ]
    theirs = median(s12, BASELINE, "clusters_done")
    if not math.isnan(theirs):
        at = median(s12, BASELINE, "elapsed_s")
        lines.append(f"- S12 {BASELINE}: {theirs:,.0f} of {count:,} clusters fully reconciled at {at:.0f} s")
    return lines


def losing(results: dict[str, Any]) -> list[str]:
    """Scenarios whose goal against Go mcruntime misses: they get a profile."""
    lost = []
    for line in goals(results):
        if "**not met**" in line:
            name = line.split(": ", 1)[1].split(" ", 1)[0].lower()
            if name not in lost:
                lost.append(name)
    return lost
