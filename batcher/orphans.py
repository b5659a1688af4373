"""Which older topic generations a batcher joins: those no live batcher holds.

Every batcher consumes the live generations (the current one, the next within its lead).
An older one is held by the batchers that were live in it, until its records are
finished and it is retired. A batcher joins an older one only when the status board
(``core/status_board.py``: an entry a batcher and generation, with a short TTL) has shown
no live batcher of the model holding it for ``ORPHANED_FOR_S``: its last member died
with records waiting, or before it deleted the topic.

Why not join every older generation whose topic exists, as batchers did at first: each
join is a rebalance of that generation's group, and a generation retires only after a
stretch with none. A batcher started again by a fault joined every one of them, and
under faults every minute or so they stopped retiring (bench/results/reliability-log.md). Why the
board and not the broker: the embedded broker still lists a member of a group that has
left it.

Pure: the live code passes ``now`` in and what the board shows.
"""

from __future__ import annotations

# How long an older generation must be seen with no live batcher before one joins it. A
# member that has just left to let the last one delete the topic, or a batcher whose
# entry is between two refreshes, must not draw a join (a joining consumer could ask the
# broker for the topic as it is deleted, and a broker that creates topics on request
# would bring it back). A dead batcher's entries outlive it by their TTL on top of this.
ORPHANED_FOR_S = 5.0


class OrphanWatch:
    """Remembers since when each older generation has had no live batcher."""

    def __init__(self, orphaned_for_s: float = ORPHANED_FOR_S) -> None:
        self._orphaned_for_s = orphaned_for_s
        self._since: dict[int, float] = {}

    def to_join(self, now: float, older: set[int], held: set[int] | None) -> set[int]:
        """The older generations to join at ``now``: of ``older`` (those whose topics
        exist and that this batcher does not run), those no live batcher has held for
        ``orphaned_for_s``. ``held`` is what the board shows live batchers holding, or
        None where it could not be read: nothing is joined on a guess."""
        if held is None:
            self._since.clear()  # the watch starts over once the board answers
            return set()
        orphaned = older - held
        self._since = {number: self._since.get(number, now) for number in orphaned}
        return {number for number, since in self._since.items() if now - since >= self._orphaned_for_s}
