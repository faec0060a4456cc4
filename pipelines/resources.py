"""The cube resource: where data lives, which release and which source backend."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from citycube.catalogue import Catalogue, load_catalogue
from citycube.cube import Release
from sources.base import SourceBackend

DEFAULT_RELEASE = "sample-0.1.0"


class CubeResource(dg.ConfigurableResource):
    """Settings shared by every asset; tests swap in a temporary data root."""

    data_root: str = "data"
    release_version: str = DEFAULT_RELEASE
    backend: str = "sample"
    seed: int = 0

    def release(self) -> Release:
        """The release being built."""
        return Release(Path(self.data_root).resolve(), self.release_version)

    def source_backend(self) -> SourceBackend:
        """The configured source backend."""
        if self.backend == "sample":
            from sources.sample import SampleBackend

            return SampleBackend(seed=self.seed)
        raise dg.DagsterInvalidConfigError(
            f"unknown source backend {self.backend!r}; this release offers: 'sample'", [], None
        )

    def catalogue(self) -> Catalogue:
        """The validated modality catalogue."""
        return load_catalogue()


def default_cube_resource() -> CubeResource:
    """Resource bound in Definitions, read from the environment at run time."""
    return CubeResource(
        data_root=dg.EnvVar("CITYCUBE_DATA"),
        release_version=dg.EnvVar("CITYCUBE_RELEASE"),
    )
