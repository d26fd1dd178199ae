"""The spare-promotion plan (ftcomm.membership.spares.plan): a pure function every pool member evaluates on
the same allgathered table, so its arithmetic is checked here on one process."""
import numpy as np

from ftcomm.membership.spares import plan


def table(rows):
    return np.array(rows, np.int64)


def test_spare_fills_the_failed_slot_and_survivors_keep_their_ranks():
    # pool after the shrink: world ranks 0, 1, 3 (survivors of slots 0, 1, 3), spares 4 and 5
    p = plan(table([[0, 4, 7], [1, 4, 7], [3, 4, 7], [-1, 0, -1], [-1, 0, -1]]), [0, 1, 3, 4, 5])
    assert p["size"] == p["new_size"] == 4 and p["ledger"] == 7
    assert p["active_world"] == [0, 1, 4, 3]  # the first spare in slot 2, the second stays idle
    assert p["new_rank_of_member"] == {0: 0, 1: 1, 2: 3, 3: 2}
    assert p["promoted"] == [2] and p["replaced"] == {2: 2}
    assert p["old_to_new"] == [0, 1, -1, 3] and p["unfilled"] == []


def test_lowest_holes_are_filled_first_and_the_rest_closed_as_shrink_does():
    # slots 0 and 2 failed out of 5, one spare: slot 0 is filled, slot 2 closed
    p = plan(table([[1, 5, 3], [3, 5, 3], [4, 5, 3], [-1, 0, -1]]), [1, 3, 4, 9])
    assert p["unfilled"] == [2] and p["new_size"] == 4
    assert p["active_world"] == [9, 1, 3, 4]
    assert p["old_to_new"] == [-1, 1, -1, 2, 3] and p["replaced"] == {0: 0}


def test_no_spares_is_a_shrink():
    p = plan(table([[0, 3, 1], [2, 3, 1]]), [0, 2])
    assert p["active_world"] == [0, 2] and p["old_to_new"] == [0, -1, 1] and p["promoted"] == []
