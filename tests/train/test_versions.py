"""Policy versions are never reused across a crash and a resume (train/versions.py): a resumed trainer numbers on past
every version it published or the buffer holds, and an episode of a lost version is stale, never fresh."""

import json
from types import SimpleNamespace

import pytest

from jaxwebrl.errors import WorkdirError
from jaxwebrl.train.versions import RECORD, VersionHistory


def resume(workdir, checkpoint_version, buffer_newest=-1, eta=2):
    return VersionHistory.resume(str(workdir), checkpoint_version=checkpoint_version, buffer_newest=buffer_newest,
                                 max_offpolicyness=eta)


def test_versions_published_after_the_checkpoint_are_never_published_again(tmp_path):
    run = resume(tmp_path, 0)
    for version in (0, 1, 2, 3):                           # checkpoint at 2, then 3 is published and the run dies
        run.publish(version)
    again = resume(tmp_path, 2)
    assert again.next_after(2) == 4 and again.lost == ((3, 3),)
    again.publish(2)                                       # the checkpoint's own weights, republished as themselves
    assert json.loads((tmp_path / RECORD).read_text()) == {"published": 3, "lost": [[3, 3]]}
    assert again.next_after(4) == 5                        # then on as usual


def test_the_buffer_s_newest_episode_counts_when_the_record_is_missing(tmp_path):
    """A workdir from before the record (or a remote worker's episode of a version the record never saw)."""
    history = resume(tmp_path, 4, buffer_newest=6)
    assert history.next_after(4) == 7 and history.lost == ((5, 6),)
    assert resume(tmp_path / "fresh", 0).lost == () and resume(tmp_path / "fresh", 0).next_after(0) == 1


def test_lost_ranges_merge_across_resumes_and_are_forgotten_once_stale(tmp_path):
    resume(tmp_path, 2, buffer_newest=4).publish(2)          # lost 3..4
    history = resume(tmp_path, 2, buffer_newest=4)           # died again before its first step
    assert history.lost == ((3, 4),)
    history.publish(5)                                       # one step on from the resume, then a checkpoint at 5...
    history.publish(6)                                       # ... and 6 lost in a third crash
    assert resume(tmp_path, 5).lost == ((3, 4), (6, 6))
    assert resume(tmp_path, 5, eta=0).lost == ((6, 6),)     # 3..4 is older than the staleness bound: stale anyway


def test_a_damaged_record_is_one_line_naming_it(tmp_path):
    (tmp_path / RECORD).write_text("{not json")
    with pytest.raises(WorkdirError, match=f"{RECORD} is unreadable .*delete it"):
        resume(tmp_path, 0)


def test_an_episode_with_a_token_of_a_lost_version_holds_it():
    history = VersionHistory(published=5, lost=((3, 4),))
    spans = ((2, 2), (3, 3), (4, 4), (5, 5), (2, 6), (5, 6))   # (oldest, newest) policy-token versions
    assert [history.holds_lost(SimpleNamespace(min_version=a, max_version=b)) for a, b in spans] == [
        False, True, True, False, True, False]
