"""Reference embeddings that need no download, so the harness runs on any release.

* ``sinusoidal``: a multi-scale sine/cosine encoding of the tile centre (a position-encoding
  baseline, as CityRep's PE row), queried like any coordinate encoder.
* ``cube``: the release's own numeric observations of the same year, one column per modality
  field, without the task's modality (a model must not see its target).
* ``random``: Gaussian noise per tile, seeded: the floor every embedding should beat.
"""

from __future__ import annotations

import duckdb
import numpy as np

from citycube.represent.embeddings import CoordinateEncoder, TileEmbedding, TileUnits

BUILTIN = ("sinusoidal", "cube", "random")

SINUSOIDAL_SCALES = 16
"""Number of wavelengths, spaced geometrically between the two below."""
SINUSOIDAL_MIN_DEG = 0.02
"""Shortest wavelength, degrees (about one 2 km tile)."""
SINUSOIDAL_MAX_DEG = 2.0
"""Longest wavelength, degrees (wider than any city's grid)."""

RANDOM_DIM = 64
CUBE_MIN_COVERAGE = 0.5
"""A modality field becomes a ``cube`` feature when at least this share of the city's tiles
has it; a tile missing one of the chosen fields has no feature (see the missing-row policy)."""


def sinusoidal_encode(lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """sin and cos of longitude and latitude at each wavelength: (n, 4 × scales)."""
    wavelengths = np.geomspace(SINUSOIDAL_MIN_DEG, SINUSOIDAL_MAX_DEG, SINUSOIDAL_SCALES)
    omega = 2 * np.pi / wavelengths
    parts = []
    for coord in (np.asarray(lon, float), np.asarray(lat, float)):
        phase = coord[:, None] * omega[None, :]
        parts += [np.sin(phase), np.cos(phase)]
    return np.concatenate(parts, axis=1)


def sinusoidal() -> CoordinateEncoder:
    return CoordinateEncoder("sinusoidal", sinusoidal_encode)


def random_features(units: TileUnits, seed: int = 0, dim: int = RANDOM_DIM) -> TileEmbedding:
    """Seeded Gaussian features for every tile of the units (same seed, same features)."""
    rng = np.random.default_rng([seed, len(units), units.tile_size])
    return TileEmbedding("random", units.tile_ids, rng.standard_normal((len(units), dim)))


def cube_features(
    con: duckdb.DuckDBPyConnection,
    units: TileUnits,
    year: int,
    exclude_modality: str,
) -> TileEmbedding:
    """The release's numeric observations of ``year`` as features, minus one modality.

    Categorical fields (dominant classes) are not numbers and are left out. A tile whose value
    is unavailable gets NaN for that column, never a zero.
    """
    rows = con.execute(
        """
        SELECT o.modality || '.' || o.field AS name, o.tile_id, o.value
        FROM observations o JOIN modalities m ON m.modality = o.modality AND m.field = o.field
        WHERE o.city = ? AND o.scale = ? AND o.year = ? AND o.modality <> ?
          AND m.kind <> 'categorical_image'
        """,
        [units.city, units.scale, year, exclude_modality],
    ).fetchall()
    index = {str(t): i for i, t in enumerate(units.tile_ids)}
    names = sorted({r[0] for r in rows})
    col = {n: j for j, n in enumerate(names)}
    values = np.full((len(units), len(names)), np.nan)
    for name, tile, value in rows:
        i = index.get(tile)
        if i is not None and value is not None:
            values[i, col[name]] = value
    keep = np.isfinite(values).mean(axis=0) >= CUBE_MIN_COVERAGE if names else np.zeros(0, bool)
    return TileEmbedding("cube", units.tile_ids, values[:, keep])
