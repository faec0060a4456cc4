"""The single Definitions entry point, loaded by workspace.yaml, ``dagster dev`` and the CLI."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from assets.agents import AGENT_RUNS_KEY, build_agent_assets
from assets.cube import build_cube_assets
from assets.derived import build_derived_assets
from assets.modalities import build_modality_assets
from assets.reports import build_report_assets
from assets.requests import REQUEST_KEY, city_year_request
from assets.sources import build_source_assets
from assets.tasks import (
    FORECAST_CASES_KEY,
    FORECAST_SCORES_KEY,
    INSTANCES_KEY,
    PAIRS_KEY,
    SPLITS_KEY,
    build_benchmark_assets,
    build_forecast_assets,
    build_represent_assets,
)
from assets.tasks.ev_charging import EV_CASES_KEY, build_ev_assets
from assets.tasks.food_access import FOOD_CASES_KEY, build_food_access_assets
from assets.tasks.school_capacity import SCHOOL_CASES_KEY, build_school_assets
from citycube.catalogue.modalities import Catalogue, load_catalogue
from pipelines.lifetime import follow_build_process
from pipelines.resources import ComputeResource, default_cube_resource
from pipelines.schedules import build_city_year_requests, build_yearly_build

ON_REQUEST = "represent/"
"""Key prefix of the assets that builds and the yearly backfill leave out (the representation
evaluation): they are materialised when asked for by name."""

BENCHMARK_KEYS = (
    PAIRS_KEY,
    SPLITS_KEY,
    INSTANCES_KEY,
    FORECAST_CASES_KEY,
    FORECAST_SCORES_KEY,
    FOOD_CASES_KEY,
    SCHOOL_CASES_KEY,
    EV_CASES_KEY,
)
"""The benchmark assets: computed from the staged cube and published with it."""


def build_assets(catalogue: Catalogue) -> list[dg.AssetsDefinition]:
    """Every asset of the cube for a modality catalogue."""
    return [
        *build_source_assets(catalogue),
        *build_derived_assets(catalogue),
        *build_modality_assets(catalogue),
        *build_cube_assets(catalogue, publish_after=BENCHMARK_KEYS),
        *build_benchmark_assets(catalogue),
        *build_forecast_assets(),
        *build_food_access_assets(),
        *build_school_assets(),
        *build_ev_assets(),
        *build_agent_assets(),
        *build_report_assets(catalogue, after=(*BENCHMARK_KEYS, AGENT_RUNS_KEY)),
        *build_represent_assets(),
    ]


def build_definitions(
    catalogue: Catalogue | None = None, resources: Mapping[str, Any] | None = None
) -> dg.Definitions:
    """Definitions for a catalogue (default: the packaged one) and resources.

    Steps run one after another inside a run (the in-process executor); the partitions of each
    step fan out to the compute resource (a dask cluster when there is more than one worker).
    """
    assets = build_assets(catalogue or load_catalogue())
    partitions = {key: a.partitions_def for a in assets for key in a.keys}
    built = {k: p for k, p in partitions.items() if not k.to_user_string().startswith(ON_REQUEST)}
    return dg.Definitions(
        assets=[*assets, city_year_request],
        sensors=[
            build_yearly_build(built),
            build_city_year_requests(built, REQUEST_KEY),
        ],
        resources={
            "cube": default_cube_resource(),
            "compute": ComputeResource(),
            **(resources or {}),
        },
        executor=dg.in_process_executor,
    )


defs = build_definitions()

# Loaded by the code server and by every run process a build starts: they end with its driver.
follow_build_process()
