"""Imported by every dask worker the build starts, as it starts (dask's ``preload``).

The processing and sample-generation stack takes a few seconds to import; a worker that
imports it while the build is still submitting its backfill has it ready for its first task.
"""

import citycube.process
import citycube.render  # noqa: F401
import sources.sample  # noqa: F401
