"""The ``hymt`` command line (:mod:`hymt_serve.cli.main`): above :mod:`hymt_serve.ops` and
:mod:`hymt_serve.web`, which do not import it."""
