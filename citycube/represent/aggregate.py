"""From per-seed scores to CityRep's tables (App. C.5) and its split diagnostics (App. C.1).

* city score: the mean of the primary metric over seeds;
* task score: the mean of city scores, with the cross-city standard deviation ``c_std`` using
  ddof = 1 (the sample standard deviation of CityRep's C-Std.; NaN with one city);
* mean city rank: per task and city, embeddings ranked by city score (1 = best, ties take the
  best shared rank), averaged over cities within a task, then equally over tasks;
* diagnostics: random-minus-spatial deltas of task scores, the change of mean city rank
  between the random and a spatial protocol, and how often each block was a test block.

Every table is grouped by protocol and head, so protocols and heads are never mixed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from citycube.represent.metrics import HIGHER_IS_BETTER

C_STD_DDOF = 1
GROUP = ["protocol", "head"]


def city_scores(results: pd.DataFrame) -> pd.DataFrame:
    """Seed-averaged primary score per embedding, task and city (with the seed spread)."""
    keys = [*GROUP, "task", "primary", "embedding", "city"]
    out = (
        results.groupby(keys, dropna=False)["score"]
        .agg(score="mean", seed_std="std", seeds="count")
        .reset_index()
    )
    return out


def task_table(cities: pd.DataFrame) -> pd.DataFrame:
    """Mean over cities and the cross-city standard deviation (ddof = 1)."""
    keys = [*GROUP, "task", "primary", "embedding"]
    grouped = cities.groupby(keys, dropna=False)["score"]
    out = grouped.agg(avg="mean", cities="count").reset_index()
    out["c_std"] = grouped.std(ddof=C_STD_DDOF).to_numpy()
    return out


def city_ranks(cities: pd.DataFrame) -> pd.DataFrame:
    """Rank of each embedding within (protocol, head, task, city); ties take the best rank."""
    ranked = cities.copy()
    higher = ranked["primary"].map(HIGHER_IS_BETTER).astype(bool)
    signed = np.where(higher, -ranked["score"], ranked["score"])
    ranked["signed"] = signed
    ranked["rank"] = ranked.groupby([*GROUP, "task", "city"])["signed"].rank(
        method="min", na_option="bottom"
    )
    return ranked.drop(columns="signed")


def mean_city_rank(cities: pd.DataFrame) -> pd.DataFrame:
    """Per task the mean rank over cities, then the equal-task mean (``overall`` row)."""
    ranked = city_ranks(cities)
    per_task = (
        ranked.groupby([*GROUP, "embedding", "task"])["rank"].mean().rename("mean_rank")
    ).reset_index()
    overall = per_task.groupby([*GROUP, "embedding"])["mean_rank"].mean().reset_index()
    overall["task"] = "overall"
    return pd.concat([per_task, overall], ignore_index=True)


def random_minus_spatial(tasks: pd.DataFrame, spatial: str = "block10") -> pd.DataFrame:
    """Task score under the random split minus under ``spatial`` (positive: random higher)."""
    keys = ["head", "task", "primary", "embedding"]
    rnd = tasks[tasks["protocol"] == "random"].set_index(keys)["avg"]
    spa = tasks[tasks["protocol"] == spatial].set_index(keys)["avg"]
    both = rnd.index.intersection(spa.index)
    out = (rnd.loc[both] - spa.loc[both]).rename("delta").reset_index()
    out["spatial"] = spatial
    return out


def rank_changes(ranks: pd.DataFrame, spatial: str = "block10") -> pd.DataFrame:
    """Mean city rank under random minus under ``spatial`` (negative: better rank when random)."""
    keys = ["head", "embedding", "task"]
    rnd = ranks[ranks["protocol"] == "random"].set_index(keys)["mean_rank"]
    spa = ranks[ranks["protocol"] == spatial].set_index(keys)["mean_rank"]
    both = rnd.index.intersection(spa.index)
    out = (rnd.loc[both] - spa.loc[both]).rename("rank_change").reset_index()
    out["spatial"] = spatial
    return out


def test_block_frequency(splits: pd.DataFrame) -> pd.DataFrame:
    """For each block split, city, task and block: in how many seeds it was a test block."""
    blocks = splits[splits["block"] >= 0]
    per_seed = blocks.groupby(["protocol", "city", "task", "block", "seed"])["split"].first()
    test = (
        (per_seed == "test")
        .groupby(["protocol", "city", "task", "block"])
        .agg(test_seeds="sum", seeds="count")
    )
    return test.reset_index()
