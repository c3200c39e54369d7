"""Execute: run planned jobs, one process each, locally or on Ray; the worker measures (timing protocol), never
decides."""
