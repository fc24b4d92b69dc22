"""Which directory changes wake the file provider, and which it drops.

The provider watches the parent of each input directory (to see the directory
itself replaced) and the directories of referenced files. Something else
written there, such as the operator's own log next to its kubeconfig
directory, must not cost a pass over every file; before this was filtered,
each pass's log line woke the next pass, forever.
"""

from __future__ import annotations

from pathlib import Path

from file_helpers import dump, engaged, kubeconfig, provider_for, running, write_atomic
from watchfiles import Change

from mcruntime.testing import Fleet, wait_until
from mcruntime_file import DEFAULT_INCLUDE
from mcruntime_file._interest import Interest
from mcruntime_file._scan import find_files
from mcruntime_file._watch import HEALTHY_WATCH, failures_after

ADDED = Change.added


def test_an_input_directory_counts_itself_and_its_matching_entries(tmp_path: Path) -> None:
    members = tmp_path / "members"
    members.mkdir()
    interest = find_files([members], DEFAULT_INCLUDE, recursive=False).interest
    assert interest(ADDED, str(members / "east.kubeconfig"))
    assert interest(ADDED, str(members / "..data"))  # a Secret volume's swap
    assert interest(ADDED, str(members))  # the directory replaced
    assert not interest(ADDED, str(members / "notes.txt"))
    assert not interest(ADDED, str(tmp_path / "operator.log"))  # beside the input: the parent is watched
    assert not interest(ADDED, str(tmp_path / ".operator.log.swp"))


def test_a_named_file_counts_itself_and_its_directory_s_dot_entries(tmp_path: Path) -> None:
    named = tmp_path / "secret" / "kubeconfig"
    interest = find_files([named], DEFAULT_INCLUDE, recursive=False).interest
    assert interest(ADDED, str(tmp_path / "secret"))  # created on the way to the file
    assert interest(ADDED, str(named))
    assert interest(ADDED, str(tmp_path / "secret" / "..data"))
    assert not interest(ADDED, str(tmp_path / "secret" / "other.kubeconfig"))  # not searched: named only


def test_a_recursive_search_counts_everything_below(tmp_path: Path) -> None:
    interest = find_files([tmp_path / "tree"], ["*.kubeconfig"], recursive=True).interest
    assert not interest(ADDED, str(tmp_path / "tree" / "notes.txt"))  # not yet a directory: a named path
    (tmp_path / "tree").mkdir()
    interest = find_files([tmp_path / "tree"], ["*.kubeconfig"], recursive=True).interest
    assert interest(ADDED, str(tmp_path / "tree" / "a" / "b" / "notes"))
    assert not interest(ADDED, str(tmp_path / "treetop"))  # a prefix of the name is not below it


def test_referenced_directories_count_every_entry(tmp_path: Path) -> None:
    certificates = tmp_path / "pki"
    interest = Interest.of(directories=[], files=[tmp_path / "config"], recursive=False, include=())
    assert not interest(ADDED, str(certificates / "client.crt"))
    widened = interest.including([certificates])
    assert widened(ADDED, str(certificates / "client.crt"))
    assert widened.including([certificates]) is widened


async def test_writes_beside_the_input_directory_do_not_wake_the_provider(
    tmp_path: Path, fleet: Fleet
) -> None:
    members = tmp_path / "members"
    members.mkdir()
    east = members / "east.kubeconfig"
    write_atomic(east, dump(kubeconfig(("east", fleet["cluster-1"], None))))
    provider = provider_for(members)
    async with running(provider):
        await engaged(provider, f"{east}/east")
        watcher = provider._watcher
        assert watcher is not None
        log_file, before = tmp_path / "operator.log", watcher.ignored

        def logged_and_dropped() -> bool:  # the watches start after the first pass: write until one is seen
            with log_file.open("a") as log:
                log.write("a line the operator logged\n")  # in the watched parent
            return watcher.ignored > before

        await wait_until(logged_and_dropped, what="a log line beside the inputs dropped")
        dropped = watcher.ignored
        (members / "notes.txt").write_text("not a kubeconfig\n")
        west = members / "west.kubeconfig"
        write_atomic(west, dump(kubeconfig(("west", fleet["cluster-2"], None))))
        await engaged(provider, f"{west}/west")
        # The watch is live, so the note's change came before the kubeconfig's: its batch or an earlier one
        # dropped it.
        assert watcher.ignored > dropped


def test_a_watch_that_worked_for_a_while_starts_its_backoff_afresh() -> None:
    # Failing soon after it starts, again and again: each failure backs off further.
    assert [failures_after(count, 0.5) for count in range(4)] == [1, 2, 3, 4]
    # Failing after a long healthy run: a first failure again (WARNING, the first delay).
    assert failures_after(7, HEALTHY_WATCH) == 1
    assert failures_after(7, HEALTHY_WATCH - 0.1) == 8
