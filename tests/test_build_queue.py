"""The order in which a build's runs leave Dagster's run queue."""

import dagster as dg


def test_static_epoch_and_follow_up_runs_leave_the_queue_first() -> None:
    """A queued run that fetches nothing (a city's follow-up: observations of static and
    epoch products, or records needing a conversion series) or holds no city-year asset goes
    first; a city's main run, which fetches its sources, keeps its place."""
    from types import SimpleNamespace

    from pipelines.build import FIRST_PRIORITY, _per_city_year_assets, _prioritise

    def run(run_id: str, keys: list[str], status: str = "QUEUED") -> SimpleNamespace:
        selection = {dg.AssetKey(k.split("/")) for k in keys}
        return SimpleNamespace(
            run_id=run_id, status=SimpleNamespace(value=status), tags={}, asset_selection=selection
        )

    runs = [
        run("city", ["sources/osm_roads", "derived/rd", "modalities/rd"]),
        run("epoch", ["sources/ghs_pop", "derived/pop"]),
        run("follow-up", ["modalities/pop", "modalities/dem"]),
        run("started-follow-up", ["modalities/bv"], status="STARTED"),
    ]
    tagged: dict[str, dict[str, str]] = {}
    instance = SimpleNamespace(add_run_tags=lambda run_id, tags: tagged.update({run_id: tags}))
    _prioritise(instance, runs, _per_city_year_assets())
    assert tagged == {
        "epoch": {"dagster/priority": FIRST_PRIORITY},
        "follow-up": {"dagster/priority": FIRST_PRIORITY},
    }
