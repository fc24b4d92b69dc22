"""The benchmark's sizes: a full run's, and the smoke run's that exercises every path quickly."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    """Every size of a run, so the smoke run is the full run made small."""

    planes: int
    bulk_objects: int  # ConfigMaps per plane in BULK (S1, S2, S6)
    small_objects: int  # ConfigMaps per plane in SMALL (S3, S4, S5)
    s1_repeats: int
    s2_rate: float  # writes per second, over all clusters
    s2_seconds: float  # per repeat
    s2_repeats: int
    s3_rounds: int
    s4_steps: tuple[int, ...]
    s5_cycles: int
    s6_repeats: int
    writes_objects: int  # S7: ConfigMaps per plane, each patched once per run
    writes_workers: int
    writes_repeats: int
    cpu_rate: float  # S8: watch events per second
    cpu_seconds: float
    cpu_repeats: int  # S8 runs per peer, the order drawn anew each round
    fleet_clusters: int  # S9: kubeconfigs, one token user each, over every plane
    fleet_objects: int  # ConfigMaps per plane in the fleet namespace
    # Idle CPU's window: a whole minute, the API servers' bookmark period (every watch gets one a
    # minute) and two of the file provider's 30 s rescans. 10 s right after the engage fell in
    # the lull before the first bookmarks: 4 to 5 ms/s there, 15 to 60 in later 5 s slices.
    fleet_idle_seconds: float
    gc_objects: int  # S10: ConfigMaps per plane (cached objects = planes x this)
    gc_rate: float
    gc_seconds: float
    hung_rate: float  # S11: writes/s over the two healthy clusters
    hung_seconds: float
    timeout: float  # for any single wait


FULL = Sizes(
    planes=10,
    bulk_objects=1000,
    small_objects=100,
    s1_repeats=3,
    s2_rate=50.0,
    s2_seconds=15.0,
    s2_repeats=2,
    s3_rounds=15,
    s4_steps=(1, 50, 100, 200),
    s5_cycles=50,
    s6_repeats=3,
    writes_objects=1000,
    writes_workers=4,
    writes_repeats=3,
    cpu_rate=200.0,
    cpu_seconds=15.0,
    cpu_repeats=3,
    fleet_clusters=1000,
    fleet_objects=2,
    fleet_idle_seconds=60.0,
    gc_objects=10_000,
    gc_rate=50.0,
    gc_seconds=15.0,
    hung_rate=10.0,
    hung_seconds=20.0,
    timeout=600.0,
)
SMOKE = Sizes(
    planes=3,
    bulk_objects=40,
    small_objects=5,
    s1_repeats=1,
    s2_rate=20.0,
    s2_seconds=3.0,
    s2_repeats=1,
    s3_rounds=3,
    s4_steps=(1, 4, 8),
    s5_cycles=4,
    s6_repeats=1,
    writes_objects=30,
    writes_workers=4,
    writes_repeats=1,
    cpu_rate=40.0,
    cpu_seconds=3.0,
    cpu_repeats=1,
    fleet_clusters=12,
    fleet_objects=2,
    fleet_idle_seconds=3.0,
    gc_objects=60,
    gc_rate=20.0,
    gc_seconds=3.0,
    hung_rate=5.0,
    hung_seconds=4.0,
    timeout=120.0,
)
