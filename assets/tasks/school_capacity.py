"""School capacity planning cases of the agentic track (AgenticCity-Bench App. D.1).

One unpartitioned asset over the staged cube, like the forecasting cases: when the cube being
published holds London, it fetches the school reference (the Department for Education's School
capacity CSVs and the GIAS extract from the URLs configured, else the synthetic sample twin),
selects the cases and publishes them with the release as DuckDB views. Any other scope gets an
empty case set whose manifest says why.
"""

from pathlib import Path

import dagster as dg
import pyarrow as pa
from pydantic import Field

from assets.common import published_path, published_table
from assets.cube import STAGED_DATABASE_KEY, TILES_KEY
from pipelines.resources import CubeResource

SCHOOL_CASES_KEY = dg.AssetKey(["benchmark", "school_cases"])
GROUP = "benchmark"


class SchoolCasesConfig(dg.Config):
    """Where the school reference is served; empty: the sample twin (synthetic)."""

    capacity_urls: list[str] = Field(
        default_factory=list,
        description="School-level CSVs of the DfE School capacity releases (2021/22-2024/25).",
    )
    gias_url: str = Field(default="", description="The GIAS all-establishments CSV.")
    seed: int = Field(default=20_240, description="Seed of the pool and selection hashes.")


def build_school_assets() -> list[dg.AssetsDefinition]:
    """The school capacity cases, their references and the direct baselines' scores."""

    @dg.asset(
        key=SCHOOL_CASES_KEY,
        deps=[STAGED_DATABASE_KEY, TILES_KEY],
        group_name=GROUP,
        kinds={"duckdb", "parquet"},
    )
    def school_cases(config: SchoolCasesConfig, cube: CubeResource) -> dg.MaterializeResult:
        """100 London school cases (50 balanced, 50 shortage; 60 primary, 40 secondary), the
        held-out target-year enrollment, eligibility counts and the baselines' scores."""
        import duckdb

        from citycube.tasks.school_capacity import CITY, select_cases
        from citycube.tasks.school_capacity import write_school_cases as write
        from citycube.tasks.views import stage_views

        release = cube.release()
        with duckdb.connect(str(release.staged_duckdb_file), read_only=True) as con:
            cities = [c for (c,) in con.execute(
                "SELECT DISTINCT city FROM observations ORDER BY city"
            ).fetchall()]  # fmt: skip
        provenance: dict[str, object] = {}
        if CITY not in cities:
            reason = (
                f"{CITY} is not in the cube's scope ({', '.join(cities) or 'no city'}): the "
                "School capacity releases and Get Information about Schools cover England, "
                "so the cases need a build with London (e.g. make run CITIES=London)"
            )
            found = select_cases(None, unavailable=reason)
        else:
            records, provenance = _school_records(config, release.sources_dir)
            found = select_cases(records, seed=config.seed)
        files = write(release, found, provenance)
        views = stage_views(release, cube.catalogue())
        return dg.MaterializeResult(
            metadata={
                **published_table(release, files.cases, name="cases"),
                "manifest": dg.MetadataValue.path(str(published_path(release, files.manifest))),
                "requested": dg.MetadataValue.json(found.requested),
                "achieved": dg.MetadataValue.json(found.achieved),
                "complete": found.complete,
                "note": found.note,
                "views": dg.MetadataValue.json(views),
            }
        )

    return [school_cases]


def _school_records(config: SchoolCasesConfig, root: Path) -> tuple[pa.Table, dict[str, object]]:
    """The joined records and where they came from (the real source, or the sample twin)."""
    from citycube.tasks.school_capacity import CITY
    from sources.dfe_schools import SchoolSourceOptions, fetch_school_item, item_records

    if config.capacity_urls and config.gias_url:
        options = SchoolSourceOptions(
            capacity_urls=tuple(config.capacity_urls), gias_url=config.gias_url
        )
        item = fetch_school_item(options, CITY, root)
        provenance = {"source_id": "dfe_schools", "synthetic": False, **item.extra}
    else:
        from sources.sample.school_capacity import sample_school_item

        item = sample_school_item(CITY, root)
        provenance = {"source_id": "sample:dfe_school_capacity", "synthetic": True}
    return item_records(item, CITY), provenance
