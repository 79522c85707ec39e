"""PrefixCache: resume choice, snapshot validity against overwritten KV rows, slot eviction."""

import pytest

from lampo.engine.prefix_cache import PREFIX_CHUNK, PrefixCache, Resume


def run(cache: PrefixCache, prompt, snapshot_at=(), generated=()):
    """Drive the cache the way an engine does; returns the resume used and the saved slots."""
    r = cache.best_resume(prompt)
    cache.restore(r)
    saved = {}
    pos = r.reused
    for p in cache.snapshot_positions(prompt, r.reused, snapshot_at) + [len(prompt)]:
        cache.append(prompt[pos:p])
        pos = p
        if p in snapshot_at:
            saved[p] = cache.save()
    cache.append(generated)
    return r, saved


def test_fresh_then_continue_current():
    c = PrefixCache()
    assert c.best_resume([1, 2, 3]) == Resume("fresh", 0)
    run(c, [1, 2, 3], generated=[9])
    assert c.current == (1, 2, 3, 9)
    assert c.best_resume([1, 2, 3, 9, 4, 5]) == Resume("current", 4)
    # a prompt equal to the held state must still prefill a token, so the state is unusable
    assert c.best_resume([1, 2, 3, 9]).source == "fresh"


def test_snapshot_resume_after_divergence():
    c = PrefixCache()
    _, saved = run(c, [1, 2, 3, 4], snapshot_at=(3,), generated=[7, 8])
    assert c.snapshots() == {saved[3]: 3}
    r = c.best_resume([1, 2, 3, 5, 6])  # history re-rendered differently after position 3
    assert r == Resume("snapshot", 3, saved[3])
    c.restore(r)
    c.append([5, 6])
    assert c.current == (1, 2, 3, 5, 6)
    assert c.snapshots() == {saved[3]: 3}  # still valid: rows 0..2 untouched


def test_rewinding_drops_longer_snapshots():
    c = PrefixCache()
    run(c, [1, 2, 3, 4, 5, 6], snapshot_at=(2, 5))
    assert sorted(c.snapshots().values()) == [2, 5]
    run(c, [1, 2, 9, 9])  # resumes at 2 and rewrites position 2 onward
    assert sorted(c.snapshots().values()) == [2]
    assert c.best_resume([1, 2, 3, 4, 5, 6, 7]) == Resume("snapshot", 2, c.best_resume([1, 2, 0]).slot)


def test_continuing_keeps_snapshots_but_a_rewind_drops_them_even_for_same_tokens():
    c = PrefixCache()
    run(c, [1, 2, 3, 4, 5], snapshot_at=(2, 4))
    run(c, [1, 2, 3, 4, 5, 6])  # continues the current state: nothing is rewound
    r = c.best_resume([1, 2, 3, 4, 8])
    assert (r.source, r.reused) == ("snapshot", 4)
    run(c, [1, 2, 3, 4])  # resumes at 2 (4 is not a strict prefix), rewrites 3, 4 identically
    assert sorted(c.snapshots().values()) == [2]  # KV rows of 4 were rewritten: not trusted


def test_current_wins_ties_and_longest_wins():
    c = PrefixCache()
    run(c, [1, 2, 3], snapshot_at=(3,))
    assert c.best_resume([1, 2, 3, 4]) == Resume("current", 3)
    c.append([4, 5])
    assert c.best_resume([1, 2, 3, 4, 5, 6]).reused == 5
    assert c.best_resume([1, 2, 3, 4, 0]).source == "snapshot"


def test_snapshot_positions_skip_held_and_out_of_range():
    c = PrefixCache()
    run(c, [1, 2, 3, 4], snapshot_at=(2,))
    prompt = [1, 2, 3, 4, 5, 6]
    assert c.snapshot_positions(prompt, 4, (0, 2, 4, 6, 7)) == [4, 6]
    assert c.snapshot_positions(prompt, 0, (2, 5)) == [5]  # 2 is held for this prefix
    assert c.snapshot_positions([1, 9, 9], 0, (2,)) == [2]  # held 2 is another prefix


def test_lru_eviction_and_reuse_of_identical_slot():
    c = PrefixCache(slots=2)
    run(c, list(range(1, 11)), snapshot_at=(2, 4))
    s2, s4 = (c.best_resume(list(range(1, n + 1)) + [0]).slot for n in (2, 4))
    c.restore(Resume("snapshot", 2, s2))  # touch 2: 4 becomes least recently used
    c.append([3, 4, 5, 6])
    assert c.save() == s4
    assert sorted(c.snapshots().values()) == [2, 6]
    assert c.save() == s4  # same prefix again: same slot, no eviction
    assert sorted(c.snapshots().values()) == [2, 6]


def test_restore_rejects_stale_resume_and_reset_forgets():
    c = PrefixCache(slots=1)
    run(c, [1, 2, 3], snapshot_at=(2,))
    stale = c.best_resume([1, 2, 7])
    run(c, [5, 6])  # fresh: overwrites position 0, invalidating the snapshot
    with pytest.raises(ValueError, match="no longer holds"):
        c.restore(stale)
    c.reset()
    assert c.current == () and c.snapshots() == {}
    with pytest.raises(ValueError):
        PrefixCache(slots=0)


@pytest.mark.parametrize("differ_at", [0, PREFIX_CHUNK - 2, PREFIX_CHUNK - 1, PREFIX_CHUNK, PREFIX_CHUNK + 1,
                                       3 * PREFIX_CHUNK + 5, None])
def test_long_prompts_match_the_held_ids_to_the_first_difference(differ_at):
    """Prompts longer than the chunks the match compares at once, differing at a chunk's edges."""
    ids = list(range(3 * PREFIX_CHUNK + 100))
    c = PrefixCache(slots=4)
    for n in (PREFIX_CHUNK - 1, PREFIX_CHUNK, PREFIX_CHUNK + 1):
        c.append(ids[len(c.current):n])
        c.save()
    c.append(ids[len(c.current):])
    prompt = list(ids) + [7]
    if differ_at is not None:
        prompt[differ_at] = -1
    held = [n for n in (PREFIX_CHUNK - 1, PREFIX_CHUNK, PREFIX_CHUNK + 1) if differ_at is None or n <= differ_at]
    expected = len(ids) if differ_at is None else max(held, default=0)
    for form in (list, tuple):
        assert c.best_resume(form(prompt)).reused == expected
