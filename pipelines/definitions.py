"""The single Definitions entry point, loaded by workspace.yaml and ``dagster dev``."""

from __future__ import annotations

import dagster as dg

from assets.cube import cube_assets
from assets.modalities import modality_assets
from assets.reports import report_assets
from assets.sources import source_assets
from pipelines.resources import default_cube_resource
from pipelines.schedules import city_year_job, yearly_backfill

all_assets = [*source_assets, *modality_assets, *cube_assets, *report_assets]

defs = dg.Definitions(
    assets=all_assets,
    jobs=[city_year_job],
    schedules=[yearly_backfill],
    resources={"cube": default_cube_resource()},
)
