"""Imported by every dask worker the build starts, as it starts (dask's ``preload``).

The processing and sample-generation stack takes a few seconds to import; a worker that
imports it while the build is still submitting its backfill has it ready for its first task.
"""

import citycube.processing.compute
import citycube.reports.render  # noqa: F401
import sources.sample  # noqa: F401
from pipelines.lifetime import follow_build_process

follow_build_process()  # a worker of a killed build stops instead of finishing its task
