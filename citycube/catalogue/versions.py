"""What a modality's results depend on, as versions: the engine's and each modality's spec.

Kept apart from the processing code so that the Dagster definitions (which need code versions)
load without importing the raster and vector stack.
"""

from __future__ import annotations

import hashlib
import json

from citycube.catalogue.modalities import Catalogue, ModalitySpec
from citycube.catalogue.products import load_products

ENGINE_VERSION = "2026.12.3"
"""Version of the processing engine. Part of every derived result's signature and of the
modality assets' code versions: bump it when a change to the engine changes results."""


def modality_digest(modality: ModalitySpec, catalogue: Catalogue) -> str:
    """Digest of everything that defines a modality's results.

    Its spec (fields, validity rules and thresholds, aggregation, chip, rendering; not its
    translation-pairing rule), the legends it refers to and the specs of the products it reads.
    Editing any of them changes the digest, and with it the modality assets' code version and
    every derived result's signature.
    """
    products = load_products()
    legends = {modality.validity.legend, modality.render.legend} - {None}
    used = [*modality.products(), *modality.auxiliary_products]
    parts = {
        # The pairing rule is the translation benchmark's, read afresh by its assets each build:
        # editing it must not recompute the cube.
        "modality": modality.model_dump(mode="json", exclude={"pairing"}),
        "legends": {
            name: {str(k): v.model_dump(mode="json") for k, v in catalogue.legends[name].items()}
            for name in sorted(n for n in legends if n is not None)
        },
        "products": {p: products[p].model_dump(mode="json") for p in used if p in products},
    }
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def modality_code_version(modality: ModalitySpec, catalogue: Catalogue) -> str:
    """Code version of a modality's derived and observation assets: engine + spec digest."""
    return f"{ENGINE_VERSION}-{modality_digest(modality, catalogue)}"


__all__ = ["ENGINE_VERSION", "modality_code_version", "modality_digest"]
