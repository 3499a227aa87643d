"""The collectors' effect on the server, from runs with different collector settings interleaved
on one server (``infra/tools/device/headline.py``, phase ``effect``).

Each run gives one mean per figure (vLLM's own histograms: mean = delta _sum / delta _count over
the run). A setting's effect is its mean over its runs minus that of the runs without collectors;
the run-to-run noise is the pooled standard deviation of runs *within* a setting (so a drift of
the server between runs counts as noise, not as an effect), and the difference is within noise
when it is under two standard errors. A one-way ANOVA (scipy) asks whether any setting differs::

    python -m infra.tools.device.collector_effect docs/results/h200/data/effect-arms/runs.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd
from scipy import stats

FIGURES = ("server_ttft_mean_ms", "server_tpot_mean_ms", "server_e2e_mean_ms",
           "client_ttft_mean_ms", "req_per_s")
BASELINE = "off"


def effect_table(runs: pd.DataFrame, figures: tuple[str, ...] = FIGURES,
                 baseline: str = BASELINE) -> pd.DataFrame:
    """One row per (figure, setting other than ``baseline``): runs, mean, change against the
    baseline (absolute and %), the run-to-run noise (pooled within-setting SD of one run), the
    change's standard error, t, the verdict and the ANOVA p of the figure."""
    rows = []
    for figure in figures:
        data = runs[["arm", figure]].dropna()
        groups = data.groupby("arm", sort=False)[figure]
        dof = len(data) - groups.ngroups
        if baseline not in groups.groups or dof < 1:
            continue
        squares = float(((data[figure] - groups.transform("mean")) ** 2).sum())
        noise = math.sqrt(squares / dof)
        anova_p = float(stats.f_oneway(*[g.to_numpy() for _, g in groups]).pvalue)
        base = groups.get_group(baseline)
        for arm, values in groups:
            if arm == baseline:
                continue
            change = float(values.mean() - base.mean())
            se = noise * math.sqrt(1 / len(values) + 1 / len(base))
            t = change / se if se > 0 else math.inf * (1 if change > 0 else -1)
            rows.append({
                "figure": figure, "setting": arm, "runs": len(values),
                "baseline_runs": len(base), "mean": float(values.mean()),
                "baseline_mean": float(base.mean()), "change": change,
                "change_pct": 100 * change / float(base.mean()), "noise_sd": noise,
                "noise_pct": 100 * noise / float(base.mean()), "se": se, "t": t,
                "verdict": ("within noise" if abs(t) < 2 else
                            "costs the server" if (change > 0) != (figure == "req_per_s")
                            else "better"),
                "anova_p": anova_p,
            })
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m infra.tools.device.collector_effect RUNS.json", file=sys.stderr)
        return 2
    runs = pd.DataFrame(json.loads(Path(args[0]).read_text()))
    table = effect_table(runs)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
