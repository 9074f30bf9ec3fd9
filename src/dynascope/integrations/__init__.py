"""Integrations with other training frameworks and loggers (optional extras, imported lazily).

Each lives in its own module so that importing :mod:`dynascope` never imports the framework:

- :mod:`dynascope.integrations.huggingface`: ``MonitorCallback`` for ``transformers.Trainer``
  (extra ``hf``);
- :mod:`dynascope.integrations.lightning`: ``MonitorCallback`` for Lightning (extra
  ``lightning``);
- :mod:`dynascope.integrations.tensorboard`: ``TensorBoardSink``, a sink for
  :class:`dynascope.Monitor` beside (or instead of) :class:`dynascope.RunStore` (extra
  ``tensorboard``);
- :mod:`dynascope.integrations.mlflow`: ``MLflowSink``, a local ``sqlite:`` MLflow store by
  default (extra ``mlflow``);
- :mod:`dynascope.integrations.wandb`: ``WandbSink``, offline by default (extra ``wandb``).
- :mod:`dynascope.integrations.log_to`: ``RunLogger``, what ``--log-to`` uses: stored runs and a
  study's verdict forwarded to those three sinks once each run has ended.

The sinks name metrics with :func:`dynascope.keys.metric_path` (``attn/L0/H3/...``). The
callbacks call ``monitor.step``, record the trainer's own loss, learning rate and run status
in the monitor's sinks, and forward the probe values to the trainer's own loggers; what is
measured is the :class:`~dynascope.Monitor`'s business.
"""
