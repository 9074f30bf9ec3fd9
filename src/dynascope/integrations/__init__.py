"""Integrations with other training frameworks and loggers (optional extras, imported lazily).

Each lives in its own module so that importing :mod:`dynascope` never imports the framework:

- :mod:`dynascope.integrations.huggingface`: ``MonitorCallback`` for ``transformers.Trainer``
  (extra ``hf``);
- :mod:`dynascope.integrations.lightning`: ``MonitorCallback`` for Lightning (extra
  ``lightning``);
- :mod:`dynascope.integrations.tensorboard`: ``TensorBoardSink``, a sink for
  :class:`dynascope.Monitor` beside (or instead of) :class:`dynascope.RunStore` (extra
  ``tensorboard``).

The callbacks only call ``monitor.step``: what is measured and where it goes is the
:class:`~dynascope.Monitor`'s business.
"""
