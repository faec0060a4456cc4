"""EV charging expansion: the AFDC station source per city and the case set over it.

``sources/afdc_ev_stations`` fetches, city by city, the stations of the EV cities in the cube
being built (its staged database's cities), each outcome recorded like a static product's (a
city outside the source's coverage with its reason). It is not partitioned: in a build it
joins the cube's run instead of adding runs of its own. ``benchmark/ev_cases`` reads what was
recorded — never the adapter —
and writes the cases, held-out references, counts per stratum and the direct baselines' scores
into the draft, published with the cube as DuckDB views.
"""

import dagster as dg
from pydantic import Field

from assets.common import published_path, published_table
from assets.cube import STAGED_DATABASE_KEY
from pipelines.resources import ComputeResource, CubeResource

EV_SOURCE_KEY = dg.AssetKey(["sources", "afdc_ev_stations"])
EV_CASES_KEY = dg.AssetKey(["benchmark", "ev_cases"])


class EvSourceConfig(dg.Config):
    """Which cities to fetch stations for."""

    cities: list[str] = Field(
        default_factory=list,
        description="City keys; empty: the cities of the cube being built (its staged database).",
    )


def build_cities(release: object, asked: list[str]) -> list[str]:
    """``asked``, or the cities of the cube being built (its staged database)."""
    if asked:
        return sorted(set(asked))
    from citycube.cube.release import build_connection

    with build_connection(release) as con:  # type: ignore[arg-type]
        return sorted(
            c for (c,) in con.execute("SELECT DISTINCT city FROM observations").fetchall()
        )


def build_ev_assets() -> list[dg.AssetsDefinition]:
    """The station source (per city) and the EV case set."""

    @dg.asset(
        key=EV_SOURCE_KEY,
        deps=[STAGED_DATABASE_KEY],
        group_name="sources",
        kinds={"python"},
    )
    def afdc_ev_stations(
        context: dg.AssetExecutionContext,
        config: EvSourceConfig,
        cube: CubeResource,
        compute: ComputeResource,
    ) -> dg.MaterializeResult:
        """AFDC EV charging station snapshots of each city in scope, through the source set's
        adapter (on the build's workers); per city, what was fetched or why nothing was."""
        from citycube.catalogue.modalities import Temporal
        from citycube.errors import CityCubeError
        from citycube.tasks.ev_charging import PRODUCT
        from pipelines.partition_work import fetch_source

        release = cube.release()
        adapter = cube.sources().product(PRODUCT)
        sources = cube.sources_for_tasks()
        tasks = [
            (city, (sources, PRODUCT, Temporal.STATIC, city, None, True, release))
            for city in build_cities(release, config.cities)
        ]
        outcomes = compute.run(context.log, "afdc_ev_stations", fetch_source, tasks)
        failed = [o for o in outcomes if not o.ok]
        if failed:
            error = failed[0].error
            if isinstance(error, CityCubeError):
                raise error
            raise dg.Failure(description=f"afdc_ev_stations: {failed[0].key}: {error}")
        per_city = {
            o.key: {k: v for k, v in o.result.items() if k in ("available", "reason", "files")}
            for o in outcomes
        }
        return dg.MaterializeResult(
            metadata={
                "source_id": adapter.info.source_id,
                "synthetic": adapter.info.synthetic,
                "cities": dg.MetadataValue.json(per_city),
            }
        )

    @dg.asset(
        key=EV_CASES_KEY,
        deps=[STAGED_DATABASE_KEY, EV_SOURCE_KEY],
        group_name="benchmark",
        kinds={"duckdb", "parquet"},
    )
    def ev_cases(config: EvSourceConfig, cube: CubeResource) -> dg.MaterializeResult:
        """150 EV charging cases (50 per city; 38/38/37/37 by range) where the scope allows."""
        from citycube.items.fetched import recorded_outcome
        from citycube.tasks.ev_charging import CITIES, PRODUCT, EvFiles, write_ev_cases
        from citycube.tasks.views import stage_views

        release = cube.release()
        adapter = cube.sources().product(PRODUCT)
        files: dict[str, dict[str, str]] = {}
        unavailable: dict[str, str] = {}
        scope = build_cities(release, config.cities)
        for city in CITIES:
            outcome = recorded_outcome(release.sources_dir, adapter.info, city, None, None)
            if city not in scope:
                unavailable[city] = "city outside the release's scope"
            elif outcome is None:
                unavailable[city] = "no station record: materialise sources/afdc_ev_stations"
            elif outcome.item is None:
                unavailable[city] = f"station source unavailable: {outcome.missing_reason}"
            else:
                files[city] = {role: str(p) for role, p in outcome.item.files.items()}
        case_set, scores = write_ev_cases(release, files, unavailable)
        views = stage_views(release, cube.catalogue())
        paths = EvFiles.draft(release)
        return dg.MaterializeResult(
            metadata={
                **published_table(release, paths.cases, name="cases"),
                "references": dg.MetadataValue.path(str(published_path(release, paths.references))),
                "found": dg.MetadataValue.json(case_set.found()),
                "missing": dg.MetadataValue.json(unavailable),
                "counts": dg.MetadataValue.md(case_set.counts.to_pandas().to_markdown(index=False)),
                "baseline_accuracy": dg.MetadataValue.json(
                    {
                        r["method"]: None if r["accuracy"] != r["accuracy"] else r["accuracy"]
                        for r in scores.to_pylist()
                        if r["city"] == "all"
                    }
                ),
                "views": dg.MetadataValue.json(views),
            }
        )

    return [afdc_ev_stations, ev_cases]
