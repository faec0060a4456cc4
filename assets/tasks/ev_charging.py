"""EV charging expansion: the AFDC station source per city and the case set over it.

``sources/afdc_ev_stations`` is partitioned by city like the static products: a build fetches
it for the cities in its scope (a city outside the source's coverage is recorded as such, with
its reason). ``benchmark/ev_cases`` reads what those partitions recorded — never the adapter —
and writes the cases, held-out references, counts per stratum and the direct baselines' scores
into the draft, published with the cube as DuckDB views.
"""

import dagster as dg

from assets.common import published_path, published_table
from assets.cube import STAGED_DATABASE_KEY
from pipelines.partitions import city_partitions
from pipelines.resources import CubeResource

EV_SOURCE_KEY = dg.AssetKey(["sources", "afdc_ev_stations"])
EV_CASES_KEY = dg.AssetKey(["benchmark", "ev_cases"])


def build_ev_assets() -> list[dg.AssetsDefinition]:
    """The station source (per city) and the EV case set."""

    @dg.asset(
        key=EV_SOURCE_KEY,
        partitions_def=city_partitions,
        group_name="sources",
        kinds={"python"},
    )
    def afdc_ev_stations(context: dg.AssetExecutionContext, cube: CubeResource) -> dg.Output[None]:
        """AFDC EV charging station snapshots of one city, through the source set's adapter."""
        from citycube.catalogue.modalities import Temporal
        from citycube.items.fetched import fetch_and_record
        from citycube.tasks.ev_charging import PRODUCT

        city = context.partition_key
        release = cube.release()
        adapter = cube.sources().product(PRODUCT)
        outcome = fetch_and_record(adapter, Temporal.STATIC, city, None, release.sources_dir)
        meta: dict[str, object] = {
            "source_id": adapter.info.source_id,
            "synthetic": adapter.info.synthetic,
            "available": outcome.item is not None,
        }
        if outcome.item is None:
            meta["reason"] = outcome.missing_reason or "unavailable"
        else:
            meta["files"] = dg.MetadataValue.json(
                {role: str(path) for role, path in outcome.item.files.items()}
            )
            meta["snapshots"] = outcome.item.extra.get("snapshots", "")
        return dg.Output(None, metadata=meta)

    @dg.asset(
        key=EV_CASES_KEY,
        deps=[STAGED_DATABASE_KEY, EV_SOURCE_KEY],
        group_name="benchmark",
        kinds={"duckdb", "parquet"},
    )
    def ev_cases(cube: CubeResource) -> dg.MaterializeResult:
        """150 EV charging cases (50 per city; 38/38/37/37 by range) where the scope allows."""
        from citycube.items.fetched import recorded_outcome
        from citycube.tasks.ev_charging import CITIES, PRODUCT, EvFiles, write_ev_cases
        from citycube.tasks.views import stage_views

        release = cube.release()
        adapter = cube.sources().product(PRODUCT)
        files: dict[str, dict[str, str]] = {}
        unavailable: dict[str, str] = {}
        for city in CITIES:
            outcome = recorded_outcome(release.sources_dir, adapter.info, city, None, None)
            if outcome is None:
                unavailable[city] = (
                    "city outside the release's scope (no station source fetched for it)"
                )
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
