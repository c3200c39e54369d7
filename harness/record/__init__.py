"""Record: the results database (models, migrations, every read and write), the spool for an unreachable database,
bundles."""
