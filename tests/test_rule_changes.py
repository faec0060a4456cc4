"""A changed rule is never served from results computed under the old one, and Dagster marks
exactly the changed modality's assets (and what reads them) stale."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest
from affine import Affine

from citycube.catalogue.modalities import Catalogue, ModalitySpec, load_catalogue
from citycube.catalogue.versions import modality_code_version
from citycube.cube.release import Release
from citycube.grid.tiles import city_grid
from citycube.processing.compute import derive, write_observations
from tests.conftest import LocalFilesBackend, materialize_keys

CITY = "Amsterdam"
CAT = load_catalogue()
TILE = ("Amsterdam_2KM_r0_c0", "population_density")


def _with_threshold(modality: ModalitySpec, threshold: float) -> ModalitySpec:
    validity = modality.validity.model_copy(update={"min_valid_fraction": threshold})
    return modality.model_copy(update={"validity": validity})


def _catalogue_with(modality: ModalitySpec) -> Catalogue:
    others = tuple(modality if m.code == modality.code else m for m in CAT.modalities)
    return CAT.model_copy(update={"modalities": others})


def _pop_source(tif_writer: Callable[..., Path]) -> Path:
    """100 m densities in the city CRS; tile r0c0 has 9 of its 20 columns valid (45 %)."""
    xmin, _, _, ymax = city_grid(CITY, "2km").bounds
    data = np.full((200, 280), 500.0, np.float32)
    data[0:20, 9:20] = -200.0
    return tif_writer(
        "pop.tif",
        data,
        crs="EPSG:32631",
        transform=Affine(100, 0, xmin, 0, -100, ymax),
        nodata=-200.0,
    )


def test_lowering_min_valid_fraction_recomputes_the_derived_results(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    pop = CAT.get("POP").model_copy(update={"product": "test_pop"})
    sources = LocalFilesBackend({("test_pop", CITY, 2020): {"data": _pop_source(tif_writer)}})
    release = Release(tmp_path / "data", "same-release")

    def tile_row(modality: ModalitySpec) -> dict:
        write_observations(modality, CITY, 2020, release)
        rows = pq.read_table(release.observations_file(CITY, 2020, "POP")).to_pylist()
        return {(r["tile_id"], r["field"]): r for r in rows}[TILE]

    first = derive(pop, CAT, CITY, 2020, sources, release)
    assert not first.reused
    assert tile_row(pop)["reason"] == "insufficient_valid_support"
    assert derive(pop, CAT, CITY, 2020, sources, release).reused  # nothing changed: kept

    lowered = _with_threshold(pop, 0.4)
    again = derive(lowered, CAT, CITY, 2020, sources, release)
    assert not again.reused  # another rule: recomputed, never served from the old results
    row = tile_row(lowered)
    assert row["available"] and row["value"] == pytest.approx(500.0)
    assert derive(lowered, CAT, CITY, 2020, sources, release).reused


def test_editing_one_rule_changes_only_that_modalitys_code_versions() -> None:
    from pipelines.definitions import build_definitions

    lowered = _catalogue_with(_with_threshold(CAT.get("POP"), 0.4))
    before = build_definitions(CAT).resolve_asset_graph()
    after = build_definitions(lowered).resolve_asset_graph()
    changed = {
        key.to_user_string()
        for key in before.get_all_asset_keys()
        if before.get(key).code_version != after.get(key).code_version
    }
    assert changed == {"derived/pop", "modalities/pop"}
    assert modality_code_version(CAT.get("POP"), CAT) != modality_code_version(
        lowered.get("POP"), lowered
    )


@pytest.mark.e2e
def test_dagster_marks_exactly_the_edited_modality_and_its_readers_stale(tmp_path: Path) -> None:
    from dagster._core.definitions.data_version import StaleStatus
    from dagster._utils.test.data_versions import get_stale_status_resolver

    from pipelines.definitions import build_definitions
    from pipelines.resources import ComputeResource, CubeResource

    resources = {
        "cube": CubeResource(data_root=str(tmp_path / "data"), release_version="t"),
        "compute": ComputeResource(workers=1),
    }
    built = build_definitions(CAT, resources=resources)
    edited = build_definitions(_catalogue_with(_with_threshold(CAT.get("POP"), 0.4)))
    instance = dg.DagsterInstance.ephemeral()
    stages = [
        ["sources/ghs_pop", "sources/ghs_built_v", "derived/pop", "derived/bv"],  # city × epoch
        ["modalities/pop", "modalities/bv"],  # city × year
    ]
    for keys in stages:
        result = materialize_keys(
            built, keys, "Amsterdam|2020", resources=resources, instance=instance
        )
        assert result.success  # type: ignore[attr-defined]

    def statuses(definitions: dg.Definitions) -> dict[str, StaleStatus]:
        resolver = get_stale_status_resolver(instance, list(definitions.assets))  # type: ignore[arg-type]
        return {
            k: resolver.get_status(dg.AssetKey(k.split("/")), "Amsterdam|2020")
            for k in ("derived/pop", "modalities/pop", "derived/bv", "modalities/bv")
        }

    assert set(statuses(built).values()) == {StaleStatus.FRESH}
    assert statuses(edited) == {
        "derived/pop": StaleStatus.STALE,
        "modalities/pop": StaleStatus.STALE,
        "derived/bv": StaleStatus.FRESH,
        "modalities/bv": StaleStatus.FRESH,
    }
