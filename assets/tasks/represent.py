"""The representation evaluation of the built-in embeddings on the published cube.

A thin wrapper over ``citycube.represent``: it reads the published ``cube.duckdb`` and writes a
run folder under ``<data>/evaluations/<release>/represent/`` (outside the release, so its
manifest stays valid). It is materialised on request (``citycube build --assets represent`` or
the Dagster UI), not by every build: the protocol trains thousands of small heads.
"""

import dagster as dg
from pydantic import Field

from assets.cube import DATABASE_KEY
from pipelines.resources import CubeResource

REPRESENT_KEY = dg.AssetKey(["represent", "builtin_scores"])
GROUP = "represent"


class RepresentConfig(dg.Config):
    """What the run evaluates; empty lists take the protocol's defaults."""

    cities: list[str] = Field(default=[], description="City keys (default: all in the release).")
    tasks: list[str] = Field(default=[], description="Task codes (default: all).")
    protocols: list[str] = Field(
        default=["block10", "random"], description="block10, block20, parent, random."
    )
    seeds: list[int] = Field(default=[42, 24, 7, 0, 100], description="Split seeds.")
    heads: list[str] = Field(default=["mlp"], description="mlp and/or linear.")
    scale: str = Field(default="2km", description="Task units: 2km or 5km tiles.")


def build_represent_assets() -> list[dg.AssetsDefinition]:
    """The built-in embeddings' scores under spatial and random splits."""

    @dg.asset(key=REPRESENT_KEY, deps=[DATABASE_KEY], group_name=GROUP, kinds={"duckdb", "csv"})
    def builtin_scores(config: RepresentConfig, cube: CubeResource) -> dg.MaterializeResult:
        """Sinusoidal, cube and random embeddings on the release's tasks (CityRep protocol)."""
        import duckdb

        from citycube.errors import ReleaseNotFoundError
        from citycube.represent.run import RunConfig, evaluate, release_cities, summary

        release = cube.release()
        if not release.duckdb_file.exists():
            raise ReleaseNotFoundError(f"no published cube.duckdb in {release.root}")
        folder = release.data_root / "evaluations" / release.version / "represent" / "builtin"
        with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
            run = RunConfig(
                cities=tuple(config.cities) or release_cities(con),
                tasks=tuple(config.tasks) or RunConfig.tasks,
                protocols=tuple(config.protocols),
                seeds=tuple(config.seeds),
                heads=tuple(config.heads),
                scale=config.scale,
            )
            result = evaluate(con, release.root, run, folder)
        return dg.MaterializeResult(
            metadata={
                "folder": dg.MetadataValue.path(str(result.folder)),
                "fits": len(result.results),
                "seconds": round(result.seconds, 1),
                "skipped": len(result.skipped),
                "summary": dg.MetadataValue.md(f"```\n{summary(result)}\n```"),
            }
        )

    return [builtin_scores]
