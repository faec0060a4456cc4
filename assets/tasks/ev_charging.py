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
from pipelines.resources import CubeResource

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
    def afdc_ev_stations(config: EvSourceConfig, cube: CubeResource) -> dg.MaterializeResult:
        """AFDC EV charging station snapshots of each EV city in scope, through the source
        set's adapter; per city, what was fetched or why nothing was."""
        from citycube.catalogue.modalities import Temporal
        from citycube.items.fetched import fetch_and_record
        from citycube.tasks.ev_charging import PRODUCT

        release = cube.release()
        adapter = cube.sources().product(PRODUCT)
        per_city: dict[str, object] = {}
        for city in build_cities(release, config.cities):
            outcome = fetch_and_record(adapter, Temporal.STATIC, city, None, release.sources_dir)
            if outcome.item is None:
                per_city[city] = {"available": False, "reason": outcome.missing_reason}
            else:
                per_city[city] = {
                    "available": True,
                    "snapshots": outcome.item.extra.get("snapshots", ""),
                    "files": {r: str(p) for r, p in outcome.item.files.items()},
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
