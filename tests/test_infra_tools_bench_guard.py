"""The hot path's guard (issue 25): one worker's CPU per request against a bare client's, in
turn on the same lean target (infra/tools/bench/guard.py). A change that makes the worker's path
per request markedly dearer (the last round's was a third) fails here, where it lands.

The floor: when the guard landed, this machine measured the code of that change at medians of
0.77-0.94 and the older trees at 0.52-0.62 per round, and 0.66 lay between. On 2026-12-01 evening
(the machine quiet, `swarmload bench guard --rounds 5 --code ec33911=... --code pre=...
--code new=.`, docs/results/hotpath/) the same rounds spread far wider: the landed code 0.59-0.84
per round (medians 0.61-0.75), 39a023d 0.62-0.76, and ec33911 itself 0.47-0.74 (medians
0.58-0.65). A clean-clone CI run measured 0.62 and 0.67 and failed at 0.66. Lowered to 0.50,
said here: a third more CPU per request than today's median (0.68 / 1.35) still fails, a
regression as small as ec33911's no longer reliably does: the noise of these machines now
reaches that far.

Raised to 0.75 on 2026-12-05 (tenth session), said here: the pacer's own connects and the
counted runs of answer events took one worker flat out from 356-433 to 240-273 CPU us a
request here (docs/results/hotpath/, tenth session). This test, alone on the quiet machine, three
times in a row: medians 1.124, 1.125, 1.355; the bench's medians for this code 0.976 (one round
disturbed) to 1.094, and for the session's start (bd15753) 0.725-0.748, which now fails. 0.75 is
a third below this code's usual median and a quarter below its lowest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.tools.bench.guard import format_guard, measure

RATIO_FLOOR = 0.75


@pytest.mark.slow
# alone: beside phase A's other tests a clean-clone CI run measured 0.62 and 0.67 (median 0.647),
# the worker 640 ms behind its schedule; alone on the quiet machine that code measured 0.82
@pytest.mark.alone
def test_one_worker_keeps_its_share_of_a_bare_clients_speed(tmp_path: Path) -> None:
    result = measure(rounds=2, workdir=tmp_path)
    report = format_guard(result)
    print(report)
    for turn in result["turns"]:
        if turn["who"] != "reference":  # every request answered and recorded
            assert turn["ok"] == turn["records"] > 0, report
    assert result["ratio"]["this"] >= RATIO_FLOOR, report
